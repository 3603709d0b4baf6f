#ifndef RINGATTN_WORKER_GPU_DILATED_TASKS_H_
#define RINGATTN_WORKER_GPU_DILATED_TASKS_H_

// Dilated (LongNet) tasks of the GPU ring (worker/gpu_ring_executor.h): how a
// kDilated task of a ring plan is cut into attention launches, and enqueueing
// them with their merges.
//
// No compaction pass: the rows a head keeps in a segment are a strided view of
// the shard (row `first`, then every dilation-th row: seq stride dilation *
// heads * dim elements), and consecutive segments of a window with the same
// kept counts are the batch of one launch (batch stride segment_length * heads
// * dim), so each launch reads Q, K and V where they lie and its result is
// folded straight into the accumulator rows it belongs to
// (AttentionDispatcher::ForwardInto). Each strided row is still one contiguous
// run of 2 * dim bytes (128 or more for dim >= 64), so the strided reads move
// the same bytes as a compact copy would; a gather into a compact buffer and a
// scatter of O would instead add a read and a write of every kept Q, K, V and
// O row and two launches per call, and scratch as large as the shard. Launches
// go through AttentionDispatcher: cuDNN where it takes the strides, our flash
// kernel (any strides) where it does not.
//
// Heads that keep the same positions share a launch: every head of a branch
// with dilation 1 under LSE, and every head of a group under HEAD_GROUPS (one
// offset per group), cut at K/V head boundaries where GQA needs it; under LSE
// with dilation > 1 each head (offset h % dilation) has its own launches.
// Causal masking by original position is, counted in kept rows, a shift within
// a segment; where that shift is not the bottom-right one a launch is cut like
// TileTask cuts causal tasks (unmasked tiles, tiles whose own bottom-right
// diagonal is the mask's, nothing for hidden pairs).

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "core/attention_spec.h"
#include "core/ring_plan.h"
#include "kernels/cuda/attention_args.h"
#include "kernels/cuda/attention_dispatch.h"

namespace ringattn {

// One attention launch (and its merge) of a dilated task: in each of
// `segments` segments, segment_rows rows apart, query rows q_row + i *
// dilation (i < q_len) of the shard against key rows k_row + j * dilation
// (j < kv_len) of the held K/V block, for query heads [q_head, q_head +
// q_heads) and K/V heads [kv_head, kv_head + kv_heads) (q_heads a multiple of
// kv_heads; query head q_head + x reads K/V head kv_head + x / (q_heads /
// kv_heads)), with the bottom-right causal mask if `causal`. Rows of the
// first segment; local to the shard and the held block.
struct DilatedCall {
  int64_t q_row = 0;
  int64_t q_len = 0;
  int64_t k_row = 0;
  int64_t kv_len = 0;
  bool causal = false;
  int64_t segments = 1;
  int64_t segment_rows = 0;
  int64_t dilation = 1;
  int64_t q_head = 0;
  int64_t q_heads = 1;
  int64_t kv_head = 0;
  int64_t kv_heads = 1;

  friend bool operator==(const DilatedCall& a, const DilatedCall& b) {
    return a.q_row == b.q_row && a.q_len == b.q_len && a.k_row == b.k_row &&
           a.kv_len == b.kv_len && a.causal == b.causal &&
           a.segments == b.segments && a.segment_rows == b.segment_rows &&
           a.dilation == b.dilation && a.q_head == b.q_head &&
           a.q_heads == b.q_heads && a.kv_head == b.kv_head &&
           a.kv_heads == b.kv_heads;
  }
};

// What bounds one DilatedCall: at most tile_q_rows query rows and
// tile_kv_rows key rows per segment, segments * q_len * q_heads at most
// partial_rows (the (row, head) pairs of partial result one spec batch's
// scratch holds) and segments * q_heads at most kMaxDilatedBatchHeads.
struct DilatedLimits {
  int64_t tile_q_rows = 16384;
  int64_t tile_kv_rows = 16384;
  int64_t partial_rows = 0;
};

// The most segments * heads one launch takes (our kernels' grid limit).
inline constexpr int64_t kMaxDilatedBatchHeads = 65535;

// The launches that compute `task` (kDilated, of a plan of `spec`): every
// (query, key, head) triple the task's branch makes visible in exactly one
// launch, no launch with a hidden triple or a row that sees no key. Requires
// positive limits, with partial_rows at least min(task rows, tile_q_rows) *
// spec.q_heads.
std::vector<DilatedCall> PlanDilatedTask(const AttentionSpec& spec,
                                         const AttentionTask& task,
                                         const DilatedLimits& limits);

// The launches of the kDilated tasks among `tasks` (of one query shard), for
// an executor with at most `q_rows` query rows per shard whose scratch holds
// spec.batch * min(q_rows, tile_q_rows) * q_heads partial rows
// (GpuRingExecutor's).
std::vector<DilatedCall> PlanDilatedTasks(
    const AttentionSpec& spec, const std::vector<AttentionTask>& tasks,
    int64_t q_rows, int64_t tile_q_rows, int64_t tile_kv_rows);

// Per step of `plan`, PlanDilatedTasks of rank `rank`'s tasks.
std::vector<std::vector<DilatedCall>> PlanDilatedSteps(
    const AttentionSpec& spec, const RingPlan& plan, int rank, int64_t q_rows,
    int64_t tile_q_rows, int64_t tile_kv_rows);

// The device memory dilated launches use: pointers into the executor's pool.
struct DilatedOperands {
  DeviceDType dtype = DeviceDType::kBFloat16;
  const void* q = nullptr;  // the query shard, [B, q_rows, Hq, D]
  int64_t q_rows = 0;
  // The held K and V, [B, rows, Hkv, D] each, batches kv_batch_stride
  // elements apart.
  const void* k = nullptr;
  const void* v = nullptr;
  int64_t kv_batch_stride = 0;
  // The fp32 accumulators, [B, q_rows, Hq, D] and [B, q_rows, Hq].
  float* o = nullptr;
  float* lse = nullptr;
  // One launch's partial result, as large as PlanDilatedSteps assumes.
  void* part_o = nullptr;
  float* part_lse = nullptr;
};

// How many launches each attention path took.
// Enqueues `calls` on `stream`, each merged into the accumulators, and counts
// their paths. CANCELLED if *cancelled (when given) is set before a launch;
// otherwise the attention paths' errors and INTERNAL for a failing merge.
absl::Status EnqueueDilatedCalls(const AttentionSpec& spec,
                                 const std::vector<DilatedCall>& calls,
                                 const DilatedOperands& operands,
                                 AttentionDispatcher& dispatcher,
                                 const std::atomic<bool>* cancelled,
                                 cudaStream_t stream,
                                 AttentionPathCounts& counts);

// Enqueues what follows the last task on the fp32 O accumulator of `count`
// values: the 1/G of the HEAD_GROUPS combine (nothing for other specs), as
// FinishAttention (kernels/cpu/run_task.h) does on the CPU.
absl::Status EnqueueFinishDilated(const AttentionSpec& spec, float* o,
                                  int64_t count, cudaStream_t stream);

}  // namespace ringattn

#endif  // RINGATTN_WORKER_GPU_DILATED_TASKS_H_
