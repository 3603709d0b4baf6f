#include <cmath>

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
  float keep_weight = 0.0f;
  float add_weight = 1.0f;
  float merged = add;
  if (acc != -INFINITY) {
    const float max = fmaxf(acc, add);
    const float keep = __expf(acc - max);
    const float more = __expf(add - max);
    keep_weight = keep / (keep + more);
    add_weight = more / (keep + more);
    merged = max + __logf(keep + more);
  }
  float* out = o + row * dim;
  const float* part = part_o + row * dim;
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
    out[d] = out[d] * keep_weight + part[d] * add_weight;
  }
  __syncthreads();
  if (threadIdx.x == 0) lse[row] = merged;
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
