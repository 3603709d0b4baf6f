#include "kernels/cuda/attention_dispatch.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/flash_attention.h"

namespace ringattn {
namespace {

// LaunchFlashAttention's limits: one grid row per (batch, head), int positions.
constexpr int64_t kMaxBatchHeads = 65535;
constexpr int64_t kMaxLength = int64_t{1} << 30;

}  // namespace

const char* AttentionPathName(AttentionPath path) {
  switch (path) {
    case AttentionPath::kCudnn:
      return "cudnn";
    case AttentionPath::kFlash:
      return "flash";
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
  return CudaStatus(LaunchFlashAttention(args, stream),
                    "launching the flash attention kernel");
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
  if (cudnn_ != nullptr) {
    const absl::Status status = cudnn_->Forward(args, stream);
    if (status.ok()) return AttentionPath::kCudnn;
    if (!absl::IsUnimplemented(status)) return status;
  }
  if (absl::Status status = RunFlashAttention(args, stream); !status.ok()) {
    return status;
  }
  return AttentionPath::kFlash;
}

}  // namespace ringattn
