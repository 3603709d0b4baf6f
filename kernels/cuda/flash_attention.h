#ifndef RINGATTN_KERNELS_CUDA_FLASH_ATTENTION_H_
#define RINGATTN_KERNELS_CUDA_FLASH_ATTENTION_H_

// Our own attention forward kernel: the path that takes every shape cuDNN
// refuses. FlashAttention-2 style: bf16/fp16 tensor-core products (mma.sync,
// sm_80 and newer) with fp32 accumulation and an online softmax in base 2; any
// head_dim up to 256 (compiled for head dims 64, 128 and 256, smaller ones
// padded with zeros); any strides (16-byte aligned rows take the fast copy
// path, others an element-wise one). Stateless and thread-safe.

#include <cuda_runtime.h>

#include "kernels/cuda/attention_args.h"

namespace ringattn {

// Enqueues attention of `args` on `stream`: writes args.o and, if non-null,
// args.lse. Returns cudaErrorInvalidValue for args that
// FindAttentionArgsProblem rejects, with batch * q_heads above 65535 or a
// length above 2^30; otherwise the launch status. Enqueues nothing for batch ==
// 0 or q_len == 0.
cudaError_t LaunchFlashAttention(const DeviceAttentionArgs& args,
                                 cudaStream_t stream);

}  // namespace ringattn

#endif  // RINGATTN_KERNELS_CUDA_FLASH_ATTENTION_H_
