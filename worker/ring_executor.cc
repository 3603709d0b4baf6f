#include "worker/ring_executor.h"

#include <algorithm>
#include <cmath>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/ring_plan.h"
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

}  // namespace

absl::StatusOr<std::unique_ptr<RingExecutor>> RingExecutor::Create(
    const AttentionSpec& spec, int rank, int world_size,
    std::optional<ShardLayout> kv_layout, DType kv_dtype) {
  RINGATTN_RETURN_IF_ERROR(spec.Validate());
  RINGATTN_RETURN_IF_ERROR(CheckRank(rank, world_size));
  RINGATTN_RETURN_IF_ERROR(CheckCpuKvHolding(spec, CpuKvHolding{kv_dtype}));
  absl::StatusOr<ShardLayout> layout =
      KvLayoutFor(spec, world_size, std::move(kv_layout));
  if (!layout.ok()) return layout.status();
  kv_layout = std::move(*layout);
  const int64_t bytes =
      BytesNeeded(spec, rank, world_size, &*kv_layout, kv_dtype);
  RINGATTN_RETURN_IF_ERROR(
      CheckExecutorBytes(bytes, rank, world_size, "its share"));
  return AllocateExecutor<RingExecutor>(bytes, rank, [&] {
    return new RingExecutor(spec, rank, world_size, std::move(*kv_layout),
                            kv_dtype);
  });
}

int64_t RingExecutor::BytesNeeded(const AttentionSpec& spec, int rank,
                                  int world_size, const ShardLayout* kv_layout,
                                  DType kv_dtype) {
  // In double, so that absurd shapes saturate instead of overflowing.
  const double q_rows =
      static_cast<double>(QueryLayoutFor(spec, world_size).ShardLength(rank));
  const double block_rows = static_cast<double>(
      (kv_layout != nullptr ? *kv_layout
                            : LayoutFor(spec, spec.kv_len, world_size))
          .LargestShard());
  const double batch = static_cast<double>(spec.batch);
  const double q_values = batch * q_rows * spec.q_heads * spec.head_dim;
  const double lse_values = batch * q_rows * spec.q_heads;
  const double block_values =
      2 * batch * block_rows * spec.kv_heads * spec.head_dim;
  // Q, O and the LSE; two blocks; the kernels' scratch (at most one more O and
  // LSE).
  const double bytes = sizeof(float) * (3 * q_values + 2 * lse_values) +
                       CpuKvHolding{kv_dtype}.OwnBytes(2 * block_values);
  return SaturatedBytes(bytes);
}

RingExecutor::RingExecutor(const AttentionSpec& spec, int rank, int world_size,
                           ShardLayout kv_layout, DType kv_dtype)
    : spec_(spec),
      rank_(rank),
      world_size_(world_size),
      q_layout_(QueryLayoutFor(spec, world_size)),
      kv_layout_(std::move(kv_layout)),
      blocks_(BlockMask::ForSpec(spec)),
      plan_(RingPlan::Build(spec, q_layout_, kv_layout_,
                            blocks_.has_value() ? &*blocks_ : nullptr)),
      kv_dtype_(kv_dtype) {
  const Shape q_shape{spec.batch, q_layout_.ShardLength(rank), spec.q_heads,
                      spec.head_dim};
  q_ = TypedTensor(DType::kFloat32, q_shape);
  o_ = Tensor<float>(q_shape);
  lse_ = Tensor<float>(Shape{q_shape.batch, q_shape.seq, q_shape.heads, 1});
  std::fill(lse_.values().begin(), lse_.values().end(), -INFINITY);
  const size_t block_bytes = static_cast<size_t>(
      DTypeSize(kv_dtype) * 2 * spec.batch * kv_layout_.LargestShard() *
      spec.kv_heads * spec.head_dim);
  block_storage_.reset(new char[2 * block_bytes]);
  front_ = block_storage_.get();
  back_ = block_storage_.get() + block_bytes;
}

int64_t RingExecutor::BlockRows(int64_t owner) const {
  return kv_layout_.ShardLength(owner);
}

int64_t RingExecutor::BlockBytes(int64_t owner) const {
  return DTypeSize(kv_dtype_) * 2 * spec_.batch * BlockRows(owner) *
         spec_.kv_heads * spec_.head_dim;
}

TypedView RingExecutor::BlockKeys(char* buffer, int64_t owner) const {
  return TypedView(
      kv_dtype_, buffer,
      Shape{spec_.batch, BlockRows(owner), spec_.kv_heads, spec_.head_dim});
}

TypedView RingExecutor::BlockValues(char* buffer, int64_t owner) const {
  const TypedView keys = BlockKeys(buffer, owner);
  return TypedView(kv_dtype_, buffer + keys.bytes(), keys.shape());
}

absl::Status RingExecutor::Cancel(RingCommunicator& communicator,
                                  bool in_flight, int64_t step) {
  AbortRing(communicator, in_flight);
  return absl::CancelledError(
      absl::StrCat("rank ", rank_, " was cancelled at ring step ", step));
}

absl::StatusOr<RingOutput> RingExecutor::Run(RingCommunicator& communicator,
                                             const RingOptions& options) {
  if (ran_) {
    return absl::FailedPreconditionError("a ring executor runs only once");
  }
  ran_ = true;
  RINGATTN_RETURN_IF_ERROR(
      CheckCommunicatorRank(communicator, rank_, world_size_));
  const BlockMask* blocks = blocks_.has_value() ? &*blocks_ : nullptr;
  RingRunStats stats;
  stats.peak_bytes =
      BytesNeeded(spec_, rank_, world_size_, &kv_layout_, kv_dtype_);
  stats.steps = plan_.num_steps();
  int64_t held = rank_;  // whose block the front buffer holds
  for (int64_t s = 0; s < plan_.num_steps(); ++s) {
    const RingStep& step = plan_.Step(rank_, s);
    if ((!step.tasks.empty() || step.send) && held != step.kv_owner) {
      return absl::InternalError(
          absl::StrCat("ring plan: rank ", rank_, " at step ", s,
                       " needs the block of rank ", step.kv_owner,
                       " but holds that of rank ", held));
    }
    int64_t incoming = -1;
    bool in_flight = false;
    if (step.receive) {
      if (s + 1 >= plan_.num_steps() ||
          (incoming = plan_.Step(rank_, s + 1).kv_owner) < 0) {
        return absl::InternalError(
            absl::StrCat("ring plan: rank ", rank_, " receives at step ", s,
                         " a block no later step holds"));
      }
      // An empty block (its owner holds no positions) needs no transfer.
      if (BlockBytes(incoming) > 0) {
        RINGATTN_RETURN_IF_ERROR(communicator.StartReceive(
            back_, BlockBytes(incoming), plan_.Previous(rank_)));
        in_flight = true;
      }
    }
    if (step.send && BlockBytes(held) > 0) {
      RINGATTN_RETURN_IF_ERROR(
          communicator.StartSend(front_, BlockBytes(held), plan_.Next(rank_)));
      in_flight = true;
      ++stats.transfers;
      stats.bytes_sent += BlockBytes(held);
    }
    const absl::Time compute_start = absl::Now();
    const WorkerBuffers buffers{
        q_.floats(),
        KvRowsOf(BlockKeys(front_, held), 0, BlockRows(held)),
        KvRowsOf(BlockValues(front_, held), 0, BlockRows(held)),
        o_.view(),
        lse_.view(),
        &task_scratch_};
    for (const AttentionTask& task : step.tasks) {
      if (options.cancelled != nullptr && options.cancelled->load()) {
        return Cancel(communicator, in_flight, s);
      }
      stats.launches.Add(RunAttentionTask(spec_, blocks, task, buffers));
      stats.flops += TaskFlops(spec_, blocks, task);
      ++stats.tasks;
    }
    stats.compute_seconds += SecondsSince(compute_start);
    if (in_flight) {
      const absl::Time wait_start = absl::Now();
      RINGATTN_RETURN_IF_ERROR(communicator.Wait(
          std::min(wait_start + options.step_timeout, options.deadline)));
      stats.wait_seconds += SecondsSince(wait_start);
    }
    if (step.receive) {
      std::swap(front_, back_);
      held = incoming;
    }
  }
  FinishAttention(spec_, o_.view());
  RingOutput output;
  output.o = TypedTensor(std::move(o_));
  output.lse = std::move(lse_);
  output.stats = stats;
  return output;
}

}  // namespace ringattn
