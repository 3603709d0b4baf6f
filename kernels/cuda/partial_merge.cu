#include <cuda_fp16.h>

#include <cmath>

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

// Block (kWarp, kRowsPerBlock): warp y of block x merges row
// x * kRowsPerBlock + y of batch blockIdx.y. Even `dim` moves two values per
// lane and load.
template <bool kHalf, bool kPairs>
__global__ void MergePartialKernel(const uint16_t* part_o,
                                   const float* part_lse, int64_t rows,
                                   int64_t dim, float* o, float* lse,
                                   int64_t o_batch_rows) {
  const int64_t row =
      static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.y;
  if (row >= rows) return;
  const int64_t part_row = blockIdx.y * rows + row;
  const int64_t acc_row = blockIdx.y * o_batch_rows + row;
  const float add = part_lse[part_row];
  if (add == -INFINITY) return;
  const float acc = lse[acc_row];
  float keep_weight = 0.0f;
  float add_weight = 1.0f;
  float merged = add;
  if (acc != -INFINITY) {
    const float max = fmaxf(acc, add);
    const float keep = expf(acc - max);
    const float more = expf(add - max);
    const float sum = keep + more;
    keep_weight = keep / sum;
    add_weight = more / sum;
    merged = max + logf(sum);
  }
  float* out = o + acc_row * dim;
  const uint16_t* part = part_o + part_row * dim;
  if (kPairs) {
    float2* out2 = reinterpret_cast<float2*>(out);
    const uint32_t* part2 = reinterpret_cast<const uint32_t*>(part);
    for (int64_t d = threadIdx.x; d < dim / 2; d += kWarp) {
      const uint32_t bits = part2[d];
      float2 value = out2[d];
      value.x =
          value.x * keep_weight +
          Widen<kHalf>(static_cast<uint16_t>(bits & 0xffffu)) * add_weight;
      value.y = value.y * keep_weight +
                Widen<kHalf>(static_cast<uint16_t>(bits >> 16)) * add_weight;
      out2[d] = value;
    }
  } else {
    for (int64_t d = threadIdx.x; d < dim; d += kWarp) {
      out[d] = out[d] * keep_weight + Widen<kHalf>(part[d]) * add_weight;
    }
  }
  // Every lane has read lse[acc_row] above; only then may it change.
  __syncwarp();
  if (threadIdx.x == 0) lse[acc_row] = merged;
}

template <bool kHalf>
void LaunchMerge(const uint16_t* part_o, const float* part_lse, int64_t batch,
                 int64_t rows, int64_t dim, float* o, float* lse,
                 int64_t o_batch_rows, cudaStream_t stream) {
  const dim3 block(kWarp, kRowsPerBlock);
  const dim3 grid(
      static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock),
      static_cast<unsigned>(batch));
  if (dim % 2 == 0) {
    MergePartialKernel<kHalf, true><<<grid, block, 0, stream>>>(
        part_o, part_lse, rows, dim, o, lse, o_batch_rows);
  } else {
    MergePartialKernel<kHalf, false><<<grid, block, 0, stream>>>(
        part_o, part_lse, rows, dim, o, lse, o_batch_rows);
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
  constexpr int kThreads = 256;
  constexpr int64_t kMaxBlocks = 4096;
  const int64_t blocks = (lse_count + kThreads - 1) / kThreads;
  FillKernel<<<static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks),
               kThreads, 0, stream>>>(lse, lse_count, -INFINITY);
  return cudaGetLastError();
}

cudaError_t LaunchMergePartial(DeviceDType dtype, const void* part_o,
                               const float* part_lse, int64_t batch,
                               int64_t rows, int64_t dim, float* o, float* lse,
                               int64_t o_batch_rows, cudaStream_t stream) {
  if (batch < 0 || rows < 0 || dim <= 0 || rows > o_batch_rows ||
      batch > kMaxBatch) {
    return cudaErrorInvalidValue;
  }
  if (batch == 0 || rows == 0) return cudaSuccess;
  const uint16_t* part = static_cast<const uint16_t*>(part_o);
  if (dtype == DeviceDType::kFloat16) {
    LaunchMerge<true>(part, part_lse, batch, rows, dim, o, lse, o_batch_rows,
                      stream);
  } else {
    LaunchMerge<false>(part, part_lse, batch, rows, dim, o, lse, o_batch_rows,
                       stream);
  }
  return cudaGetLastError();
}

}  // namespace ringattn
