#ifndef RINGATTN_KERNELS_CUDA_CUDNN_ATTENTION_H_
#define RINGATTN_KERNELS_CUDA_CUDNN_ATTENTION_H_

// CudnnAttention: dense attention blocks through cuDNN's fused SDPA forward
// (its graph API, via the cuDNN frontend, which only cudnn_attention.cc sees).
// It owns a cuDNN handle bound to the device that was current at Create(), a
// cache of built execution plans (one per shape, stride, scale and mask key;
// no rebuild when only the pointers change) that keeps the most recently used
// ones, and a workspace that grows when a plan needs more. Thread-compatible:
// one thread at a time, with that device current.

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/attention_args.h"

namespace ringattn {

// How many plans a CudnnAttention keeps by default. A plan holds cuDNN's
// compiled kernel: a load run of random shapes on one H200 grew a worker by
// about 40 MB of host memory a second while every shape's plan was kept.
inline constexpr int kDefaultCudnnPlans = 32;

// The least work (4 * batch * q_len * kv_len * q_heads * head_dim FLOPs) of a
// block CudnnAttention::WorthRunning builds a plan for: a smaller block takes a
// few microseconds on our kernels, so cuDNN's lead of a few percent would need
// tens of thousands of them to repay the plan.
inline constexpr double kMinPlanFlops = 1e9;

class CudnnAttention {
 public:
  // A handle on the current device, or UNAVAILABLE with cuDNN's reason (no
  // device, no library). It keeps at most `max_plans` (>= 1) plans, dropping
  // the least recently used one to make room.
  static absl::StatusOr<std::unique_ptr<CudnnAttention>> Create(
      int max_plans = kDefaultCudnnPlans);

  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // Enqueues attention of `args` on `stream` (see DeviceAttentionArgs for the
  // layouts and masking). Rows that see no key get O = 0 and LSE = -inf, which
  // cuDNN itself is never asked to compute. Returns OK once enqueued;
  // INVALID_ARGUMENT for malformed args; UNIMPLEMENTED, with cuDNN's words,
  // where cuDNN does not take the shape (head_dim not a multiple of 8, rows not
  // 16-byte aligned, a GPU or cuDNN version without a kernel for it, args
  // with a work list) so that the caller can run another path; INTERNAL when an
  // accepted plan fails to run. A refusal is cached like a plan and answered at
  // once next time.
  absl::Status Forward(const DeviceAttentionArgs& args, cudaStream_t stream);

  // Whether `args` should go to Forward: Forward needs no plan for it, or its
  // plan (or refusal) is cached, or its block has at least kMinPlanFlops of
  // work and its shape was seen before (each call for such a shape without a
  // plan counts one sighting). Building a plan takes 50-90 ms on an H200, far
  // longer than a block of a one-off shape takes on our own kernels, so a
  // shape is built the second time it comes.
  bool WorthRunning(const DeviceAttentionArgs& args);

  // How many plans (built or refused) the cache holds.
  int64_t cached_plans() const;
  // How many plans were built (or refused) so far, counting those built again
  // after they were dropped.
  int64_t built_plans() const;

  // The cuDNN library version running, e.g. 91900 for 9.19.0.
  static int64_t LibraryVersion();

 private:
  class Impl;
  explicit CudnnAttention(std::unique_ptr<Impl> impl);

  std::unique_ptr<Impl> impl_;
};

}  // namespace ringattn

#endif  // RINGATTN_KERNELS_CUDA_CUDNN_ATTENTION_H_
