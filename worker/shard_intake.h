#ifndef RINGATTN_WORKER_SHARD_INTAKE_H_
#define RINGATTN_WORKER_SHARD_INTAKE_H_

// ShardIntake: the Q, K and V row targets of one Execute stream's shard, or
// the K and V targets of one context piece (its Q target default-constructed,
// taking no rows), fed by that stream and by any AttachRows streams at once.
// Each message's rows are checked and claimed under a lock, then converted
// outside it, so several streams copy in parallel. Close refuses later rows
// and waits for the copies in flight, after which the targets are stable.
// Thread-safe.

#include <array>
#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "core/dtype.h"
#include "ringattn/v1/worker.pb.h"
#include "worker/shard_rows.h"

namespace ringattn {

class ShardIntake {
 public:
  // Targets of Q, K and V in that order; rows arrive in `wire_dtype`.
  ShardIntake(std::array<ShardRowsTarget, 3> targets, DType wire_dtype);

  ShardIntake(const ShardIntake&) = delete;
  ShardIntake& operator=(const ShardIntake&) = delete;

  // Stores `rows` (ShardRowsTarget::Place). INVALID_ARGUMENT for a tensor
  // other than Q, K or V, one whose target takes no rows, and for what Place
  // refuses; FAILED_PRECONDITION
  // once closed. Returns the number of rows stored.
  absl::StatusOr<int64_t> Place(const v1::ShardRows& rows);

  // Refuses rows from now on and waits until none is being stored.
  void Close();

  // OK once every row arrived (call after Close while other streams may
  // still send); INVALID_ARGUMENT naming the first missing row otherwise.
  absl::Status CheckComplete() const;

  // The target of tensor 0 (Q), 1 (K) or 2 (V); stable after Close, or
  // while only one stream sends.
  const ShardRowsTarget& target(int tensor) const
      ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return targets_[tensor];
  }

 private:
  const DType wire_dtype_;
  mutable absl::Mutex mutex_;
  std::array<ShardRowsTarget, 3> targets_ ABSL_GUARDED_BY(mutex_);
  bool closed_ ABSL_GUARDED_BY(mutex_) = false;
  int storing_ ABSL_GUARDED_BY(mutex_) = 0;
};

}  // namespace ringattn

#endif  // RINGATTN_WORKER_SHARD_INTAKE_H_
