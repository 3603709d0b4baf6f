#ifndef RINGATTN_WORKER_PASS_Q_EXECUTOR_H_
#define RINGATTN_WORKER_PASS_Q_EXECUTOR_H_

// PassQExecutor: one rank's part of pass-Q ring attention for one request.
// Every rank keeps its own K/V shard in place; query blocks travel the ring
// instead, each with its running fp32 output and LSE. At step s rank r holds
// the block of owner (r - s) mod p, computes it against its own K/V with the
// tasks the ring plan gives the pair (query shard of the owner, key shard of
// r), merges them into the block's accumulators, then sends the block on to
// r + 1 while receiving the next one from r - 1 (two buffers). After p steps
// every block is back with its owner, which returns its rows exactly as a
// RingExecutor does. A block's accumulators must be up to date before it
// leaves, so a step's transfers follow its computation rather than overlap
// it. Memory is O(N / p) and allocated once, up front. Thread-compatible; not
// copyable.

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/attention_spec.h"
#include "core/block_mask.h"
#include "core/dtype.h"
#include "core/ring_plan.h"
#include "core/shard_layout.h"
#include "core/tensor.h"
#include "core/typed_tensor.h"
#include "worker/communicator.h"
#include "worker/cpu_kv_holding.h"
#include "worker/ring_executor.h"

namespace ringattn {

class PassQExecutor {
 public:
  // An executor for rank `rank` of `world_size`, its buffers allocated. Q is
  // sharded as the spec's usual layout; K/V likewise, or as `kv_layout` when
  // given (a resident context's pieces); K and V are held as `kv_holding`
  // says. INVALID_ARGUMENT for a bad spec, rank, world size, layout or K/V
  // holding; RESOURCE_EXHAUSTED if the buffers cannot be had.
  static absl::StatusOr<std::unique_ptr<PassQExecutor>> Create(
      const AttentionSpec& spec, int rank, int world_size,
      std::optional<ShardLayout> kv_layout = std::nullopt,
      CpuKvHolding kv_holding = {});

  // The bytes an executor for this rank holds (what Create allocates plus the
  // kernels' scratch). Requires a valid spec and 0 <= rank < world_size.
  static int64_t BytesNeeded(const AttentionSpec& spec, int rank,
                             int world_size,
                             const ShardLayout* kv_layout = nullptr,
                             CpuKvHolding kv_holding = {});

  PassQExecutor(const PassQExecutor&) = delete;
  PassQExecutor& operator=(const PassQExecutor&) = delete;

  // Which positions (in masking order) each rank holds.
  const ShardLayout& q_layout() const { return q_layout_; }
  const ShardLayout& kv_layout() const { return kv_layout_; }

  // Where the caller loads the rank's shard before Run: Q rows of
  // q_layout().Chunks(rank) in fp32, K and V rows of kv_layout().Chunks(rank)
  // in the K/V dtype (empty for resident rows), in chunk order ([B, n, H,
  // D]). Valid until Run.
  View<float> q() { return BlockQueries(front_, rank_); }
  TypedView k() { return kv_.k(); }
  TypedView v() { return kv_.v(); }

  // For an executor made to read resident rows: the K and V rows of
  // kv_layout().Chunks(rank), read where they lie. FAILED_PRECONDITION for
  // another executor, INVALID_ARGUMENT for rows of another shape.
  absl::Status UseResidentRows(ResidentRows rows) {
    return kv_.UseResidentRows(std::move(rows));
  }

  // Runs the ring over `communicator` (rank and world size must match) and
  // returns this rank's output rows in the order of q_layout().Chunks(rank).
  // Once only: FAILED_PRECONDITION after that. Errors: what the communicator
  // reports (DEADLINE_EXCEEDED, UNAVAILABLE, CANCELLED), CANCELLED if
  // options.cancelled was set.
  absl::StatusOr<RingOutput> Run(RingCommunicator& communicator,
                                 const RingOptions& options);

 private:
  PassQExecutor(const AttentionSpec& spec, int rank, int world_size,
                ShardLayout kv_layout, CpuKvHolding kv_holding);

  // Rows, values and bytes of the travelling block of `owner`: its Q, O and
  // LSE, one after the other.
  int64_t BlockRows(int64_t owner) const;
  int64_t BlockValues(int64_t owner) const;
  int64_t BlockBytes(int64_t owner) const;
  // The parts of the block of `owner` stored at `buffer`.
  View<float> BlockQueries(float* buffer, int64_t owner) const;
  View<float> BlockOutput(float* buffer, int64_t owner) const;
  View<float> BlockLse(float* buffer, int64_t owner) const;
  // Stops at a cancellation: aborts the communicator, waits out what is in
  // flight (so no transfer outlives the buffers) and returns CANCELLED.
  absl::Status Cancel(RingCommunicator& communicator, bool in_flight,
                      int64_t step);

  const AttentionSpec spec_;
  const int rank_;
  const int world_size_;
  const ShardLayout q_layout_;
  const ShardLayout kv_layout_;
  const std::optional<BlockMask> blocks_;
  // tasks_[owner]: the query shard of `owner` against this rank's K/V.
  std::vector<std::vector<AttentionTask>> tasks_;

  // fp32, filled by the caller: not zeroed (as RingExecutor's blocks).
  CpuKvRows kv_;
  std::vector<float> task_scratch_;  // one task's partial result
  // Two travelling blocks of the largest size: [front | back].
  std::unique_ptr<float[]> block_storage_;
  float* front_ = nullptr;
  float* back_ = nullptr;
  bool ran_ = false;
};

}  // namespace ringattn

#endif  // RINGATTN_WORKER_PASS_Q_EXECUTOR_H_
