#include <cmath>

#include "kernels/cuda/lse_fold.cuh"
#include "kernels/cuda/merge_with_lse.h"

namespace ringattn {
namespace {

// One block per row; threads stride over the row's dim values.
__global__ void MergeWithLseKernel(float* o, float* lse, const float* part_o,
                                   const float* part_lse, int64_t dim) {
  const int64_t row = blockIdx.x;
  const float acc = lse[row];
  const float add = part_lse[row];
  if (add == -INFINITY) return;
  const device::LseFold fold = device::FoldLse(acc, add);
  float* out = o + row * dim;
  const float* part = part_o + row * dim;
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
    out[d] = out[d] * fold.keep_weight + part[d] * fold.add_weight;
  }
  __syncthreads();
  if (threadIdx.x == 0) lse[row] = fold.merged;
}

}  // namespace

cudaError_t LaunchMergeWithLse(float* o, float* lse, const float* part_o,
                               const float* part_lse, int64_t rows, int64_t dim,
                               cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  const int threads = dim >= 128 ? 128 : 64;
  MergeWithLseKernel<<<static_cast<unsigned>(rows), threads, 0, stream>>>(
      o, lse, part_o, part_lse, dim);
  return cudaGetLastError();
}

}  // namespace ringattn
