#ifndef RINGATTN_KERNELS_CUDA_FLASH_ATTENTION_H_
#define RINGATTN_KERNELS_CUDA_FLASH_ATTENTION_H_

// Our own attention forward kernel: the path that takes every shape cuDNN
// refuses. FlashAttention-2 style: bf16/fp16 tensor-core products (mma.sync,
// sm_80 and newer) with fp32 accumulation and an online softmax in base 2; any
// head_dim up to 256 (compiled for head dims 64, 128 and 256, smaller ones
// padded with zeros); any strides (16-byte aligned rows take the fast copy
// path, others an element-wise one). With a work list (args.work) one launch
// computes only the listed query tiles against their key spans, one thread
// block per tile and (batch, head), one online softmax per tile: at head dims
// up to 128 a block takes the tile's up to 128 rows at once, at head dim 256
// (64 rows per block) it walks them in two passes, so tiles need no
// splitting. Stateless and thread-safe.

#include <cuda_runtime.h>

#include "kernels/cuda/attention_args.h"

namespace ringattn {

// The most tiles and spans one work list may hold (one thread block per tile
// in the grid's x dimension; int indices).
inline constexpr int64_t kMaxWorkListTiles = (int64_t{1} << 31) - 1;
inline constexpr int64_t kMaxWorkListSpans = (int64_t{1} << 31) - 1;

// Enqueues attention of `args` on `stream`: writes args.o and, if non-null,
// args.lse (with a work list only the rows of its tiles; spans and tiles
// reaching outside the block are clipped to it). Returns
// cudaErrorInvalidValue for args that FindAttentionArgsProblem rejects, with
// batch * q_heads above 65535, a length above 2^30 or a work list longer than
// the limits above; otherwise the launch status. Enqueues nothing for batch ==
// 0 or q_len == 0.
cudaError_t LaunchFlashAttention(const DeviceAttentionArgs& args,
                                 cudaStream_t stream);

}  // namespace ringattn

#endif  // RINGATTN_KERNELS_CUDA_FLASH_ATTENTION_H_
