#ifndef RINGATTN_KERNELS_CUDA_MERGE_WITH_LSE_H_
#define RINGATTN_KERNELS_CUDA_MERGE_WITH_LSE_H_

// The GPU form of MergeWithLse: folds a partial attention result into an
// accumulated one in fp32, row by row, on a stream. Same semantics as
// kernels/cpu/merge_with_lse.h, including rows whose LSE is -inf.

#include <cuda_runtime.h>

#include <cstdint>

namespace ringattn {

// o, part_o: `rows` x `dim` contiguous fp32 on the device; lse, part_lse:
// `rows` fp32. Enqueues the merge on `stream` and returns the launch status.
cudaError_t LaunchMergeWithLse(float* o, float* lse, const float* part_o,
                               const float* part_lse, int64_t rows, int64_t dim,
                               cudaStream_t stream);

}  // namespace ringattn

#endif  // RINGATTN_KERNELS_CUDA_MERGE_WITH_LSE_H_
