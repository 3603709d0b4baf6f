#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/lse_fold.cuh"
#include "kernels/cuda/partial_merge.h"

namespace ringattn {
namespace {

constexpr int kWarp = 32;
constexpr int kRowsPerBlock = 8;  // one warp per row
constexpr int64_t kMaxBatch = 65535;

template <bool kHalf>
__device__ __forceinline__ float Widen(uint16_t bits) {
  if (kHalf) return __half2float(__ushort_as_half(bits));
  return __uint_as_float(static_cast<uint32_t>(bits) << 16);
}

__global__ void FillKernel(float* data, int64_t count, float value) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < count; i += step) {
    data[i] = value;
  }
}

__global__ void ScaleKernel(float* data, int64_t count, float factor) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < count; i += step) {
    data[i] *= factor;
  }
}

// Enough blocks of kThreads for `count` values, at most kMaxBlocks (the
// kernels above stride over the rest).
constexpr int kThreads = 256;
unsigned GridFor(int64_t count) {
  constexpr int64_t kMaxBlocks = 4096;
  const int64_t blocks = (count + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

// Block (kWarp, kRowsPerBlock): warp y of block x merges partial row
// x * kRowsPerBlock + y (position row / heads, head row % heads) of batch
// blockIdx.y. kPairs (even `dim` and float2-aligned accumulator rows) moves two
// values per lane and load.
template <bool kHalf, bool kPairs>
__global__ void MergePartialKernel(const uint16_t* part_o,
                                   const float* part_lse, int64_t seq,
                                   int64_t heads, int64_t dim,
                                   AccumulatorRows into) {
  const int64_t row =
      static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.y;
  if (row >= seq * heads) return;
  const int64_t t = row / heads;
  const int64_t h = row - t * heads;
  const int64_t part_row = blockIdx.y * seq * heads + row;
  const float add = part_lse[part_row];
  float* const acc_lse = into.lse + blockIdx.y * into.lse_batch_stride +
                         t * into.lse_seq_stride + h;
  float* out = into.o + blockIdx.y * into.o_batch_stride +
               t * into.o_seq_stride + h * dim;
  if (add == -INFINITY) {
    if (!into.fresh) return;  // an empty partial row changes nothing
    for (int64_t d = threadIdx.x; d < dim; d += kWarp) out[d] = 0.0f;
    if (threadIdx.x == 0) *acc_lse = -INFINITY;
    return;
  }
  // Fresh rows hold no result: nothing of them is read.
  const device::LseFold fold = into.fresh ? device::LseFold{0.0f, 1.0f, add}
                                          : device::FoldLse(*acc_lse, add);
  const float keep_weight = fold.keep_weight;
  const float add_weight = fold.add_weight;
  const uint16_t* part = part_o + part_row * dim;
  if (kPairs) {
    float2* out2 = reinterpret_cast<float2*>(out);
    const uint32_t* part2 = reinterpret_cast<const uint32_t*>(part);
    for (int64_t d = threadIdx.x; d < dim / 2; d += kWarp) {
      const uint32_t bits = part2[d];
      float2 value = into.fresh ? make_float2(0.0f, 0.0f) : out2[d];
      value.x =
          value.x * keep_weight +
          Widen<kHalf>(static_cast<uint16_t>(bits & 0xffffu)) * add_weight;
      value.y = value.y * keep_weight +
                Widen<kHalf>(static_cast<uint16_t>(bits >> 16)) * add_weight;
      out2[d] = value;
    }
  } else {
    for (int64_t d = threadIdx.x; d < dim; d += kWarp) {
      const float kept = into.fresh ? 0.0f : out[d];
      out[d] = kept * keep_weight + Widen<kHalf>(part[d]) * add_weight;
    }
  }
  // Every lane has read the accumulated LSE above; only then may it change.
  __syncwarp();
  if (threadIdx.x == 0) *acc_lse = fold.merged;
}

template <bool kHalf>
void LaunchMerge(const uint16_t* part_o, const float* part_lse, int64_t batch,
                 int64_t seq, int64_t heads, int64_t dim,
                 const AccumulatorRows& into, cudaStream_t stream) {
  const dim3 block(kWarp, kRowsPerBlock);
  const dim3 grid(
      static_cast<unsigned>((seq * heads + kRowsPerBlock - 1) / kRowsPerBlock),
      static_cast<unsigned>(batch));
  // Rows start float2-aligned when dim, both strides and the base are even.
  const bool pairs = dim % 2 == 0 && into.o_batch_stride % 2 == 0 &&
                     into.o_seq_stride % 2 == 0 &&
                     reinterpret_cast<uintptr_t>(into.o) % sizeof(float2) == 0;
  if (pairs) {
    MergePartialKernel<kHalf, true>
        <<<grid, block, 0, stream>>>(part_o, part_lse, seq, heads, dim, into);
  } else {
    MergePartialKernel<kHalf, false>
        <<<grid, block, 0, stream>>>(part_o, part_lse, seq, heads, dim, into);
  }
}

}  // namespace

cudaError_t LaunchClearAccumulators(float* o, int64_t o_count, float* lse,
                                    int64_t lse_count, cudaStream_t stream) {
  if (o_count < 0 || lse_count < 0) return cudaErrorInvalidValue;
  if (o_count > 0) {
    const cudaError_t error =
        cudaMemsetAsync(o, 0, sizeof(float) * o_count, stream);
    if (error != cudaSuccess) return error;
  }
  if (lse_count == 0) return cudaSuccess;
  FillKernel<<<GridFor(lse_count), kThreads, 0, stream>>>(lse, lse_count,
                                                          -INFINITY);
  return cudaGetLastError();
}

cudaError_t LaunchMergePartialStrided(DeviceDType dtype, const void* part_o,
                                      const float* part_lse, int64_t batch,
                                      int64_t seq, int64_t heads, int64_t dim,
                                      const AccumulatorRows& into,
                                      cudaStream_t stream) {
  if (batch < 0 || seq < 0 || heads <= 0 || dim <= 0 || batch > kMaxBatch ||
      into.o_seq_stride < heads * dim || into.lse_seq_stride < heads ||
      into.o_batch_stride < 0 || into.lse_batch_stride < 0) {
    return cudaErrorInvalidValue;
  }
  if (batch == 0 || seq == 0) return cudaSuccess;
  const uint16_t* part = static_cast<const uint16_t*>(part_o);
  if (dtype == DeviceDType::kFloat16) {
    LaunchMerge<true>(part, part_lse, batch, seq, heads, dim, into, stream);
  } else {
    LaunchMerge<false>(part, part_lse, batch, seq, heads, dim, into, stream);
  }
  return cudaGetLastError();
}

cudaError_t LaunchMergePartial(DeviceDType dtype, const void* part_o,
                               const float* part_lse, int64_t batch,
                               int64_t rows, int64_t dim, float* o, float* lse,
                               int64_t o_batch_rows, cudaStream_t stream) {
  if (rows > o_batch_rows) return cudaErrorInvalidValue;
  AccumulatorRows into;
  into.o = o;
  into.o_batch_stride = o_batch_rows * dim;
  into.o_seq_stride = dim;
  into.lse = lse;
  into.lse_batch_stride = o_batch_rows;
  into.lse_seq_stride = 1;
  return LaunchMergePartialStrided(dtype, part_o, part_lse, batch, rows,
                                   /*heads=*/1, dim, into, stream);
}

cudaError_t LaunchScaleAccumulator(float* data, int64_t count, float factor,
                                   cudaStream_t stream) {
  if (count < 0) return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  ScaleKernel<<<GridFor(count), kThreads, 0, stream>>>(data, count, factor);
  return cudaGetLastError();
}

}  // namespace ringattn
