#ifndef RINGATTN_CORE_DTYPE_H_
#define RINGATTN_CORE_DTYPE_H_

// The element types tensors may take on the wire, and exact conversions between
// them and fp32. Narrowing rounds to nearest, ties to even, exactly as IEEE 754
// hardware does; the conversions are pure bit manipulation, so results do not
// depend on the host CPU. All functions are thread-safe.

#include <cstdint>

namespace ringattn {

enum class DType { kFloat32, kFloat16, kBFloat16 };

// Bytes per element of `dtype`.
int64_t DTypeSize(DType dtype);

// A short lowercase name: "fp32", "fp16" or "bf16".
const char* DTypeName(DType dtype);

// IEEE binary16 bits of the fp16 value nearest to `value`, ties to even.
// Magnitudes of 65520 and above become infinity; NaN stays a quiet NaN with the
// same sign.
uint16_t FloatToHalf(float value);

// The fp32 value of the fp16 bits `half` (always exact). A NaN comes back quiet
// with the same sign.
float HalfToFloat(uint16_t half);

// bfloat16 bits (the top half of an fp32) of the bf16 value nearest to `value`,
// ties to even. Values beyond the largest finite bf16 by half an ulp or more
// become infinity; NaN stays a quiet NaN with the same sign.
uint16_t FloatToBFloat16(float value);

// The fp32 value of the bf16 bits `bfloat16` (always exact). A NaN comes back
// quiet with the same sign.
float BFloat16ToFloat(uint16_t bfloat16);

// Widens `count` elements of type `dtype` at `src` into `dst`. For fp32 this is
// a copy. Requires count >= 0 and non-overlapping buffers of the right sizes.
void ConvertToFloat(DType dtype, const void* src, float* dst, int64_t count);

// Narrows `count` fp32 values at `src` into elements of type `dtype` at `dst`,
// rounding as the scalar conversions do. For fp32 this is a copy. Requires
// count >= 0 and non-overlapping buffers of the right sizes.
void ConvertFromFloat(DType dtype, const float* src, void* dst, int64_t count);

// Converts `count` elements of type `from` at `src` into elements of type `to`
// at `dst`, through fp32 (exact widening, rounding narrowing): a copy when the
// types agree. Same requirements as the functions above.
void ConvertDType(DType from, const void* src, DType to, void* dst,
                  int64_t count);

}  // namespace ringattn

#endif  // RINGATTN_CORE_DTYPE_H_
