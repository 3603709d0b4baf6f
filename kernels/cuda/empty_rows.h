#ifndef RINGATTN_KERNELS_CUDA_EMPTY_ROWS_H_
#define RINGATTN_KERNELS_CUDA_EMPTY_ROWS_H_

// Writes the result of query rows that see no key (O = 0, LSE = -inf) for the
// paths that do not compute such rows themselves (cuDNN refuses causal blocks
// with more queries than keys). Stateless and thread-safe.

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/attention_args.h"

namespace ringattn {

// For query rows [0, rows) of every batch of `args`: sets each element of
// args.o to zero and, if args.lse is non-null, each LSE entry to -inf.
// Requires 0 <= rows <= args.q_len. Returns the launch status.
cudaError_t LaunchMarkRowsEmpty(const DeviceAttentionArgs& args, int64_t rows,
                                cudaStream_t stream);

}  // namespace ringattn

#endif  // RINGATTN_KERNELS_CUDA_EMPTY_ROWS_H_
