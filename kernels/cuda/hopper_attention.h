#ifndef RINGATTN_KERNELS_CUDA_HOPPER_ATTENTION_H_
#define RINGATTN_KERNELS_CUDA_HOPPER_ATTENTION_H_

// Our attention forward for Hopper GPUs (compute capability 9.0), in the
// manner of FlashAttention-3: a producer warpgroup fills 128-byte swizzled
// shared memory with TMA copies two or three key tiles ahead; two consumer
// warpgroups of 64 query rows each read it with warpgroup MMAs (wgmma), fp32
// accumulators, an online softmax in base 2, and take turns at the tensor
// cores so that one's softmax runs beside the other's products. Each step's
// P V is issued with the next step's Q K^T and runs beside that step's
// softmax. 128 query rows per thread block, 176 keys per step; a whole block
// of more than 256 rows at head dims up to 64 runs three consumers instead,
// 192 rows and 128 keys a step. Head dims 64, 80, 96 and 128 compiled, other
// multiples of 8 padded with zeros to the next. On a whole block the query
// heads that share a K/V head are packed into one tile, 128 / group rows of
// each (a group of 7: 18 rows of each, 126 of 128 rows used), so every K/V
// byte is loaded once for the group; where the group has too many rows for
// that, as many of its heads as fill a tile (a power of two that divides it)
// share each tile. A query of at most 64 such rows runs on one consumer
// warpgroup, above D=64 with 64 keys per step and two thread blocks an SM.
// Takes the whole block or a work list (attention_work_list.h); a whole
// block's result may instead be folded into fp32 accumulators as it is
// stored (LaunchHopperAttentionInto). Stateless and thread-safe.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/attention_args.h"

namespace ringattn {

// Whether the current device runs the Hopper kernel (compute capability 9.0,
// a driver with TMA tensor maps) for blocks of `head_dim`: a multiple of 8 up
// to 128.
bool HopperAttentionAvailable(int64_t head_dim);

// Whether the Hopper kernel has a build for exactly `head_dim` (64, 80, 96 or
// 128) rather than padding it to the next; true whatever the device.
bool HopperCompiledForHeadDim(int64_t head_dim);

// Whether LaunchHopperAttention takes `args` on the current device: a Hopper
// GPU, 16-byte aligned rows and pointers, head_dim a multiple of 8 up to 128,
// batch * q_heads <= 65535 and lengths below 2^30. `args` must be well formed
// (FindAttentionArgsProblem).
bool HopperAttentionTakes(const DeviceAttentionArgs& args);

// Enqueues attention of `args` on `stream`: writes args.o and, if non-null,
// args.lse. cudaErrorInvalidValue where !HopperAttentionTakes(args) or the
// args are malformed; otherwise the launch status. Enqueues nothing for batch
// == 0 or q_len == 0.
cudaError_t LaunchHopperAttention(const DeviceAttentionArgs& args,
                                  cudaStream_t stream);

// Whether LaunchHopperAttentionInto takes `args` and `into`: where
// HopperAttentionTakes(args), a whole block (no work list), accumulator rows
// of float pairs (8-byte aligned, even strides) that do not overlap (seq
// strides of at least q_heads * head_dim and q_heads).
bool HopperAttentionFoldsInto(const DeviceAttentionArgs& args,
                              const AccumulatorRows& into);

// LaunchHopperAttention that folds each row of its result into the fp32
// accumulators `into` as it stores it (partial_merge.h's semantics: O and LSE
// merged by log-sum-exp; a row that saw no key changes nothing) instead of
// writing args.o and args.lse: LaunchHopperAttention and
// LaunchMergePartialStrided in one kernel, with no 16-bit partial O between
// them. With into.fresh it stores each row without reading the accumulators.
// cudaErrorInvalidValue where !HopperAttentionFoldsInto.
cudaError_t LaunchHopperAttentionInto(const DeviceAttentionArgs& args,
                                      const AccumulatorRows& into,
                                      cudaStream_t stream);

// How many key splits fill the GPU for `args` (1: no split): where the
// block's query tiles give at most one thread block per two SMs (up to a few
// hundred query rows against many keys), the count of at most 32 splits (up
// to one thread block per slot where 32 splits would not fill the SMs once),
// each of at least 4096 keys, whose waves of thread blocks (one per SM at a
// time, two for one consumer at D=128) are fullest, the fewest among equals.
// 1 for work lists. (On one H100
// at 1M keys, Hq=32, Hkv=8, 256 rows: 6.95 ms in 2 splits, 128 thread blocks,
// one wave; 8.3 ms in 5, 2.4 waves, the earlier rule's pick; 128 rows 3.65 ms
// in 4 against 4.8 in 9. On one H200, one row, Hq=4, Hkv=1, 8M keys: 2.47 ms
// in 32 splits, 32 thread blocks, against 1.25 on cuDNN.)
int HopperKeySplits(const DeviceAttentionArgs& args);

// Query rows of a whole block (one too tall to pack heads, no work list) of
// `batch` x `q_heads` heads at `head_dim` whose thread blocks fill every SM of
// the current device a whole number of times (at 132 SMs and 32 heads: 4224,
// 33 tiles of 128 rows; at head dims up to 64, 6336 in tiles of 192); 0 where
// the kernel does not run here. A launch of a multiple of them ends without a
// part-filled last wave.
int64_t HopperWaveRows(int64_t batch, int64_t q_heads, int64_t head_dim);

// Device scratch LaunchHopperAttentionSplit needs for `splits` splits.
size_t HopperSplitWorkspaceBytes(const DeviceAttentionArgs& args, int splits);

// LaunchHopperAttention with the keys cut into `splits` (1-256) ranges that
// run side by side, each writing a partial O and LSE into `workspace`, then
// folded into args.o and args.lse by log-sum-exp (a second, small kernel).
// For a whole block (no work list). cudaErrorInvalidValue for bad args or a
// workspace below HopperSplitWorkspaceBytes.
cudaError_t LaunchHopperAttentionSplit(const DeviceAttentionArgs& args,
                                       int splits, void* workspace,
                                       size_t workspace_bytes,
                                       cudaStream_t stream);

}  // namespace ringattn

#endif  // RINGATTN_KERNELS_CUDA_HOPPER_ATTENTION_H_
