#ifndef RINGATTN_CORE_RING_PLAN_H_
#define RINGATTN_CORE_RING_PLAN_H_

// RingPlan: what every worker computes and sends at every step of pass-KV ring
// attention. Workers form rings (usually one of all p workers); at step s
// worker i holds the K/V block of the worker s places before it in its ring,
// computes its query chunks against that block's chunks (fully masked pairs are
// left out), and forwards the block to the next worker only if someone further
// along still needs it. The ring stops after the last step anybody needs: a
// dilated pattern whose segments fit in one shard needs no ring traffic, and a
// segment spanning k shards rings only among those k workers. Immutable; safe
// to share between threads.

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "core/attention_spec.h"
#include "core/block_mask.h"
#include "core/range.h"
#include "core/shard_layout.h"

namespace ringattn {

enum class TaskKind {
  kFull,         // every key visible to every query
  kCausal,       // causal, partly masked (a diagonal block)
  kBlockSparse,  // block-sparse mask (and causal if the spec is causal)
  kDilated,      // one dilated branch (and causal if the spec is causal)
};

// One (query chunk, key chunk) pair to compute.
struct AttentionTask {
  Range q;            // global query positions
  int64_t q_row = 0;  // local row of q.begin in this worker's query shard
  Range k;            // global key positions
  int64_t k_row = 0;  // row of k.begin in the held K/V block
  TaskKind kind = TaskKind::kFull;
  int64_t branch = -1;  // the dilated branch, for kDilated
};

struct RingStep {
  int64_t kv_owner = 0;  // whose K/V block is held at this step; -1: none
  std::vector<AttentionTask> tasks;
  bool send = false;     // forward the held block to worker + 1 after this step
  bool receive = false;  // take the next block from worker - 1 after this step
};

class RingPlan {
 public:
  // `blocks` must be set iff spec.block_sparse is; it must outlive nothing here
  // (the plan copies what it needs). q_layout covers spec.q_len, kv_layout
  // spec.kv_len, both over the same number of workers.
  static RingPlan Build(const AttentionSpec& spec, const ShardLayout& q_layout,
                        const ShardLayout& kv_layout, const BlockMask* blocks);

  int64_t num_workers() const { return static_cast<int64_t>(steps_.size()); }
  // The worker that worker `worker` sends blocks to, and the one it receives
  // from. Rings may be shorter than all workers (dilated segments that span
  // only a few shards).
  int64_t Next(int64_t worker) const { return next_[worker]; }
  int64_t Previous(int64_t worker) const { return previous_[worker]; }
  int64_t num_steps() const { return num_steps_; }
  const RingStep& Step(int64_t worker, int64_t step) const {
    return steps_[worker][step];
  }
  // Total K/V block transfers over the whole ring.
  int64_t NumTransfers() const;
  // Total number of tasks over all workers and steps.
  int64_t NumTasks() const;
  // Pass-Q's view of the plan: for every worker w, the tasks of w's query
  // shard against the K/V block of `kv_owner` (q_row local to w's shard,
  // k_row to kv_owner's block), in plan order; empty where none are needed.
  std::vector<std::vector<AttentionTask>> TasksAgainstBlock(
      int64_t kv_owner) const;

 private:
  int64_t num_steps_ = 0;
  std::vector<std::vector<RingStep>> steps_;  // [worker][step]
  std::vector<int64_t> next_;
  std::vector<int64_t> previous_;
};

// The layout that balances a spec's work: zigzag for causal attention without
// dilated branches (whose segments want to stay whole), contiguous otherwise.
ShardKind ChooseShardKind(const AttentionSpec& spec);

// OK if `rank` is a rank of a world of `world_size` workers; INVALID_ARGUMENT
// saying which bound it breaks otherwise.
absl::Status CheckRank(int64_t rank, int64_t world_size);

// `seq_len` positions of a request under `spec` spread over `workers` workers
// in the layout ChooseShardKind picks.
ShardLayout LayoutFor(const AttentionSpec& spec, int64_t seq_len,
                      int64_t workers);

// The query layout of a request on `workers` workers. Zigzag balances causal
// work only where queries and keys are of comparable length: a short causal
// batch against a long context (q_len * kShortQueryRatio <= kv_len, so every
// row sees nearly every key) is laid out contiguously instead, which keeps
// each worker's rows one run and lets a task read a K/V block once.
inline constexpr int64_t kShortQueryRatio = 64;
ShardLayout QueryLayoutFor(const AttentionSpec& spec, int64_t workers);

// The K/V layout of a request on `workers` workers: `explicit_layout` if given
// (a resident context's pieces; INVALID_ARGUMENT unless it partitions
// spec.kv_len over that many workers), else LayoutFor(spec, spec.kv_len,
// workers).
absl::StatusOr<ShardLayout> KvLayoutFor(
    const AttentionSpec& spec, int64_t workers,
    std::optional<ShardLayout> explicit_layout);

// Rank `rank`'s chunks of `layout` as the only worker of a world of one: the
// keys a broadcast-Q rank computes against, in global positions. Not a
// partition of the sequence (other ranks hold the rest), so it does not pass
// ShardLayout::Validate.
ShardLayout WorldOfOne(const ShardLayout& layout, int rank);

}  // namespace ringattn

#endif  // RINGATTN_CORE_RING_PLAN_H_
