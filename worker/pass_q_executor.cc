#include "worker/pass_q_executor.h"

#include <algorithm>
#include <cmath>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "core/status_macros.h"
#include "kernels/cpu/run_task.h"
#include "worker/cpu_kv_holding.h"
#include "worker/executor_memory.h"
#include "worker/task_flops.h"

namespace ringattn {
namespace {

double SecondsSince(absl::Time start) {
  return absl::ToDoubleSeconds(absl::Now() - start);
}

int64_t Modulo(int64_t x, int64_t m) { return ((x % m) + m) % m; }

}  // namespace

absl::StatusOr<std::unique_ptr<PassQExecutor>> PassQExecutor::Create(
    const AttentionSpec& spec, int rank, int world_size,
    std::optional<ShardLayout> kv_layout, CpuKvHolding kv_holding) {
  RINGATTN_RETURN_IF_ERROR(spec.Validate());
  RINGATTN_RETURN_IF_ERROR(CheckRank(rank, world_size));
  RINGATTN_RETURN_IF_ERROR(CheckCpuKvHolding(spec, kv_holding));
  absl::StatusOr<ShardLayout> layout =
      KvLayoutFor(spec, world_size, std::move(kv_layout));
  if (!layout.ok()) return layout.status();
  const int64_t bytes =
      BytesNeeded(spec, rank, world_size, &*layout, kv_holding);
  RINGATTN_RETURN_IF_ERROR(
      CheckExecutorBytes(bytes, rank, world_size, "its share"));
  return AllocateExecutor<PassQExecutor>(bytes, rank, [&] {
    return new PassQExecutor(spec, rank, world_size, std::move(*layout),
                             kv_holding);
  });
}

int64_t PassQExecutor::BytesNeeded(const AttentionSpec& spec, int rank,
                                   int world_size, const ShardLayout* kv_layout,
                                   CpuKvHolding kv_holding) {
  // In double, so that absurd shapes saturate instead of overflowing.
  const ShardLayout q_layout = QueryLayoutFor(spec, world_size);
  const double batch = static_cast<double>(spec.batch);
  const double row_values = batch * spec.q_heads * (spec.head_dim + 1);
  const double own_rows = static_cast<double>(q_layout.ShardLength(rank));
  const double largest_rows = static_cast<double>(q_layout.LargestShard());
  const double kv_rows = static_cast<double>(
      (kv_layout != nullptr ? *kv_layout
                            : LayoutFor(spec, spec.kv_len, world_size))
          .ShardLength(rank));
  // Two travelling blocks (Q, O and LSE each); the rank's K and V; its output
  // O and LSE; the kernels' scratch (at most one more O and LSE of a block).
  const double block_values =
      batch * largest_rows * spec.q_heads * spec.head_dim +
      largest_rows * row_values;
  const double values =
      2 * block_values + own_rows * row_values + largest_rows * row_values;
  const double kv_values = 2 * batch * kv_rows * spec.kv_heads * spec.head_dim;
  return SaturatedBytes(sizeof(float) * values +
                        kv_holding.OwnBytes(kv_values));
}

PassQExecutor::PassQExecutor(const AttentionSpec& spec, int rank,
                             int world_size, ShardLayout kv_layout,
                             CpuKvHolding kv_holding)
    : spec_(spec),
      rank_(rank),
      world_size_(world_size),
      q_layout_(QueryLayoutFor(spec, world_size)),
      kv_layout_(std::move(kv_layout)),
      blocks_(BlockMask::ForSpec(spec)),
      kv_(kv_holding, Shape{spec.batch, kv_layout_.ShardLength(rank),
                            spec.kv_heads, spec.head_dim}) {
  // The plan lists, for every query shard, its tasks against every K/V block;
  // this rank keeps those against its own.
  tasks_ = RingPlan::Build(spec, q_layout_, kv_layout_,
                           blocks_.has_value() ? &*blocks_ : nullptr)
               .TasksAgainstBlock(rank);
  int64_t largest = 0;
  for (int64_t owner = 0; owner < world_size; ++owner) {
    largest = std::max(largest, BlockValues(owner));
  }
  block_storage_.reset(new float[2 * largest]);
  front_ = block_storage_.get();
  back_ = block_storage_.get() + largest;
  // The rank's own block starts with O = 0 and LSE = -inf.
  View<float> o = BlockOutput(front_, rank);
  std::fill(o.data(), o.data() + o.shape().NumElements(), 0.0f);
  View<float> lse = BlockLse(front_, rank);
  std::fill(lse.data(), lse.data() + lse.shape().NumElements(), -INFINITY);
}

int64_t PassQExecutor::BlockRows(int64_t owner) const {
  return q_layout_.ShardLength(owner);
}

int64_t PassQExecutor::BlockValues(int64_t owner) const {
  return spec_.batch * BlockRows(owner) * spec_.q_heads *
         (2 * spec_.head_dim + 1);
}

int64_t PassQExecutor::BlockBytes(int64_t owner) const {
  return static_cast<int64_t>(sizeof(float)) * BlockValues(owner);
}

View<float> PassQExecutor::BlockQueries(float* buffer, int64_t owner) const {
  return View<float>(buffer, Shape{spec_.batch, BlockRows(owner), spec_.q_heads,
                                   spec_.head_dim});
}

View<float> PassQExecutor::BlockOutput(float* buffer, int64_t owner) const {
  const Shape shape{spec_.batch, BlockRows(owner), spec_.q_heads,
                    spec_.head_dim};
  return View<float>(buffer + shape.NumElements(), shape);
}

View<float> PassQExecutor::BlockLse(float* buffer, int64_t owner) const {
  const Shape shape{spec_.batch, BlockRows(owner), spec_.q_heads,
                    spec_.head_dim};
  return View<float>(buffer + 2 * shape.NumElements(),
                     Shape{spec_.batch, BlockRows(owner), spec_.q_heads, 1});
}

absl::Status PassQExecutor::Cancel(RingCommunicator& communicator,
                                   bool in_flight, int64_t step) {
  AbortRing(communicator, in_flight);
  return absl::CancelledError(
      absl::StrCat("rank ", rank_, " was cancelled at pass-Q step ", step));
}

absl::StatusOr<RingOutput> PassQExecutor::Run(RingCommunicator& communicator,
                                              const RingOptions& options) {
  if (ran_) {
    return absl::FailedPreconditionError("a pass-Q executor runs only once");
  }
  ran_ = true;
  absl::StatusOr<std::pair<KvView, KvView>> kv = kv_.Views();
  if (!kv.ok()) return kv.status();
  RINGATTN_RETURN_IF_ERROR(
      CheckCommunicatorRank(communicator, rank_, world_size_));
  const BlockMask* blocks = blocks_.has_value() ? &*blocks_ : nullptr;
  const int64_t p = world_size_;
  const int next = static_cast<int>(Modulo(rank_ + 1, p));
  const int previous = static_cast<int>(Modulo(rank_ - 1, p));
  RingRunStats stats;
  stats.peak_bytes =
      BytesNeeded(spec_, rank_, world_size_, &kv_layout_, kv_.holding());
  stats.steps = p;
  // At step s the front buffer holds the block of rank - s; after the last
  // step's transfer the rank's own block is back.
  for (int64_t s = 0; s < p; ++s) {
    const int64_t held = Modulo(rank_ - s, p);
    const int64_t incoming = Modulo(rank_ - s - 1, p);
    bool in_flight = false;
    // A world of one has nowhere to send; an empty block needs no transfer.
    if (p > 1 && BlockBytes(incoming) > 0) {
      RINGATTN_RETURN_IF_ERROR(
          communicator.StartReceive(back_, BlockBytes(incoming), previous));
      in_flight = true;
    }
    const absl::Time compute_start = absl::Now();
    const WorkerBuffers buffers{BlockQueries(front_, held),
                                kv->first,
                                kv->second,
                                BlockOutput(front_, held),
                                BlockLse(front_, held),
                                &task_scratch_};
    for (const AttentionTask& task : tasks_[held]) {
      if (options.cancelled != nullptr && options.cancelled->load()) {
        return Cancel(communicator, in_flight, s);
      }
      stats.launches.Add(RunAttentionTask(spec_, blocks, task, buffers));
      stats.flops += TaskFlops(spec_, blocks, task);
      ++stats.tasks;
    }
    stats.compute_seconds += SecondsSince(compute_start);
    if (options.cancelled != nullptr && options.cancelled->load()) {
      return Cancel(communicator, in_flight, s);
    }
    // Only now are the block's accumulators complete for this rank's keys.
    if (p > 1 && BlockBytes(held) > 0) {
      RINGATTN_RETURN_IF_ERROR(
          communicator.StartSend(front_, BlockBytes(held), next));
      in_flight = true;
      ++stats.transfers;
      stats.bytes_sent += BlockBytes(held);
    }
    if (in_flight) {
      const absl::Time wait_start = absl::Now();
      RINGATTN_RETURN_IF_ERROR(communicator.Wait(
          std::min(wait_start + options.step_timeout, options.deadline)));
      stats.wait_seconds += SecondsSince(wait_start);
    }
    if (p > 1) std::swap(front_, back_);
  }
  RingOutput output;
  Tensor<float> o(BlockOutput(front_, rank_).shape());
  CopyView<float>(BlockOutput(front_, rank_), o.view());
  FinishAttention(spec_, o.view());
  output.o = TypedTensor(std::move(o));
  output.lse = Tensor<float>(BlockLse(front_, rank_).shape());
  CopyView<float>(BlockLse(front_, rank_), output.lse.view());
  output.stats = stats;
  return output;
}

}  // namespace ringattn
