#include "kernels/cuda/attention_dispatch.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "kernels/cuda/decode_attention.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/flash_attention.h"
#include "kernels/cuda/hopper_attention.h"
#include "kernels/cuda/partial_merge.h"

namespace ringattn {
namespace {

// LaunchFlashAttention's limits: one grid row per (batch, head), int positions.
constexpr int64_t kMaxBatchHeads = 65535;
constexpr int64_t kMaxLength = int64_t{1} << 30;

// The decode kernel's limit: one grid slice per (batch, kv head).
constexpr int64_t kMaxBatchKvHeads = 65535;

// PrefersDecode's threshold on keys: at least this many.
constexpr int64_t kDecodeMinKeys = 1024;

// PrefersHopperWhole's thresholds: head dims of at least this (smaller ones
// are padded to 64 in our kernel, not in cuDNN's), at least this many keys;
// at D=80 and D=96, at least the fewer.
constexpr int64_t kHopperWholeMinHeadDim = 64;
constexpr int64_t kHopperWholeMinKeys = 16384;
constexpr int64_t kHopperWholeMinKeysAtD80AndD96 = 4096;

// The query rows that share one K/V head (kv_heads > 0).
int64_t PackedRows(const DeviceAttentionArgs& args) {
  return args.q_len * (args.q_heads / args.kv_heads);
}

// Whether our Hopper kernel takes well-formed `args` on this device.
bool HopperTakes(const DeviceAttentionArgs& args) {
  return FindAttentionArgsProblem(args) == nullptr &&
         HopperAttentionTakes(args);
}

}  // namespace

const char* AttentionPathName(AttentionPath path) {
  switch (path) {
    case AttentionPath::kCudnn:
      return "cudnn";
    case AttentionPath::kFlash:
      return "flash";
    case AttentionPath::kHopper:
      return "hopper";
    case AttentionPath::kDecode:
      return "decode";
  }
  return "unknown";
}

absl::Status RunFlashAttention(const DeviceAttentionArgs& args,
                               cudaStream_t stream) {
  if (const char* problem = FindAttentionArgsProblem(args)) {
    return absl::InvalidArgumentError(problem);
  }
  if (args.batch * args.q_heads > kMaxBatchHeads) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch * q_heads is ", args.batch * args.q_heads,
                     "; our attention kernel takes at most ", kMaxBatchHeads));
  }
  if (args.q_len > kMaxLength || args.kv_len > kMaxLength) {
    return absl::InvalidArgumentError(
        absl::StrCat("q_len ", args.q_len, " or kv_len ", args.kv_len,
                     " is above our attention kernel's ", kMaxLength));
  }
  if (args.work.tile_count > kMaxWorkListTiles ||
      args.work.span_count > kMaxWorkListSpans) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a work list of ", args.work.tile_count, " tiles and ",
        args.work.span_count, " spans is above our attention kernel's ",
        kMaxWorkListTiles));
  }
  return CudaStatus(LaunchFlashAttention(args, stream),
                    "launching the flash attention kernel");
}

absl::StatusOr<AttentionPath> RunOwnAttention(const DeviceAttentionArgs& args,
                                              cudaStream_t stream) {
  if (HopperTakes(args)) {
    if (absl::Status status =
            CudaStatus(LaunchHopperAttention(args, stream),
                       "launching the Hopper attention kernel");
        !status.ok()) {
      return status;
    }
    return AttentionPath::kHopper;
  }
  if (absl::Status status = RunFlashAttention(args, stream); !status.ok()) {
    return status;
  }
  return AttentionPath::kFlash;
}

namespace {

// Grows `workspace` to `needed` bytes, first waiting for `stream` (work
// queued there may still read the old one).
absl::Status GrowWorkspace(size_t needed, DeviceBuffer& workspace,
                           cudaStream_t stream) {
  if (needed <= workspace.bytes()) return absl::OkStatus();
  if (absl::Status s = CudaStatus(cudaStreamSynchronize(stream),
                                  "waiting to grow a kernel workspace");
      !s.ok()) {
    return s;
  }
  absl::StatusOr<DeviceBuffer> grown = DeviceBuffer::Allocate(needed);
  if (!grown.ok()) return grown.status();
  workspace = *std::move(grown);
  return absl::OkStatus();
}

}  // namespace

absl::Status RunDecodeAttention(const DeviceAttentionArgs& args,
                                DeviceBuffer& workspace, cudaStream_t stream) {
  if (const char* problem = FindAttentionArgsProblem(args)) {
    return absl::InvalidArgumentError(problem);
  }
  if (args.work.tile_count > 0) {
    return absl::UnimplementedError(
        "the decode kernel does not take a work list");
  }
  if (args.batch * args.kv_heads > kMaxBatchKvHeads) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch * kv_heads is ", args.batch * args.kv_heads,
                     "; the decode kernel takes at most ", kMaxBatchKvHeads));
  }
  if (args.q_len * (args.q_heads / args.kv_heads) > kMaxLength ||
      args.kv_len > kMaxLength) {
    return absl::InvalidArgumentError(
        absl::StrCat("q_len ", args.q_len, " or kv_len ", args.kv_len,
                     " is above the decode kernel's limits"));
  }
  RINGATTN_RETURN_IF_ERROR(
      GrowWorkspace(DecodeAttentionWorkspaceBytes(args), workspace, stream));
  return CudaStatus(LaunchDecodeAttention(args, workspace.as<void>(),
                                          workspace.bytes(), stream),
                    "launching the decode attention kernel");
}

void AttentionPathCounts::Add(AttentionPath path) {
  switch (path) {
    case AttentionPath::kCudnn:
      ++cudnn;
      break;
    case AttentionPath::kFlash:
      ++flash;
      break;
    case AttentionPath::kHopper:
      ++hopper;
      break;
    case AttentionPath::kDecode:
      ++decode;
      break;
  }
}

AttentionPathCounts& AttentionPathCounts::operator+=(
    const AttentionPathCounts& other) {
  cudnn += other.cudnn;
  flash += other.flash;
  hopper += other.hopper;
  decode += other.decode;
  return *this;
}

int HopperSplitsFor(const DeviceAttentionArgs& args) {
  if (args.work.tile_count > 0 || !HopperTakes(args)) return 1;
  return HopperKeySplits(args);
}

bool PrefersHopperSplit(const DeviceAttentionArgs& args) {
  return HopperSplitsFor(args) > 1;
}

absl::Status RunHopperSplit(const DeviceAttentionArgs& args, int splits,
                            DeviceBuffer& workspace, cudaStream_t stream) {
  if (const char* problem = FindAttentionArgsProblem(args)) {
    return absl::InvalidArgumentError(problem);
  }
  RINGATTN_RETURN_IF_ERROR(GrowWorkspace(
      HopperSplitWorkspaceBytes(args, splits), workspace, stream));
  return CudaStatus(
      LaunchHopperAttentionSplit(args, splits, workspace.as<void>(),
                                 workspace.bytes(), stream),
      "launching the Hopper attention kernel with split keys");
}

bool PrefersHopperWhole(const DeviceAttentionArgs& args) {
  const int64_t min_keys = args.head_dim == 80 || args.head_dim == 96
                               ? kHopperWholeMinKeysAtD80AndD96
                               : kHopperWholeMinKeys;
  return args.work.tile_count == 0 && args.head_dim >= kHopperWholeMinHeadDim &&
         args.kv_len >= min_keys && HopperTakes(args);
}

bool PrefersDecode(const DeviceAttentionArgs& args) {
  return args.work.tile_count == 0 && args.kv_heads > 0 &&
         PackedRows(args) <= kGpuDecodeMaxPackedRows &&
         args.kv_len >= kDecodeMinKeys &&
         args.batch * args.kv_heads <= kMaxBatchKvHeads;
}

AttentionDispatcher::AttentionDispatcher() {
  absl::StatusOr<std::unique_ptr<CudnnAttention>> cudnn =
      CudnnAttention::Create();
  if (cudnn.ok()) {
    cudnn_ = *std::move(cudnn);
  } else {
    cudnn_status_ = cudnn.status();
  }
}

absl::StatusOr<AttentionPath> AttentionDispatcher::Forward(
    const DeviceAttentionArgs& args, cudaStream_t stream) {
  return Run(args, nullptr, stream);
}

absl::StatusOr<AttentionPath> AttentionDispatcher::ForwardInto(
    const DeviceAttentionArgs& args, const AccumulatorRows& into,
    cudaStream_t stream) {
  return Run(args, &into, stream);
}

absl::StatusOr<AttentionPath> AttentionDispatcher::Run(
    const DeviceAttentionArgs& args, const AccumulatorRows* into,
    cudaStream_t stream) {
  // The split count is asked for once: it reads the device's SM count.
  if (const int splits = HopperSplitsFor(args); splits > 1) {
    RINGATTN_RETURN_IF_ERROR(
        RunHopperSplit(args, splits, split_workspace_, stream));
    return Folded(AttentionPath::kHopper, args, into, stream);
  }
  if (PrefersDecode(args)) {
    RINGATTN_RETURN_IF_ERROR(
        RunDecodeAttention(args, decode_workspace_, stream));
    return Folded(AttentionPath::kDecode, args, into, stream);
  }
  if (PrefersHopperWhole(args) || (prefer_own_kernel_ && HopperTakes(args))) {
    return RunOwn(args, into, stream);
  }
  if (cudnn_ != nullptr && cudnn_->WorthRunning(args)) {
    const absl::Status status = cudnn_->Forward(args, stream);
    if (status.ok()) return Folded(AttentionPath::kCudnn, args, into, stream);
    if (!absl::IsUnimplemented(status)) return status;
  }
  return RunOwn(args, into, stream);
}

absl::StatusOr<AttentionPath> AttentionDispatcher::RunOwn(
    const DeviceAttentionArgs& args, const AccumulatorRows* into,
    cudaStream_t stream) {
  if (into != nullptr && HopperAttentionFoldsInto(args, *into)) {
    RINGATTN_RETURN_IF_ERROR(
        CudaStatus(LaunchHopperAttentionInto(args, *into, stream),
                   "launching the Hopper attention kernel"));
    return AttentionPath::kHopper;
  }
  absl::StatusOr<AttentionPath> path = RunOwnAttention(args, stream);
  if (!path.ok()) return path;
  return Folded(*path, args, into, stream);
}

absl::StatusOr<AttentionPath> AttentionDispatcher::Folded(
    AttentionPath path, const DeviceAttentionArgs& args,
    const AccumulatorRows* into, cudaStream_t stream) {
  if (into == nullptr) return path;
  RINGATTN_RETURN_IF_ERROR(
      CudaStatus(LaunchMergePartialStrided(args.dtype, args.o.data, args.lse,
                                           args.batch, args.q_len, args.q_heads,
                                           args.head_dim, *into, stream),
                 "folding a partial result into the accumulators"));
  return path;
}

}  // namespace ringattn
