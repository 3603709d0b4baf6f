#ifndef RINGATTN_KERNELS_CUDA_MMA_UTIL_CUH_
#define RINGATTN_KERNELS_CUDA_MMA_UTIL_CUH_

// Device helpers shared by our attention kernels (flash_attention.cu,
// decode_attention.cu): bf16/fp16 tensor-core products (mma.sync m16n8k16),
// ldmatrix loads, cp.async copies and a fast exp2. sm_80 and newer.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace ringattn {
namespace device {

// The element types' tensor-core product and packing.
template <typename T>
struct Element;

template <>
struct Element<__nv_bfloat16> {
  // c += a * b for one m16n8k16 tile.
  static __device__ __forceinline__ void Mma(float c[4], const uint32_t a[4],
                                             uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  // Two values in one register, `low` in the low half.
  static __device__ __forceinline__ uint32_t Pack(float low, float high) {
    __nv_bfloat162 pair = __floats2bfloat162_rn(low, high);
    return *reinterpret_cast<uint32_t*>(&pair);
  }
  static __device__ __forceinline__ __nv_bfloat16 From(float x) {
    return __float2bfloat16_rn(x);
  }
};

template <>
struct Element<__half> {
  static __device__ __forceinline__ void Mma(float c[4], const uint32_t a[4],
                                             uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ uint32_t Pack(float low, float high) {
    __half2 pair = __floats2half2_rn(low, high);
    return *reinterpret_cast<uint32_t*>(&pair);
  }
  static __device__ __forceinline__ __half From(float x) {
    return __float2half_rn(x);
  }
};

// 2^x by the special-function unit (relative error below 2^-22; -inf -> 0).
__device__ __forceinline__ float Exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ uint32_t SharedAddress(const void* pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

// Copies 16 bytes global -> shared without the registers; only `bytes` (0 or
// 16) are read and the rest is zero-filled.
__device__ __forceinline__ void CopyAsync16(void* shared, const void* global,
                                            int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(
                   SharedAddress(shared)),
               "l"(global), "r"(bytes));
}

__device__ __forceinline__ void CommitCopies() {
  asm volatile("cp.async.commit_group;\n" ::);
}

// Waits until at most `kPending` committed copy groups are still in flight.
template <int kPending>
__device__ __forceinline__ void WaitCopies() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// Four 8x8 b16 matrices from shared memory; lanes 8i..8i+7 address the rows
// of matrix i.
__device__ __forceinline__ void LoadMatrices(uint32_t r[4], const void* row) {
  asm volatile(
      "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
      : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
      : "r"(SharedAddress(row)));
}

// The same, each matrix transposed.
__device__ __forceinline__ void LoadMatricesTransposed(uint32_t r[4],
                                                       const void* row) {
  asm volatile(
      "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, "
      "[%4];\n"
      : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
      : "r"(SharedAddress(row)));
}

}  // namespace device
}  // namespace ringattn

#endif  // RINGATTN_KERNELS_CUDA_MMA_UTIL_CUH_
