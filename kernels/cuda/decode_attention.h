#ifndef RINGATTN_KERNELS_CUDA_DECODE_ATTENTION_H_
#define RINGATTN_KERNELS_CUDA_DECODE_ATTENTION_H_

// Split-K/V ("flash-decoding") attention for few query rows against a long
// K/V block. The query heads that share a K/V head are packed into one tile
// (its rows are (query row, head in group) pairs), so each K/V byte is read
// from memory once for all of them; the keys are cut into splits, one CTA per
// (split, K/V head, tile of packed rows), so that the whole GPU streams K/V;
// a second kernel merges the splits by their LSE. bf16/fp16 tensor-core
// products (mma.sync, sm_80 and newer), fp32 online softmax in base 2; head
// dims 64, 80, 96 and 128 compiled, any head_dim up to 256 through the next
// larger of them or the 256 kernel.
// Same arguments, layouts and outputs as LaunchFlashAttention. Stateless and
// thread-safe.

#include <cuda_runtime.h>

#include <cstddef>

#include "kernels/cuda/attention_args.h"

namespace ringattn {

// Bytes of device scratch that LaunchDecodeAttention uses for `args` on the
// current device to spread the keys over every SM (fp32 partial O and LSE per
// split); 0 where one split suffices or `args` are malformed.
size_t DecodeAttentionWorkspaceBytes(const DeviceAttentionArgs& args);

// Enqueues attention of `args` on `stream`: writes args.o and, if non-null,
// args.lse. `workspace` (device memory of `workspace_bytes`, may be null) holds
// the splits' partial results; with less than DecodeAttentionWorkspaceBytes
// the keys are cut into fewer splits (one with none), still exactly. Returns
// cudaErrorInvalidValue for args that FindAttentionArgsProblem rejects, with
// batch * kv_heads above 65535 or a length above 2^30; otherwise the status of
// the launches. Enqueues nothing for batch == 0 or q_len == 0.
cudaError_t LaunchDecodeAttention(const DeviceAttentionArgs& args,
                                  void* workspace, size_t workspace_bytes,
                                  cudaStream_t stream);

}  // namespace ringattn

#endif  // RINGATTN_KERNELS_CUDA_DECODE_ATTENTION_H_
