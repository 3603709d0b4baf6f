#ifndef RINGATTN_KERNELS_CUDA_MMA_UTIL_CUH_
#define RINGATTN_KERNELS_CUDA_MMA_UTIL_CUH_

// Device helpers shared by our attention kernels (flash_attention.cu,
// decode_attention.cu): bf16/fp16 tensor-core products (mma.sync m16n8k16),
// ldmatrix loads, cp.async copies, a fast exp2 and the online softmax step
// on mma.sync fragments. sm_80 and newer.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
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

// One key tile's step of the online softmax, on S = Q K^T held in mma.sync
// accumulator fragments (m-tile m, key n-tile j; this thread's rows r = 0, 1
// in elements 2r and 2r + 1, the quad of four threads holding the row's
// columns): the new running max of the scores times `scale_log2`, the rescale
// of what came before (row_sum and the O fragments, d-tiles t), and
// P = 2^(S scale_log2 - max) in place of S, its row sum added.
template <int kMTiles, int kKeyTiles, int kDimTiles>
__device__ __forceinline__ void OnlineSoftmaxStep(
    float (&s)[kMTiles][kKeyTiles][4], float (&row_max)[kMTiles][2],
    float (&row_sum)[kMTiles][2], float (&o_acc)[kMTiles][kDimTiles][4],
    float scale_log2) {
#pragma unroll
  for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float tile_max = -INFINITY;
#pragma unroll
      for (int j = 0; j < kKeyTiles; ++j) {
        tile_max = fmaxf(tile_max, fmaxf(s[m][j][2 * r], s[m][j][2 * r + 1]));
      }
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
      const float new_max = fmaxf(row_max[m][r], tile_max * scale_log2);
      // A row that has seen only hidden keys keeps max -inf; subtracting 0
      // then leaves every exp2 at 0 instead of NaN.
      const float offset = new_max == -INFINITY ? 0.0f : new_max;
      const float rescale = Exp2(row_max[m][r] - offset);
      row_max[m][r] = new_max;
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < kKeyTiles; ++j) {
#pragma unroll
        for (int c = 2 * r; c < 2 * r + 2; ++c) {
          s[m][j][c] = Exp2(fmaf(s[m][j][c], scale_log2, -offset));
          sum += s[m][j][c];
        }
      }
      row_sum[m][r] = row_sum[m][r] * rescale + sum;
#pragma unroll
      for (int t = 0; t < kDimTiles; ++t) {
        o_acc[m][t][2 * r] *= rescale;
        o_acc[m][t][2 * r + 1] *= rescale;
      }
    }
  }
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
