#include "worker/gpu_dilated_tasks.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "core/dilated.h"
#include "core/range.h"
#include "core/status_macros.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/partial_merge.h"
#include "worker/attention_tiles.h"

namespace ringattn {
namespace {

// Query heads [q_head, q_head + q_heads) that keep the same positions
// (`offset`) and read K/V heads [kv_head, kv_head + kv_heads).
struct HeadRun {
  int64_t q_head = 0;
  int64_t q_heads = 0;
  int64_t kv_head = 0;
  int64_t kv_heads = 0;
  int64_t offset = 0;
};

// Query heads [begin, end), all with `offset`, as runs that each map onto
// whole K/V heads or lie within one.
void AddHeadRuns(const AttentionSpec& spec, int64_t begin, int64_t end,
                 int64_t offset, std::vector<HeadRun>& runs) {
  const int64_t ratio = spec.GqaRatio();
  for (int64_t h = begin; h < end;) {
    const int64_t kv_head = h / ratio;
    const int64_t whole = h % ratio == 0 ? (end - h) / ratio : 0;
    if (whole > 0) {
      runs.push_back({h, whole * ratio, kv_head, whole, offset});
      h += whole * ratio;
    } else {
      const int64_t stop = std::min(end, (kv_head + 1) * ratio);
      runs.push_back({h, stop - h, kv_head, 1, offset});
      h = stop;
    }
  }
}

// The head runs of branch `branch`: every head at once where all keep the
// same positions, else one run per head.
std::vector<HeadRun> HeadRunsOf(const AttentionSpec& spec, int64_t branch) {
  std::vector<HeadRun> runs;
  if (spec.combine == DilatedCombine::kHeadGroups) {
    const Range group = HeadGroup(
        spec.q_heads, static_cast<int64_t>(spec.dilated.size()), branch);
    AddHeadRuns(spec, group.begin, group.end,
                DilatedOffset(spec, branch, group.begin), runs);
  } else if (spec.dilated[branch].dilation == 1) {
    AddHeadRuns(spec, 0, spec.q_heads, 0, runs);
  } else {
    for (int64_t h = 0; h < spec.q_heads; ++h) {
      runs.push_back(
          {h, 1, spec.KvHeadOf(h), 1, DilatedOffset(spec, branch, h)});
    }
  }
  return runs;
}

// The kept rows of one segment of a task for one offset: q_count query rows
// from shard row q_row and k_count key rows from block row k_row, `dilation`
// rows apart; kept query i sees kept key j iff j <= i + shift (when causal).
struct Piece {
  int64_t q_row = 0;
  int64_t q_count = 0;
  int64_t k_row = 0;
  int64_t k_count = 0;
  int64_t shift = 0;
};

// The tiles of a piece within the tile sizes, in kept rows of the piece.
std::vector<AttentionTile> TilesOf(const Piece& piece, bool causal,
                                   const DilatedLimits& limits) {
  std::vector<AttentionTile> tiles;
  AddRectangleTiles(0, piece.q_count, 0, piece.k_count, causal, piece.shift,
                    limits.tile_q_rows, limits.tile_kv_rows, tiles);
  return tiles;
}

// The non-empty pieces of `task` for heads with `offset`, in segment order.
std::vector<Piece> PiecesOf(const AttentionSpec& spec,
                            const AttentionTask& task, int64_t offset) {
  const DilatedBranch& branch = spec.dilated[task.branch];
  const int64_t r = branch.dilation;
  std::vector<Piece> pieces;
  for (const Range& segment : SegmentsIn(branch, spec.q_len, task.q)) {
    const KeptPositions kq = KeptIn(segment, r, offset, task.q);
    const KeptPositions kk = KeptIn(segment, r, offset, task.k);
    if (kq.count == 0 || kk.count == 0) continue;
    pieces.push_back({task.q_row + kq.first - task.q.begin, kq.count,
                      task.k_row + kk.first - task.k.begin, kk.count,
                      (kq.first - kk.first) / r});
  }
  return pieces;
}

// Whether `next` continues a batch of segments that ends with `last`: the same
// kept counts and mask, one segment further on in both the shard and the
// block.
bool Continues(const Piece& last, const Piece& next, bool causal,
               int64_t segment_rows) {
  return next.q_count == last.q_count && next.k_count == last.k_count &&
         (!causal || next.shift == last.shift) &&
         next.q_row - last.q_row == segment_rows &&
         next.k_row - last.k_row == segment_rows;
}

}  // namespace

std::vector<DilatedCall> PlanDilatedTask(const AttentionSpec& spec,
                                         const AttentionTask& task,
                                         const DilatedLimits& limits) {
  std::vector<DilatedCall> calls;
  if (task.kind != TaskKind::kDilated) return calls;
  const DilatedBranch& branch = spec.dilated[task.branch];
  const int64_t w = branch.segment_length;
  const int64_t r = branch.dilation;
  // Pieces depend on the offset only; heads sharing one share them.
  std::map<int64_t, std::vector<Piece>> pieces_of;
  for (const HeadRun& run : HeadRunsOf(spec, task.branch)) {
    auto [entry, inserted] = pieces_of.try_emplace(run.offset);
    if (inserted) entry->second = PiecesOf(spec, task, run.offset);
    const std::vector<Piece>& pieces = entry->second;
    for (size_t first = 0; first < pieces.size();) {
      size_t end = first + 1;
      while (end < pieces.size() &&
             Continues(pieces[end - 1], pieces[end], spec.causal, w)) {
        ++end;
      }
      const Piece& piece = pieces[first];
      const int64_t batch = static_cast<int64_t>(end - first);
      for (const AttentionTile& tile : TilesOf(piece, spec.causal, limits)) {
        const int64_t most = std::max<int64_t>(
            1, std::min(limits.partial_rows / (tile.q_len * run.q_heads),
                        kMaxDilatedBatchHeads / run.q_heads));
        for (int64_t s = 0; s < batch; s += most) {
          DilatedCall call;
          call.q_row = piece.q_row + (s * w) + tile.q_row * r;
          call.q_len = tile.q_len;
          call.k_row = piece.k_row + (s * w) + tile.k_row * r;
          call.kv_len = tile.kv_len;
          call.causal = tile.causal;
          call.segments = std::min(most, batch - s);
          call.segment_rows = w;
          call.dilation = r;
          call.q_head = run.q_head;
          call.q_heads = run.q_heads;
          call.kv_head = run.kv_head;
          call.kv_heads = run.kv_heads;
          calls.push_back(call);
        }
      }
      first = end;
    }
  }
  return calls;
}

std::vector<DilatedCall> PlanDilatedTasks(
    const AttentionSpec& spec, const std::vector<AttentionTask>& tasks,
    int64_t q_rows, int64_t tile_q_rows, int64_t tile_kv_rows) {
  DilatedLimits limits;
  limits.tile_q_rows = tile_q_rows;
  limits.tile_kv_rows = tile_kv_rows;
  limits.partial_rows = std::min(q_rows, tile_q_rows) * spec.q_heads;
  std::vector<DilatedCall> calls;
  for (const AttentionTask& task : tasks) {
    std::vector<DilatedCall> task_calls = PlanDilatedTask(spec, task, limits);
    calls.insert(calls.end(), task_calls.begin(), task_calls.end());
  }
  return calls;
}

std::vector<std::vector<DilatedCall>> PlanDilatedSteps(
    const AttentionSpec& spec, const RingPlan& plan, int rank, int64_t q_rows,
    int64_t tile_q_rows, int64_t tile_kv_rows) {
  std::vector<std::vector<DilatedCall>> steps;
  for (int64_t s = 0; s < plan.num_steps(); ++s) {
    steps.push_back(PlanDilatedTasks(spec, plan.Step(rank, s).tasks, q_rows,
                                     tile_q_rows, tile_kv_rows));
  }
  return steps;
}

absl::Status EnqueueDilatedCalls(const AttentionSpec& spec,
                                 const std::vector<DilatedCall>& calls,
                                 const DilatedOperands& operands,
                                 AttentionDispatcher& dispatcher,
                                 const std::atomic<bool>* cancelled,
                                 cudaStream_t stream,
                                 AttentionPathCounts& counts) {
  constexpr int64_t kElementBytes = 2;
  const int64_t d = spec.head_dim;
  const int64_t q_row_values = spec.q_heads * d;
  const int64_t k_row_values = spec.kv_heads * d;
  const int64_t q_batch_rows = operands.q_rows;
  for (size_t c = 0; c < calls.size(); ++c) {
    if (cancelled != nullptr && cancelled->load()) {
      return absl::CancelledError(absl::StrCat(
          "cancelled before dilated launch ", c + 1, " of ", calls.size()));
    }
    const DilatedCall& call = calls[c];
    // Batched segments run one spec batch at a time; a single segment takes
    // every spec batch in one launch.
    const bool batched = call.segments > 1;
    const int64_t launches = batched ? spec.batch : 1;
    for (int64_t b = 0; b < launches; ++b) {
      const int64_t q_first =
          (b * q_batch_rows + call.q_row) * q_row_values + call.q_head * d;
      const int64_t k_first = b * operands.kv_batch_stride +
                              call.k_row * k_row_values + call.kv_head * d;
      DeviceAttentionArgs args;
      args.dtype = operands.dtype;
      args.batch = batched ? call.segments : spec.batch;
      args.q_len = call.q_len;
      args.kv_len = call.kv_len;
      args.q_heads = call.q_heads;
      args.kv_heads = call.kv_heads;
      args.head_dim = d;
      args.q.data =
          static_cast<const char*>(operands.q) + q_first * kElementBytes;
      args.q.batch_stride =
          (batched ? call.segment_rows : q_batch_rows) * q_row_values;
      args.q.seq_stride = call.dilation * q_row_values;
      args.k.data =
          static_cast<const char*>(operands.k) + k_first * kElementBytes;
      args.v.data =
          static_cast<const char*>(operands.v) + k_first * kElementBytes;
      args.k.batch_stride = args.v.batch_stride =
          batched ? call.segment_rows * k_row_values : operands.kv_batch_stride;
      args.k.seq_stride = args.v.seq_stride = call.dilation * k_row_values;
      args.o.data = operands.part_o;
      args.o.batch_stride = call.q_len * call.q_heads * d;
      args.o.seq_stride = call.q_heads * d;
      args.lse = operands.part_lse;
      args.scale = spec.EffectiveScale();
      args.causal = call.causal;
      const int64_t acc_batch_rows = batched ? call.segment_rows : q_batch_rows;
      AccumulatorRows into;
      into.o = operands.o + q_first;
      into.o_batch_stride = acc_batch_rows * q_row_values;
      into.o_seq_stride = call.dilation * q_row_values;
      into.lse = operands.lse + (b * q_batch_rows + call.q_row) * spec.q_heads +
                 call.q_head;
      into.lse_batch_stride = acc_batch_rows * spec.q_heads;
      into.lse_seq_stride = call.dilation * spec.q_heads;
      absl::StatusOr<AttentionPath> path =
          dispatcher.ForwardInto(args, into, stream);
      if (!path.ok()) return path.status();
      counts.Add(*path);
    }
  }
  return absl::OkStatus();
}

absl::Status EnqueueFinishDilated(const AttentionSpec& spec, float* o,
                                  int64_t count, cudaStream_t stream) {
  if (spec.dilated.empty() || spec.combine != DilatedCombine::kHeadGroups) {
    return absl::OkStatus();
  }
  const float inverse = 1.0f / static_cast<float>(spec.dilated.size());
  return CudaStatus(LaunchScaleAccumulator(o, count, inverse, stream),
                    "dividing O by the number of branches");
}

}  // namespace ringattn
