#ifndef RINGATTN_WORKER_BROADCAST_EXECUTOR_H_
#define RINGATTN_WORKER_BROADCAST_EXECUTOR_H_

// BroadcastExecutor: one rank's part of broadcast-Q attention for one request.
// The rank holds every query row and only its own K/V shard, and computes the
// partial attention of all queries against that shard (causal masks in global
// positions) with no communication at all; the coordinator merges the ranks'
// partial (O, LSE) by log-sum-exp. Dense, causal and GQA specs only. K and V
// are held in fp32 or in bf16 (a resident context held in bf16 is read at its
// own width).
// Thread-compatible; not copyable.

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/attention_spec.h"
#include "core/dtype.h"
#include "core/ring_plan.h"
#include "core/shard_layout.h"
#include "core/tensor.h"
#include "core/typed_tensor.h"
#include "worker/ring_executor.h"

namespace ringattn {

class BroadcastExecutor {
 public:
  // An executor for rank `rank` of `world_size`, its buffers allocated. K/V
  // are sharded as the spec's usual layout, or as `kv_layout` when given (a
  // resident context's pieces). INVALID_ARGUMENT for a bad spec, rank, world
  // size, layout or K/V dtype (fp32 or bf16); UNIMPLEMENTED for a pattern
  // broadcast-Q does not run.
  static absl::StatusOr<std::unique_ptr<BroadcastExecutor>> Create(
      const AttentionSpec& spec, int rank, int world_size,
      std::optional<ShardLayout> kv_layout = std::nullopt,
      DType kv_dtype = DType::kFloat32);

  // The bytes an executor for this rank holds (buffers plus kernel scratch).
  static int64_t BytesNeeded(const AttentionSpec& spec, int rank,
                             int world_size,
                             const ShardLayout* kv_layout = nullptr,
                             DType kv_dtype = DType::kFloat32);

  BroadcastExecutor(const BroadcastExecutor&) = delete;
  BroadcastExecutor& operator=(const BroadcastExecutor&) = delete;

  // Every query position, held by rank 0 of a world of one.
  const ShardLayout& q_layout() const { return q_layout_; }
  // Which K/V positions each rank of the request holds.
  const ShardLayout& kv_layout() const { return kv_layout_; }

  // Where the caller loads the inputs before Run: all Q rows in fp32, and the
  // K and V rows of kv_layout().Chunks(rank) in chunk order, in the K/V dtype.
  View<float> q() { return q_.view(); }
  TypedView k() { return k_.view(); }
  TypedView v() { return v_.view(); }

  // Computes the partial output of every query row over this rank's keys
  // (rows that see none: O = 0, LSE = -inf). Once only: FAILED_PRECONDITION
  // after that; CANCELLED once `cancelled` (if set) turns true.
  absl::StatusOr<RingOutput> Run(const std::atomic<bool>* cancelled);

 private:
  BroadcastExecutor(const AttentionSpec& spec, int rank, ShardLayout kv_layout,
                    DType kv_dtype);

  const AttentionSpec spec_;
  const int rank_;
  const ShardLayout q_layout_;
  const ShardLayout kv_layout_;
  // A world of one: all queries against this rank's own K/V chunks.
  const RingPlan plan_;

  Tensor<float> q_;
  // Uninitialized until loaded (every row is): no zero-filling of a long
  // context's copy on each query.
  TypedTensor k_;
  TypedTensor v_;
  Tensor<float> o_;
  Tensor<float> lse_;
  std::vector<float> task_scratch_;  // one task's partial result
  bool ran_ = false;
};

}  // namespace ringattn

#endif  // RINGATTN_WORKER_BROADCAST_EXECUTOR_H_
