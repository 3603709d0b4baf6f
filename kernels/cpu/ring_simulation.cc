#include "kernels/cpu/ring_simulation.h"

#include <cmath>
#include <numeric>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/block_mask.h"
#include "core/hilbert.h"
#include "core/ring_plan.h"
#include "core/shard_layout.h"
#include "core/status_macros.h"
#include "kernels/cpu/run_task.h"

namespace ringattn {
namespace {

absl::Status CheckShape(const char* name, const Shape& got, const Shape& want) {
  if (got == want) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "tensor '", name, "' has shape [", got.batch, ", ", got.seq, ", ",
      got.heads, ", ", got.dim, "] but the spec needs [", want.batch, ", ",
      want.seq, ", ", want.heads, ", ", want.dim, "]"));
}

// The rows of `full` at the positions `chunks` cover, in chunk order; with
// `order`, the position t is the caller's row order[t].
Tensor<float> GatherShard(View<const float> full,
                          const std::vector<Range>& chunks,
                          const std::vector<int64_t>& order) {
  Shape shape = full.shape();
  shape.seq = 0;
  for (const Range& c : chunks) shape.seq += c.size();
  Tensor<float> shard(shape);
  int64_t row = 0;
  for (const Range& c : chunks) {
    for (int64_t t = c.begin; t < c.end; ++t, ++row) {
      CopyView(full.Slice(order[t], order[t] + 1),
               shard.view().Slice(row, row + 1));
    }
  }
  return shard;
}

void ScatterShard(View<const float> shard, const std::vector<Range>& chunks,
                  const std::vector<int64_t>& order, View<float> full) {
  int64_t row = 0;
  for (const Range& c : chunks) {
    for (int64_t t = c.begin; t < c.end; ++t, ++row) {
      CopyView(shard.Slice(row, row + 1), full.Slice(order[t], order[t] + 1));
    }
  }
}

// The state of one simulated worker.
struct Worker {
  Tensor<float> q;
  Tensor<float> o;
  Tensor<float> lse;
  int64_t held_owner = -1;  // whose K/V block this worker holds, -1 if none
  Tensor<float> k;
  Tensor<float> v;
};

}  // namespace

absl::StatusOr<AttentionOutput> SimulateRing(const AttentionSpec& spec,
                                             View<const float> q,
                                             View<const float> k,
                                             View<const float> v,
                                             int64_t workers) {
  RINGATTN_RETURN_IF_ERROR(spec.Validate());
  if (workers < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("workers must be >= 1, got ", workers));
  }
  const Shape q_shape{spec.batch, spec.q_len, spec.q_heads, spec.head_dim};
  const Shape kv_shape{spec.batch, spec.kv_len, spec.kv_heads, spec.head_dim};
  RINGATTN_RETURN_IF_ERROR(CheckShape("q", q.shape(), q_shape));
  RINGATTN_RETURN_IF_ERROR(CheckShape("k", k.shape(), kv_shape));
  RINGATTN_RETURN_IF_ERROR(CheckShape("v", v.shape(), kv_shape));

  std::vector<int64_t> q_order(spec.q_len), kv_order(spec.kv_len);
  std::iota(q_order.begin(), q_order.end(), 0);
  std::iota(kv_order.begin(), kv_order.end(), 0);
  if (spec.hilbert.has_value()) {
    q_order = kv_order =
        HilbertOrder(spec.hilbert->height, spec.hilbert->width);
  }
  std::optional<BlockMask> blocks;
  if (spec.block_sparse.has_value()) {
    blocks = BlockMask::FromRules(*spec.block_sparse, spec.kv_len);
  }
  const ShardLayout q_layout = QueryLayoutFor(spec, workers);
  const ShardLayout kv_layout = LayoutFor(spec, spec.kv_len, workers);
  const RingPlan plan =
      RingPlan::Build(spec, q_layout, kv_layout, blocks ? &*blocks : nullptr);

  AttentionOutput out;
  out.stats.num_steps = plan.num_steps();
  out.stats.num_transfers = plan.NumTransfers();
  out.stats.num_tasks = plan.NumTasks();
  std::vector<Worker> state(static_cast<size_t>(workers));
  int64_t largest_block = 0;
  for (int64_t i = 0; i < workers; ++i) {
    Worker& w = state[i];
    w.q = GatherShard(q, q_layout.Chunks(i), q_order);
    w.k = GatherShard(k, kv_layout.Chunks(i), kv_order);
    w.v = GatherShard(v, kv_layout.Chunks(i), kv_order);
    w.held_owner = i;
    w.o = Tensor<float>(w.q.shape());
    Shape lse_shape = w.q.shape();
    lse_shape.dim = 1;
    w.lse = Tensor<float>(lse_shape);
    std::fill(w.lse.values().begin(), w.lse.values().end(), -INFINITY);
    largest_block = std::max(largest_block, w.k.shape().seq);
  }
  for (int64_t i = 0; i < workers; ++i) {
    // Its query shard, its accumulator rows, and two K/V blocks (double
    // buffer).
    out.stats.peak_rows_per_worker =
        std::max(out.stats.peak_rows_per_worker,
                 2 * state[i].q.shape().seq + 2 * 2 * largest_block);
  }

  std::vector<float> scratch;  // task results; workers take turns
  for (int64_t s = 0; s < plan.num_steps(); ++s) {
    for (int64_t i = 0; i < workers; ++i) {
      const RingStep& step = plan.Step(i, s);
      Worker& w = state[i];
      if (!step.tasks.empty() && w.held_owner != step.kv_owner) {
        return absl::InternalError(absl::StrCat(
            "ring plan: worker ", i, " at step ", s, " needs the block of ",
            step.kv_owner, " but holds ", w.held_owner));
      }
      const WorkerBuffers buffers{w.q.view(), w.k.view(),   w.v.view(),
                                  w.o.view(), w.lse.view(), &scratch};
      for (const AttentionTask& task : step.tasks) {
        RunAttentionTask(spec, blocks ? &*blocks : nullptr, task, buffers);
      }
    }
    // Hand blocks along the rings.
    for (int64_t i = 0; i < workers; ++i) {
      const int64_t next = plan.Next(i);
      if (plan.Step(i, s).send != plan.Step(next, s).receive) {
        return absl::InternalError(
            absl::StrCat("ring plan: worker ", i, " send and worker ", next,
                         " receive disagree at step ", s));
      }
    }
    std::vector<std::pair<int64_t, std::pair<Tensor<float>, Tensor<float>>>>
        incoming(static_cast<size_t>(workers));
    for (int64_t i = 0; i < workers; ++i) {
      const int64_t next = plan.Next(i);
      incoming[next].first = -1;
      if (plan.Step(i, s).send) {
        incoming[next] = {state[i].held_owner,
                          {std::move(state[i].k), std::move(state[i].v)}};
      }
    }
    for (int64_t i = 0; i < workers; ++i) {
      state[i].held_owner = incoming[i].first;
      state[i].k = std::move(incoming[i].second.first);
      state[i].v = std::move(incoming[i].second.second);
    }
  }

  out.o = Tensor<float>(q_shape);
  Shape lse_shape = q_shape;
  lse_shape.dim = 1;
  out.lse = Tensor<float>(lse_shape);
  for (int64_t i = 0; i < workers; ++i) {
    FinishAttention(spec, state[i].o.view());
    ScatterShard(state[i].o.view(), q_layout.Chunks(i), q_order, out.o.view());
    ScatterShard(state[i].lse.view(), q_layout.Chunks(i), q_order,
                 out.lse.view());
  }
  return out;
}

}  // namespace ringattn
