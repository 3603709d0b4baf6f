#include <cstdint>

#include "kernels/cuda/convert.h"

namespace ringattn {
namespace {

// The bit layouts, as in core/dtype.cc.
constexpr uint32_t kFloatSign = 0x80000000u;
constexpr uint32_t kFloatInf = 0x7f800000u;
constexpr uint32_t kFloatQuietBit = 0x00400000u;
constexpr uint32_t kHalfSign = 0x8000u;
constexpr uint32_t kHalfInf = 0x7c00u;
constexpr uint32_t kHalfQuietBit = 0x0200u;
constexpr uint32_t kHalfMantissaMask = 0x03ffu;
constexpr uint32_t kBFloat16QuietBit = 0x0040u;
constexpr uint32_t kHalfOverflowBits = 0x477ff000u;          // 65520
constexpr uint32_t kHalfMinNormalBits = 0x38800000u;         // 2^-14
constexpr uint32_t kHalfMinSubnormalHalfBits = 0x33000000u;  // 2^-25
constexpr uint32_t kExponentRebias = (127u - 15u) << 23;
constexpr int kMantissaShift = 23 - 10;

// `value >> shift` rounded to nearest, ties to even; 1 <= shift <= 31.
__device__ __forceinline__ uint32_t ShiftRightRoundingToEven(uint32_t value,
                                                             int shift) {
  const uint32_t kept = value >> shift;
  const uint32_t dropped = value & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  const bool round_up = dropped > half || (dropped == half && (kept & 1u));
  return kept + (round_up ? 1u : 0u);
}

__device__ __forceinline__ uint16_t FloatToHalfBits(float value) {
  const uint32_t bits = __float_as_uint(value);
  const uint32_t sign = (bits & kFloatSign) >> 16;
  const uint32_t magnitude = bits & ~kFloatSign;
  uint32_t half;
  if (magnitude > kFloatInf) {
    half = kHalfInf | kHalfQuietBit |
           ((magnitude >> kMantissaShift) & kHalfMantissaMask);
  } else if (magnitude >= kHalfOverflowBits) {
    half = kHalfInf;
  } else if (magnitude >= kHalfMinNormalBits) {
    half =
        ShiftRightRoundingToEven(magnitude - kExponentRebias, kMantissaShift);
  } else if (magnitude <= kHalfMinSubnormalHalfBits) {
    half = 0;
  } else {
    const int exponent = static_cast<int>(magnitude >> 23);
    const uint32_t significand = (magnitude & 0x007fffffu) | 0x00800000u;
    half = ShiftRightRoundingToEven(significand, 126 - exponent);
  }
  return static_cast<uint16_t>(sign | half);
}

__device__ __forceinline__ float HalfBitsToFloat(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & kHalfSign) << 16;
  const uint32_t exponent = (bits & kHalfInf) >> 10;
  const uint32_t mantissa = bits & kHalfMantissaMask;
  if (exponent == 0x1f) {
    return __uint_as_float(
        sign | kFloatInf |
        (mantissa == 0 ? 0u : kFloatQuietBit | (mantissa << kMantissaShift)));
  }
  if (exponent != 0) {
    return __uint_as_float(sign | ((exponent + 112u) << 23) |
                           (mantissa << kMantissaShift));
  }
  if (mantissa == 0) return __uint_as_float(sign);
  // Subnormal: mantissa * 2^-24. Move the leading one to the implicit bit.
  const int shift = __clz(mantissa) - 21;  // 1..10
  return __uint_as_float(
      sign | ((113u - shift) << 23) |
      (((mantissa << shift) & kHalfMantissaMask) << kMantissaShift));
}

__device__ __forceinline__ uint16_t FloatToBFloat16Bits(float value) {
  const uint32_t bits = __float_as_uint(value);
  if ((bits & ~kFloatSign) > kFloatInf) {
    return static_cast<uint16_t>((bits >> 16) | kBFloat16QuietBit);
  }
  return static_cast<uint16_t>(ShiftRightRoundingToEven(bits, 16));
}

__device__ __forceinline__ float BFloat16BitsToFloat(uint16_t bfloat16) {
  uint32_t bits = static_cast<uint32_t>(bfloat16) << 16;
  if ((bits & ~kFloatSign) > kFloatInf) bits |= kFloatQuietBit;
  return __uint_as_float(bits);
}

template <bool kHalf>
__global__ void FromFloatKernel(const float* src, uint16_t* dst,
                                int64_t count) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < count; i += step) {
    dst[i] = kHalf ? FloatToHalfBits(src[i]) : FloatToBFloat16Bits(src[i]);
  }
}

template <bool kHalf>
__global__ void ToFloatKernel(const uint16_t* src, float* dst, int64_t count) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < count; i += step) {
    dst[i] = kHalf ? HalfBitsToFloat(src[i]) : BFloat16BitsToFloat(src[i]);
  }
}

constexpr int kThreads = 256;

unsigned Blocks(int64_t count) {
  constexpr int64_t kMaxBlocks = 8192;
  const int64_t blocks = (count + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

}  // namespace

cudaError_t LaunchConvertFromFloat(DeviceDType dtype, const float* src,
                                   void* dst, int64_t count,
                                   cudaStream_t stream) {
  if (count < 0) return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  uint16_t* out = static_cast<uint16_t*>(dst);
  if (dtype == DeviceDType::kFloat16) {
    FromFloatKernel<true>
        <<<Blocks(count), kThreads, 0, stream>>>(src, out, count);
  } else {
    FromFloatKernel<false>
        <<<Blocks(count), kThreads, 0, stream>>>(src, out, count);
  }
  return cudaGetLastError();
}

cudaError_t LaunchConvertToFloat(DeviceDType dtype, const void* src, float* dst,
                                 int64_t count, cudaStream_t stream) {
  if (count < 0) return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  const uint16_t* in = static_cast<const uint16_t*>(src);
  if (dtype == DeviceDType::kFloat16) {
    ToFloatKernel<true><<<Blocks(count), kThreads, 0, stream>>>(in, dst, count);
  } else {
    ToFloatKernel<false>
        <<<Blocks(count), kThreads, 0, stream>>>(in, dst, count);
  }
  return cudaGetLastError();
}

}  // namespace ringattn
