#include "core/dtype.h"

#include <algorithm>
#include <cstring>

namespace ringattn {
namespace {

uint32_t FloatBits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

float FloatFromBits(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

// fp32 layout.
constexpr uint32_t kFloatSign = 0x80000000u;
constexpr uint32_t kFloatInf = 0x7f800000u;
constexpr uint32_t kFloatQuietBit = 0x00400000u;

// fp16 layout.
constexpr uint16_t kHalfSign = 0x8000u;
constexpr uint16_t kHalfInf = 0x7c00u;
constexpr uint16_t kHalfQuietBit = 0x0200u;
constexpr uint16_t kHalfMantissaMask = 0x03ffu;

// bf16 quiet bit (the fp32 quiet bit, shifted down by 16).
constexpr uint16_t kBFloat16QuietBit = 0x0040u;

// fp32 magnitudes (as bits) at the edges of fp16's range.
constexpr uint32_t kHalfOverflowBits = 0x477ff000u;   // 65520 = 65504 + ulp / 2
constexpr uint32_t kHalfMinNormalBits = 0x38800000u;  // 2^-14

// Exponent biases and the mantissa bits fp16 drops.
constexpr int kFloatExponentBias = 127;
constexpr int kHalfExponentBias = 15;
constexpr int kMantissaShift = 23 - 10;

// The bf16 bits nearest to the fp32 `bits`, ties to even (a NaN stays a quiet
// NaN). Branch-free, so that loops over it vectorize: the integer rounding
// cannot overflow for non-NaN values, whose largest pattern is -infinity.
inline uint16_t BFloat16FromFloatBits(uint32_t bits) {
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (bits >> 16) | kBFloat16QuietBit;
  return static_cast<uint16_t>((bits & ~kFloatSign) > kFloatInf ? quiet_nan
                                                                : rounded);
}

// The fp16 bits nearest to the fp32 `bits`, ties to even (a NaN stays a quiet
// NaN with the top of its payload). Branch-free (every case computed, one
// selected), so that loops over it vectorize.
inline uint16_t HalfFromFloatBits(uint32_t bits) {
  const uint32_t sign = (bits & kFloatSign) >> 16;
  const uint32_t magnitude = bits & ~kFloatSign;
  // Normal range: rebias the exponent in place and round the dropped mantissa
  // bits to even. A rounding carry out of the mantissa correctly steps to the
  // next binade; below the overflow threshold the result is at most 0x7bff
  // (65504).
  const uint32_t rebiased =
      magnitude -
      (static_cast<uint32_t>(kFloatExponentBias - kHalfExponentBias) << 23);
  const uint32_t normal =
      (rebiased + 0xfffu + ((rebiased >> kMantissaShift) & 1u)) >>
      kMantissaShift;
  // Subnormal range (multiples of 2^-24, every fp32 subnormal included): in
  // 0.5 + |value| one unit in the last place is 2^-24, so the FPU's rounding
  // to nearest even leaves the fp16 mantissa in the low bits. At or below
  // 2^-25 that is zero; rounding up from the largest subnormal yields 0x0400,
  // the smallest normal.
  const uint32_t subnormal =
      FloatBits(FloatFromBits(magnitude) + 0.5f) - FloatBits(0.5f);
  // NaN: keep the top of the payload, set quiet.
  const uint32_t nan = kHalfInf | kHalfQuietBit |
                       ((magnitude >> kMantissaShift) & kHalfMantissaMask);
  uint32_t half = magnitude >= kHalfMinNormalBits ? normal : subnormal;
  half = magnitude >= kHalfOverflowBits ? kHalfInf : half;
  half = magnitude > kFloatInf ? nan : half;
  return static_cast<uint16_t>(sign | half);
}

// The fp32 bits of the fp16 `half`, exactly (a NaN comes back quiet with its
// payload). Branch-free, so that loops over it vectorize.
inline uint32_t FloatBitsFromHalf(uint16_t half) {
  const uint32_t sign = static_cast<uint32_t>(half & kHalfSign) << 16;
  const uint32_t exponent = (half & kHalfInf) >> 10;
  const uint32_t mantissa = half & kHalfMantissaMask;
  const uint32_t normal =
      ((exponent + kFloatExponentBias - kHalfExponentBias) << 23) |
      (mantissa << kMantissaShift);
  // Zero and subnormals: mantissa * 2^-24, exact in fp32.
  const uint32_t subnormal = FloatBits(static_cast<float>(mantissa) * 0x1p-24f);
  const uint32_t special = kFloatInf | (mantissa << kMantissaShift) |
                           (mantissa != 0 ? kFloatQuietBit : 0u);
  const uint32_t magnitude =
      exponent == 0 ? subnormal : (exponent == 0x1f ? special : normal);
  return sign | magnitude;
}

// The fp32 bits of the bf16 `bfloat16` (a NaN comes back quiet).
inline uint32_t FloatBitsFromBFloat16(uint16_t bfloat16) {
  const uint32_t bits = static_cast<uint32_t>(bfloat16) << 16;
  return (bits & ~kFloatSign) > kFloatInf ? bits | kFloatQuietBit : bits;
}

}  // namespace

int64_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return 4;
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
  }
  return 0;
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "fp32";
    case DType::kFloat16:
      return "fp16";
    case DType::kBFloat16:
      return "bf16";
  }
  return "unknown";
}

uint16_t FloatToHalf(float value) {
  return HalfFromFloatBits(FloatBits(value));
}

float HalfToFloat(uint16_t half) {
  return FloatFromBits(FloatBitsFromHalf(half));
}

// bf16 is fp32 with the low 16 bits dropped, so rounding the bit pattern as
// an integer rounds the value; a carry out of the mantissa bumps the exponent
// (up to infinity) just as it should, and fp32 subnormals round like any other
// value. A NaN keeps its sign and the top of its payload.
uint16_t FloatToBFloat16(float value) {
  return BFloat16FromFloatBits(FloatBits(value));
}

float BFloat16ToFloat(uint16_t bfloat16) {
  return FloatFromBits(FloatBitsFromBFloat16(bfloat16));
}

// The conversion loops are compiled for AVX2 and for any x86-64, and the
// loader picks one (bench/dtype_convert, 16M values on the 2-core build VM,
// against scalar code: fp32 to bf16 in 12 ms instead of 40, back in 9 instead
// of 14; to fp16 in 53 instead of 106, back in 12 instead of 28).
#if defined(__x86_64__) && defined(__GNUC__)
#define RINGATTN_AVX2_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define RINGATTN_AVX2_CLONES
#endif

RINGATTN_AVX2_CLONES
void ConvertToFloat(DType dtype, const void* src, float* dst, int64_t count) {
  if (count <= 0) return;
  switch (dtype) {
    case DType::kFloat32:
      std::memcpy(dst, src, static_cast<size_t>(count) * sizeof(float));
      return;
    case DType::kFloat16: {
      const uint16_t* halves = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < count; ++i) {
        dst[i] = FloatFromBits(FloatBitsFromHalf(halves[i]));
      }
      return;
    }
    case DType::kBFloat16: {
      const uint16_t* bfloat16s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < count; ++i) {
        dst[i] = FloatFromBits(FloatBitsFromBFloat16(bfloat16s[i]));
      }
      return;
    }
  }
}

RINGATTN_AVX2_CLONES
void ConvertFromFloat(DType dtype, const float* src, void* dst, int64_t count) {
  if (count <= 0) return;
  switch (dtype) {
    case DType::kFloat32:
      std::memcpy(dst, src, static_cast<size_t>(count) * sizeof(float));
      return;
    case DType::kFloat16: {
      uint16_t* halves = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < count; ++i) {
        halves[i] = HalfFromFloatBits(FloatBits(src[i]));
      }
      return;
    }
    case DType::kBFloat16: {
      uint16_t* bfloat16s = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < count; ++i) {
        bfloat16s[i] = BFloat16FromFloatBits(FloatBits(src[i]));
      }
      return;
    }
  }
}

void ConvertDType(DType from, const void* src, DType to, void* dst,
                  int64_t count) {
  if (count <= 0) return;
  if (from == to) {
    std::memcpy(dst, src, static_cast<size_t>(count * DTypeSize(from)));
    return;
  }
  if (from == DType::kFloat32) {
    ConvertFromFloat(to, static_cast<const float*>(src), dst, count);
    return;
  }
  if (to == DType::kFloat32) {
    ConvertToFloat(from, src, static_cast<float*>(dst), count);
    return;
  }
  constexpr int64_t kBatch = 1024;
  float widened[kBatch];
  for (int64_t at = 0; at < count; at += kBatch) {
    const int64_t n = std::min(kBatch, count - at);
    ConvertToFloat(from, static_cast<const char*>(src) + at * DTypeSize(from),
                   widened, n);
    ConvertFromFloat(to, widened, static_cast<char*>(dst) + at * DTypeSize(to),
                     n);
  }
}

}  // namespace ringattn
