#ifndef RINGATTN_WORKER_PARTIAL_REDUCTION_H_
#define RINGATTN_WORKER_PARTIAL_REDUCTION_H_

// Broadcast-Q's LSE reduction on the workers. Every rank of a request holds a
// partial attention result (fp32 O and LSE) of the same query rows over its
// own keys; ReduceToRankZero folds them, by log-sum-exp, into rank 0 over the
// request's communicator as a binomial tree: in round k (k = 0, 1, ...) a rank
// whose lowest set bit is bit k sends its accumulated partial to rank - 2^k
// and is done, and a rank whose bits 0..k are clear receives from rank + 2^k
// (when that rank exists) and merges. That is ceil(log2 p) rounds and p - 1
// transfers of one partial each, for any p >= 1 (not only powers of two).
//
// The tree is the same on every kind of memory: PartialBuffers says where a
// rank's partial and the landing place of a received one lie and how the two
// merge. HostPartials (below) is host memory and the CPU merge, for Gloo;
// DevicePartials (gpu_partial_reduction.h) is device memory and the GPU merge
// kernel, for NCCL.

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/attention_spec.h"
#include "core/tensor.h"
#include "worker/communicator.h"
#include "worker/ring_executor.h"

namespace ringattn {

// One rank's partial result and room for a peer's, in the memory its
// communicator moves. Thread-compatible.
class PartialBuffers {
 public:
  virtual ~PartialBuffers() = default;

  // The accumulated partial: what a send reads and a merge updates.
  virtual void* o() = 0;
  virtual void* lse() = 0;
  // Makes room for one peer's partial, of the same sizes, once: only ranks
  // that receive need it. RESOURCE_EXHAUSTED if the memory cannot be had.
  virtual absl::Status MakeReceiveRoom() = 0;
  // Where a peer's partial is received; valid after MakeReceiveRoom.
  virtual void* received_o() = 0;
  virtual void* received_lse() = 0;
  // The sizes of O and of LSE, in bytes (both > 0).
  virtual int64_t o_bytes() const = 0;
  virtual int64_t lse_bytes() const = 0;

  // Folds the received partial into the accumulated one; the result is in
  // place, ready for a send, when it returns. INTERNAL if the merge failed.
  virtual absl::Status MergeReceived() = 0;
};

// What one rank's part of a reduction did.
struct ReductionStats {
  int64_t rounds = 0;     // rounds this rank took part in
  int64_t transfers = 0;  // partials this rank sent (0 or 1)
  int64_t bytes_sent = 0;
  double wait_seconds = 0;  // blocked on transfers
};

// Reduces the partials of every rank of `communicator` into rank 0's
// `partials` (the other ranks' buffers are left as scratch). Each wait ends
// at options.step_timeout from its start or options.deadline, whichever is
// first; options.cancelled is checked before every transfer. Errors: the
// communicator's (UNAVAILABLE for a peer that failed or went away,
// DEADLINE_EXCEEDED for one that did not answer in time, CANCELLED after an
// Abort), CANCELLED once options.cancelled is set, and MergeReceived's. On an
// error the communicator is aborted and no transfer uses `partials` any
// more; the peers then fail too instead of waiting.
absl::StatusOr<ReductionStats> ReduceToRankZero(RingCommunicator& communicator,
                                                PartialBuffers& partials,
                                                const RingOptions& options);

// The memory a rank needs beyond its partial to take part in a reduction of
// `spec`'s query rows: room for one received partial (fp32 O and LSE).
int64_t PartialReductionScratchBytes(const AttentionSpec& spec);

// A partial in host memory, merged by the CPU (kernels/cpu/merge_with_lse.h),
// for communicators that move host memory (Gloo). Not copyable.
class HostPartials final : public PartialBuffers {
 public:
  // Reduces `o` ([B, n, H, D]) and `lse` ([B, n, H, 1]), contiguous, in
  // place; they must outlive this.
  HostPartials(View<float> o, View<float> lse);

  HostPartials(const HostPartials&) = delete;
  HostPartials& operator=(const HostPartials&) = delete;

  void* o() override { return o_.data(); }
  void* lse() override { return lse_.data(); }
  absl::Status MakeReceiveRoom() override;
  void* received_o() override { return received_o_.data(); }
  void* received_lse() override { return received_lse_.data(); }
  int64_t o_bytes() const override;
  int64_t lse_bytes() const override;
  absl::Status MergeReceived() override;

 private:
  const View<float> o_;
  const View<float> lse_;
  Tensor<float> received_o_;  // empty until MakeReceiveRoom
  Tensor<float> received_lse_;
};

}  // namespace ringattn

#endif  // RINGATTN_WORKER_PARTIAL_REDUCTION_H_
