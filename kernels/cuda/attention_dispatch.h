#ifndef RINGATTN_KERNELS_CUDA_ATTENTION_DISPATCH_H_
#define RINGATTN_KERNELS_CUDA_ATTENTION_DISPATCH_H_

// Picks the GPU attention path for each block: our Hopper kernel with split
// keys for up to a few hundred query rows against many keys, our decode
// kernel (decode_attention.h) for few rows where that does not run (other
// GPUs, shorter blocks), our Hopper kernel whole for long blocks at head dims
// from 64 up, cuDNN's fused kernel for the other blocks of shapes it takes and
// has seen before, and our own kernels for the rest (a work list, an odd head
// dim, a shape met the first time or a small block, whose cuDNN plan would
// take longer to build than our kernel takes to compute it): the Hopper one
// (hopper_attention.h) where it takes the block, else the mma.sync one
// (flash_attention.h). It says which one ran.
// AttentionDispatcher is thread-compatible (it owns a CudnnAttention);
// RunFlashAttention and RunOwnAttention are thread-safe.

#include <cuda_runtime.h>

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/attention_args.h"
#include "kernels/cuda/cudnn_attention.h"
#include "kernels/cuda/device_buffer.h"

namespace ringattn {

// The GPU attention paths.
enum class AttentionPath {
  kCudnn,   // cuDNN's fused SDPA forward
  kFlash,   // our mma.sync kernel, kernels/cuda/flash_attention.cu
  kHopper,  // our wgmma/TMA kernel, kernels/cuda/hopper_attention.cu
  kDecode,  // our split-K/V kernel for few rows,
            // kernels/cuda/decode_attention.cu
};

// "cudnn", "flash", "hopper" or "decode".
const char* AttentionPathName(AttentionPath path);

// How many blocks each path computed.
struct AttentionPathCounts {
  int64_t cudnn = 0;
  int64_t flash = 0;
  int64_t hopper = 0;
  int64_t decode = 0;

  void Add(AttentionPath path);
  AttentionPathCounts& operator+=(const AttentionPathCounts& other);
  int64_t total() const { return cudnn + flash + hopper + decode; }
};

// Enqueues our kernel on `stream`. OK once enqueued; INVALID_ARGUMENT for
// malformed args (FindAttentionArgsProblem's sentence), a batch * q_heads
// above 65535 or a work list above the kernel's limits; INTERNAL for a failed
// launch.
absl::Status RunFlashAttention(const DeviceAttentionArgs& args,
                               cudaStream_t stream);

// Enqueues our own kernel on `stream`: the Hopper one where
// HopperAttentionTakes(args), else the mma.sync one (RunFlashAttention), and
// returns which. Errors as RunFlashAttention's.
absl::StatusOr<AttentionPath> RunOwnAttention(const DeviceAttentionArgs& args,
                                              cudaStream_t stream);

// Enqueues our decode kernel on `stream`, first growing `workspace` (after
// waiting for `stream`) to what the kernel asks for. OK once enqueued;
// INVALID_ARGUMENT for malformed args or batch * kv_heads above 65535;
// UNIMPLEMENTED for args with a work list; INTERNAL for a failed allocation
// or launch.
absl::Status RunDecodeAttention(const DeviceAttentionArgs& args,
                                DeviceBuffer& workspace, cudaStream_t stream);

// Whether AttentionDispatcher runs `args` on our Hopper kernel with its keys
// split (HopperKeySplits > 1): a whole block the Hopper kernel takes, too few
// query tiles to fill the GPU. Measured on one H100 at 1M keys, Hq=32, Hkv=8
// (README, "Few query rows against a long context"), split Hopper against the
// decode kernel: 1 row 1.39 against 1.50 ms, 16 rows 1.40 against 1.53, 64
// rows 2.46 against 4.00, 128 rows 4.37 against 7.84 (11.9 on cuDNN); 256
// rows 8.2 against 11.7 on cuDNN.
bool PrefersHopperSplit(const DeviceAttentionArgs& args);

// The key splits AttentionDispatcher runs `args` with on our Hopper kernel:
// HopperKeySplits for a whole block the Hopper kernel takes, else 1 (no
// split). PrefersHopperSplit is HopperSplitsFor > 1.
int HopperSplitsFor(const DeviceAttentionArgs& args);

// Enqueues our Hopper kernel with its keys cut into `splits` (from
// HopperSplitsFor), first growing `workspace` (after waiting for `stream`) to
// what it asks for. Errors as RunDecodeAttention's.
absl::Status RunHopperSplit(const DeviceAttentionArgs& args, int splits,
                            DeviceBuffer& workspace, cudaStream_t stream);

// Whether AttentionDispatcher runs `args` on our Hopper kernel whole rather
// than on cuDNN: a block without a work list that the Hopper kernel takes,
// head dim of at least 64, at least 16384 keys (enough key steps per thread
// block to cover its start), at D=80 and D=96 at least 4096 (there ours runs
// 1.02-1.08x cuDNN at 4K keys, 1.08-1.14x at 8K; thirty-eighth session, one
// H200, dense and causal, 32 heads). Measured on one H200 (ninth session),
// TFLOP/s ours against cuDNN in the same run: D=128 dense 16K 627-629 /
// 607-610, 64K 646-647 / 611-614, causal 64K 623 / 599-605; 4096 rows against
// 1M keys (Hq=32, Hkv=8) 109.1 / 113.5 ms, against 4M 437 / 480 ms. D=64, three
// consumer warpgroups (thirty-fifth session), dense / causal: 16K 515 / 473
// against 487 / 463, 64K 487 / 481 against 459 / 453, 256K 481 / 486 against
// 423 / 432.
bool PrefersHopperWhole(const DeviceAttentionArgs& args);

// The most packed rows per K/V head PrefersDecode sends to the decode kernel
// (the CPU kernels have their own limit, kDecodeMaxPackedRows).
inline constexpr int64_t kGpuDecodeMaxPackedRows = 512;

// Whether AttentionDispatcher runs `args` on the decode kernel where the
// split Hopper kernel does not take them: few packed rows (q_len * q_heads /
// kv_heads, the rows that share one K/V head) against enough keys, where it
// beat cuDNN as measured on one H200 (README, "Few query rows against a long
// context"). A single query row goes there too although cuDNN reads K/V about
// 8% faster for it: decode steps grow the keys by one row each, and cuDNN would
// build and keep a plan for every length. Never for args with a work list,
// which only our flash kernel takes.
bool PrefersDecode(const DeviceAttentionArgs& args);

class AttentionDispatcher {
 public:
  // Starts cuDNN on the current device. If it cannot start, every block runs
  // on our kernel and cudnn_status() says why.
  AttentionDispatcher();

  AttentionDispatcher(const AttentionDispatcher&) = delete;
  AttentionDispatcher& operator=(const AttentionDispatcher&) = delete;

  // Enqueues attention of `args` on `stream` and returns the path that took
  // it: the split Hopper kernel where PrefersHopperSplit, else the decode
  // kernel where PrefersDecode, else the whole Hopper kernel where
  // PrefersHopperWhole, else cuDNN where CudnnAttention::WorthRunning (a
  // recurring shape, not too small), or our own kernel (RunOwnAttention) for
  // the rest and where cuDNN answered UNIMPLEMENTED for the shape (always for
  // args with a work list).
  // Malformed args (INVALID_ARGUMENT) and failures of a path that accepted the
  // block come back as errors, never masked by a second attempt.
  absl::StatusOr<AttentionPath> Forward(const DeviceAttentionArgs& args,
                                        cudaStream_t stream);

  // Forward with the result folded into the fp32 accumulators `into`
  // (partial_merge.h) rather than left in args.o and args.lse: the whole
  // Hopper kernel folds each row as it stores it where it takes `into`
  // (HopperAttentionFoldsInto); the other paths write args.o and args.lse,
  // which must then be contiguous scratch, and LaunchMergePartialStrided
  // folds them. Errors as Forward's.
  absl::StatusOr<AttentionPath> ForwardInto(const DeviceAttentionArgs& args,
                                            const AccumulatorRows& into,
                                            cudaStream_t stream);

  // OK when cuDNN is in use; otherwise why it is not.
  const absl::Status& cudnn_status() const { return cudnn_status_; }

  // With `prefer`, blocks cuDNN would take go to our Hopper kernel wherever it
  // takes them (the decode kernel keeps its blocks): for measuring one path
  // against the other on the same work, and for the shapes where ours is
  // faster. Off by default.
  void PreferOwnKernel(bool prefer) { prefer_own_kernel_ = prefer; }

 private:
  // Forward, and ForwardInto where `into` is not null.
  absl::StatusOr<AttentionPath> Run(const DeviceAttentionArgs& args,
                                    const AccumulatorRows* into,
                                    cudaStream_t stream);
  // Our own kernel (RunOwnAttention), folding as it stores where it can.
  absl::StatusOr<AttentionPath> RunOwn(const DeviceAttentionArgs& args,
                                       const AccumulatorRows* into,
                                       cudaStream_t stream);
  // `path`, once the partial result it left in args.o and args.lse is folded
  // into `into` (nothing to do for a null `into`).
  absl::StatusOr<AttentionPath> Folded(AttentionPath path,
                                       const DeviceAttentionArgs& args,
                                       const AccumulatorRows* into,
                                       cudaStream_t stream);

  std::unique_ptr<CudnnAttention> cudnn_;
  absl::Status cudnn_status_;
  bool prefer_own_kernel_ = false;
  DeviceBuffer decode_workspace_;  // the decode kernel's split results
  DeviceBuffer split_workspace_;   // the split Hopper kernel's partials
};

}  // namespace ringattn

#endif  // RINGATTN_KERNELS_CUDA_ATTENTION_DISPATCH_H_
