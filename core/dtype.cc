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
constexpr uint16_t kHalfImplicitBit = 0x0400u;

// bf16 quiet bit (the fp32 quiet bit, shifted down by 16).
constexpr uint16_t kBFloat16QuietBit = 0x0040u;

// fp32 magnitudes (as bits) at the edges of fp16's range.
constexpr uint32_t kHalfOverflowBits = 0x477ff000u;   // 65520 = 65504 + ulp / 2
constexpr uint32_t kHalfMinNormalBits = 0x38800000u;  // 2^-14
constexpr uint32_t kHalfMinSubnormalHalfBits = 0x33000000u;  // 2^-25

// Exponent biases and the mantissa bits fp16 drops.
constexpr int kFloatExponentBias = 127;
constexpr int kHalfExponentBias = 15;
constexpr int kMantissaShift = 23 - 10;

// `value >> shift` rounded to nearest, ties to even. Requires 1 <= shift <= 31.
uint32_t ShiftRightRoundingToEven(uint32_t value, int shift) {
  const uint32_t kept = value >> shift;
  const uint32_t dropped = value & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  const bool round_up = dropped > half || (dropped == half && (kept & 1) != 0);
  return kept + (round_up ? 1 : 0);
}

// The bf16 bits nearest to the fp32 `bits`, ties to even (a NaN stays a quiet
// NaN). Branch-free, so that loops over it vectorize: the integer rounding
// cannot overflow for non-NaN values, whose largest pattern is -infinity.
inline uint16_t BFloat16FromFloatBits(uint32_t bits) {
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (bits >> 16) | kBFloat16QuietBit;
  return static_cast<uint16_t>((bits & ~kFloatSign) > kFloatInf ? quiet_nan
                                                                : rounded);
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
  const uint32_t bits = FloatBits(value);
  const uint16_t sign = static_cast<uint16_t>((bits & kFloatSign) >> 16);
  const uint32_t magnitude = bits & ~kFloatSign;

  if (magnitude > kFloatInf) {  // NaN: keep the top of the payload, set quiet.
    return sign | kHalfInf | kHalfQuietBit |
           static_cast<uint16_t>((magnitude >> kMantissaShift) &
                                 kHalfMantissaMask);
  }
  if (magnitude >= kHalfOverflowBits) return sign | kHalfInf;
  if (magnitude >= kHalfMinNormalBits) {
    // Rebias the exponent in place and drop the extra mantissa bits. A rounding
    // carry out of the mantissa correctly steps to the next binade; below the
    // overflow threshold the result is at most 0x7bff (65504).
    const uint32_t rebiased =
        magnitude -
        (static_cast<uint32_t>(kFloatExponentBias - kHalfExponentBias) << 23);
    return sign | static_cast<uint16_t>(
                      ShiftRightRoundingToEven(rebiased, kMantissaShift));
  }
  // fp16 subnormal range (multiples of 2^-24), including every fp32 subnormal.
  // At or below 2^-25 the nearest value is zero (2^-25 itself ties to even
  // zero).
  if (magnitude <= kHalfMinSubnormalHalfBits) return sign;
  // Here the fp32 exponent is in [102, 112], so the value is normal in fp32:
  // value = significand * 2^(exponent - 150) = (significand >> (126 -
  // exponent)) * 2^-24. Rounding up from the largest subnormal yields 0x0400,
  // the smallest normal.
  const int exponent = static_cast<int>(magnitude >> 23);
  const uint32_t significand = (magnitude & 0x007fffffu) | 0x00800000u;
  return sign | static_cast<uint16_t>(
                    ShiftRightRoundingToEven(significand, 126 - exponent));
}

float HalfToFloat(uint16_t half) {
  const uint32_t sign = static_cast<uint32_t>(half & kHalfSign) << 16;
  const uint32_t exponent = (half & kHalfInf) >> 10;
  uint32_t mantissa = half & kHalfMantissaMask;

  if (exponent == 0x1f) {
    if (mantissa == 0) return FloatFromBits(sign | kFloatInf);
    return FloatFromBits(sign | kFloatInf | kFloatQuietBit |
                         (mantissa << kMantissaShift));
  }
  if (exponent != 0) {
    return FloatFromBits(
        sign | ((exponent + kFloatExponentBias - kHalfExponentBias) << 23) |
        (mantissa << kMantissaShift));
  }
  if (mantissa == 0) return FloatFromBits(sign);
  // Subnormal mantissa * 2^-24: shift the leading one up to the implicit bit
  // position, lowering the exponent (which starts at that of 2^-14) as we go.
  uint32_t float_exponent = kFloatExponentBias - kHalfExponentBias + 1;
  while ((mantissa & kHalfImplicitBit) == 0) {
    mantissa <<= 1;
    --float_exponent;
  }
  return FloatFromBits(sign | (float_exponent << 23) |
                       ((mantissa & kHalfMantissaMask) << kMantissaShift));
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
// loader picks one (bench/dtype_convert, 16M values on the 2-core build VM:
// fp32 to bf16 in 12 ms instead of 40 in scalar code, back in 9 instead of 14).
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
      for (int64_t i = 0; i < count; ++i) dst[i] = HalfToFloat(halves[i]);
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
      for (int64_t i = 0; i < count; ++i) halves[i] = FloatToHalf(src[i]);
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
