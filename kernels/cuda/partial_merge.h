#ifndef RINGATTN_KERNELS_CUDA_PARTIAL_MERGE_H_
#define RINGATTN_KERNELS_CUDA_PARTIAL_MERGE_H_

// Accumulating attention over many key blocks on the GPU: fp32 accumulators
// (O and LSE) start as the empty result (O = 0, LSE = -inf), and each block's
// partial result, as the attention paths write it (16-bit O, fp32 LSE), is
// folded in by log-sum-exp, with the semantics of kernels/cpu/merge_with_lse.h
// (a partial row with LSE = -inf changes nothing). The accumulator rows may be
// strided (every r-th position of a segment, one head of many: dilated
// attention). Stateless and thread-safe.

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/attention_args.h"

namespace ringattn {

// Sets `o_count` fp32 values at `o` to 0 and `lse_count` at `lse` to -inf, on
// `stream`. Returns the first failing call's status.
cudaError_t LaunchClearAccumulators(float* o, int64_t o_count, float* lse,
                                    int64_t lse_count, cudaStream_t stream);

// Folds a partial result into strided accumulators, on `stream` (stores it
// where into.fresh, without reading them).
//   part_o:   [batch, seq, heads, dim] contiguous, in `dtype`
//   part_lse: [batch, seq, heads] contiguous fp32
// Requires distinct accumulator rows for distinct partial rows (seq strides
// of at least heads * dim and heads), batch <= 65535 and no overlap with the
// partial. Returns the launch status (cudaErrorInvalidValue for bad sizes or
// strides).
cudaError_t LaunchMergePartialStrided(DeviceDType dtype, const void* part_o,
                                      const float* part_lse, int64_t batch,
                                      int64_t seq, int64_t heads, int64_t dim,
                                      const AccumulatorRows& into,
                                      cudaStream_t stream);

// Folds a partial result into accumulators, on `stream`. A "row" is one
// (query position, head) pair of `dim` values.
//   part_o:   [batch, rows, dim] contiguous, in `dtype`
//   part_lse: [batch, rows] contiguous fp32
//   o, lse:   the accumulators of the same rows, fp32; row r of batch b is at
//             o + (b * o_batch_rows + r) * dim and lse + b * o_batch_rows + r.
// Requires rows <= o_batch_rows, batch <= 65535 and non-overlapping buffers.
// Returns the launch status (cudaErrorInvalidValue for bad sizes). The
// contiguous case of LaunchMergePartialStrided.
cudaError_t LaunchMergePartial(DeviceDType dtype, const void* part_o,
                               const float* part_lse, int64_t batch,
                               int64_t rows, int64_t dim, float* o, float* lse,
                               int64_t o_batch_rows, cudaStream_t stream);

// Multiplies `count` fp32 values at `data` by `factor`, on `stream` (the 1/G
// of dilated attention's HEAD_GROUPS combine). Returns the launch status.
cudaError_t LaunchScaleAccumulator(float* data, int64_t count, float factor,
                                   cudaStream_t stream);

}  // namespace ringattn

#endif  // RINGATTN_KERNELS_CUDA_PARTIAL_MERGE_H_
