#ifndef RINGATTN_WORKER_BROADCAST_EXECUTOR_H_
#define RINGATTN_WORKER_BROADCAST_EXECUTOR_H_

// BroadcastExecutor: one rank's part of broadcast-Q attention for one request.
// The rank holds every query row and only its own K/V shard, and computes the
// partial attention of all queries against that shard (causal masks in global
// positions) with no communication at all; the coordinator merges the ranks'
// partial (O, LSE) by log-sum-exp. Dense, causal and GQA specs only. K and V
// are held as CpuKvHolding says: in fp32 or bf16 buffers of its own, or read
// where a resident context holds them.
// Thread-compatible; not copyable.

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/attention_spec.h"
#include "core/dtype.h"
#include "core/ring_plan.h"
#include "core/shard_layout.h"
#include "core/tensor.h"
#include "core/typed_tensor.h"
#include "worker/cpu_kv_holding.h"
#include "worker/ring_executor.h"

namespace ringattn {

class BroadcastExecutor {
 public:
  // An executor for rank `rank` of `world_size`, its buffers allocated. K/V
  // are sharded as the spec's usual layout, or as `kv_layout` when given (a
  // resident context's pieces). INVALID_ARGUMENT for a bad spec, rank, world
  // size, layout or K/V holding; UNIMPLEMENTED for a pattern broadcast-Q does
  // not run.
  static absl::StatusOr<std::unique_ptr<BroadcastExecutor>> Create(
      const AttentionSpec& spec, int rank, int world_size,
      std::optional<ShardLayout> kv_layout = std::nullopt,
      CpuKvHolding kv_holding = {});

  // The bytes an executor for this rank holds (buffers plus kernel scratch).
  static int64_t BytesNeeded(const AttentionSpec& spec, int rank,
                             int world_size,
                             const ShardLayout* kv_layout = nullptr,
                             CpuKvHolding kv_holding = {});

  BroadcastExecutor(const BroadcastExecutor&) = delete;
  BroadcastExecutor& operator=(const BroadcastExecutor&) = delete;

  // Every query position, held by rank 0 of a world of one.
  const ShardLayout& q_layout() const { return q_layout_; }
  // Which K/V positions each rank of the request holds.
  const ShardLayout& kv_layout() const { return kv_layout_; }

  // Where the caller loads the inputs before Run: all Q rows in fp32, and the
  // K and V rows of kv_layout().Chunks(rank) in chunk order, in the K/V dtype
  // (empty for resident rows).
  View<float> q() { return q_.view(); }
  TypedView k() { return kv_.k(); }
  TypedView v() { return kv_.v(); }

  // For an executor made to read resident rows: the K and V rows of
  // kv_layout().Chunks(rank), read where they lie. FAILED_PRECONDITION for
  // another executor, INVALID_ARGUMENT for rows of another shape.
  absl::Status UseResidentRows(ResidentRows rows) {
    return kv_.UseResidentRows(std::move(rows));
  }

  // Computes the partial output of every query row over this rank's keys
  // (rows that see none: O = 0, LSE = -inf). Once only: FAILED_PRECONDITION
  // after that; CANCELLED once `cancelled` (if set) turns true.
  absl::StatusOr<RingOutput> Run(const std::atomic<bool>* cancelled);

 private:
  BroadcastExecutor(const AttentionSpec& spec, int rank, ShardLayout kv_layout,
                    CpuKvHolding kv_holding);

  const AttentionSpec spec_;
  const int rank_;
  const ShardLayout q_layout_;
  const ShardLayout kv_layout_;
  // A world of one: all queries against this rank's own K/V chunks.
  const RingPlan plan_;

  Tensor<float> q_;
  // Uninitialized until loaded (every row is): no zero-filling of a long
  // context's copy on each query.
  CpuKvRows kv_;
  Tensor<float> o_;
  Tensor<float> lse_;
  std::vector<float> task_scratch_;  // one task's partial result
  bool ran_ = false;
};

}  // namespace ringattn

#endif  // RINGATTN_WORKER_BROADCAST_EXECUTOR_H_
