#include "worker/broadcast_executor.h"

#include <algorithm>
#include <cmath>
#include <new>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/dtype.h"
#include "core/ring_plan.h"
#include "core/status_macros.h"
#include "core/strategy_support.h"
#include "kernels/cpu/run_task.h"
#include "worker/cpu_kv_holding.h"
#include "worker/executor_memory.h"
#include "worker/task_flops.h"

namespace ringattn {
namespace {

ShardLayout AllQueries(int64_t q_len) {
  return ShardLayout::FromChunks(q_len, {{Range{0, q_len}}});
}

}  // namespace

absl::StatusOr<std::unique_ptr<BroadcastExecutor>> BroadcastExecutor::Create(
    const AttentionSpec& spec, int rank, int world_size,
    std::optional<ShardLayout> kv_layout, CpuKvHolding kv_holding) {
  RINGATTN_RETURN_IF_ERROR(spec.Validate());
  RINGATTN_RETURN_IF_ERROR(CheckCpuKvHolding(spec, kv_holding));
  RINGATTN_RETURN_IF_ERROR(CheckBroadcastQSupports(spec));
  RINGATTN_RETURN_IF_ERROR(CheckRank(rank, world_size));
  absl::StatusOr<ShardLayout> layout =
      KvLayoutFor(spec, world_size, std::move(kv_layout));
  if (!layout.ok()) return layout.status();
  kv_layout = std::move(*layout);
  const int64_t bytes =
      BytesNeeded(spec, rank, world_size, &*kv_layout, kv_holding);
  RINGATTN_RETURN_IF_ERROR(
      CheckExecutorBytes(bytes, rank, world_size, "all query rows"));
  return AllocateExecutor<BroadcastExecutor>(bytes, rank, [&] {
    return new BroadcastExecutor(spec, rank, std::move(*kv_layout), kv_holding);
  });
}

int64_t BroadcastExecutor::BytesNeeded(const AttentionSpec& spec, int rank,
                                       int world_size,
                                       const ShardLayout* kv_layout,
                                       CpuKvHolding kv_holding) {
  // In double, so that absurd shapes saturate instead of overflowing.
  const double kv_rows = static_cast<double>(
      kv_layout != nullptr
          ? kv_layout->ShardLength(rank)
          : LayoutFor(spec, spec.kv_len, world_size).ShardLength(rank));
  const double batch = static_cast<double>(spec.batch);
  const double q_values = batch * spec.q_len * spec.q_heads * spec.head_dim;
  const double lse_values = batch * spec.q_len * spec.q_heads;
  const double kv_values = 2 * batch * kv_rows * spec.kv_heads * spec.head_dim;
  // Q, O and the LSE; the own K/V; the kernels' scratch (at most one more O
  // and LSE).
  const double bytes = sizeof(float) * (3 * q_values + 2 * lse_values) +
                       kv_holding.OwnBytes(kv_values);
  return SaturatedBytes(bytes);
}

BroadcastExecutor::BroadcastExecutor(const AttentionSpec& spec, int rank,
                                     ShardLayout kv_layout,
                                     CpuKvHolding kv_holding)
    : spec_(spec),
      rank_(rank),
      q_layout_(AllQueries(spec.q_len)),
      kv_layout_(std::move(kv_layout)),
      plan_(RingPlan::Build(spec, q_layout_, WorldOfOne(kv_layout_, rank),
                            /*blocks=*/nullptr)),
      kv_(kv_holding, Shape{spec.batch, kv_layout_.ShardLength(rank),
                            spec.kv_heads, spec.head_dim}) {
  const Shape q_shape{spec.batch, spec.q_len, spec.q_heads, spec.head_dim};
  q_ = Tensor<float>(q_shape);
  o_ = Tensor<float>(q_shape);
  lse_ = Tensor<float>(Shape{q_shape.batch, q_shape.seq, q_shape.heads, 1});
  std::fill(lse_.values().begin(), lse_.values().end(), -INFINITY);
}

absl::StatusOr<RingOutput> BroadcastExecutor::Run(
    const std::atomic<bool>* cancelled) {
  if (ran_) {
    return absl::FailedPreconditionError("a broadcast executor runs only once");
  }
  ran_ = true;
  RingRunStats stats;
  stats.peak_bytes = BytesNeeded(spec_, rank_, kv_layout_.num_workers(),
                                 &kv_layout_, kv_.holding());
  stats.steps = 1;
  const absl::Time start = absl::Now();
  absl::StatusOr<std::pair<KvView, KvView>> kv = kv_.Views();
  if (!kv.ok()) return kv.status();
  const WorkerBuffers buffers{q_.view(), kv->first,   kv->second,
                              o_.view(), lse_.view(), &task_scratch_};
  for (const AttentionTask& task : plan_.Step(0, 0).tasks) {
    if (cancelled != nullptr && cancelled->load()) {
      return absl::CancelledError(absl::StrCat(
          "rank ", rank_, " was cancelled during broadcast-Q attention"));
    }
    stats.launches.Add(
        RunAttentionTask(spec_, /*blocks=*/nullptr, task, buffers));
    stats.flops += TaskFlops(spec_, /*blocks=*/nullptr, task);
    ++stats.tasks;
  }
  FinishAttention(spec_, o_.view());
  stats.compute_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  RingOutput output;
  output.o = TypedTensor(std::move(o_));
  output.lse = std::move(lse_);
  output.stats = stats;
  return output;
}

}  // namespace ringattn
