#include "kernels/cpu/run_task.h"

#include <cmath>

#include "core/dilated.h"
#include "kernels/cpu/block_attention.h"
#include "kernels/cpu/decode_attention.h"
#include "kernels/cpu/merge_with_lse.h"

namespace ringattn {
namespace {

// Every `stride`-th row of `view` from row `first`, `count` rows, head `head`
// only.
template <typename T>
View<T> StridedHead(View<T> view, int64_t first, int64_t stride, int64_t count,
                    int64_t head) {
  Shape shape = view.shape();
  shape.seq = count;
  shape.heads = 1;
  return View<T>(view.Row(0, first, head), shape, view.batch_stride(),
                 view.seq_stride() * stride);
}

void Attend(CpuKernel kernel, const BlockAttentionArgs& args, View<float> o,
            View<float> lse) {
  if (kernel == CpuKernel::kDecode) {
    DecodeAttention(args, o, lse);
  } else {
    BlockAttention(args, o, lse);
  }
}

// Whether no task has reached any row of `lse` yet (all -inf).
bool HoldsNoKeys(View<float> lse) {
  const Shape& s = lse.shape();
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t n = 0; n < s.seq; ++n) {
      for (int64_t h = 0; h < s.heads; ++h) {
        if (*lse.Row(b, n, h) != -INFINITY) return false;
      }
    }
  }
  return true;
}

// Computes args with `kernel` into scratch and merges the result into (o, lse);
// straight into (o, lse) where they hold no keys yet (the first task of its
// rows, the only one for a worker of one shard), which spares an O-sized
// scratch and the merge pass.
void AttendAndMerge(CpuKernel kernel, const BlockAttentionArgs& args,
                    View<float> o, View<float> lse,
                    std::vector<float>& scratch) {
  if (HoldsNoKeys(lse)) {
    Attend(kernel, args, o, lse);
    return;
  }
  const Shape o_shape = o.shape();
  Shape lse_shape = o_shape;
  lse_shape.dim = 1;
  const size_t needed =
      static_cast<size_t>(o_shape.NumElements() + lse_shape.NumElements());
  if (scratch.size() < needed) scratch.resize(needed);
  const View<float> part_o(scratch.data(), o_shape);
  const View<float> part_lse(scratch.data() + o_shape.NumElements(), lse_shape);
  Attend(kernel, args, part_o, part_lse);
  MergeWithLse(o, lse, part_o, part_lse);
}

void RunDilatedTask(const AttentionSpec& spec, const AttentionTask& task,
                    const WorkerBuffers& buffers) {
  const DilatedBranch& branch = spec.dilated[task.branch];
  const int64_t r = branch.dilation;
  for (int64_t h = 0; h < spec.q_heads; ++h) {
    if (!HeadTakesBranch(spec, task.branch, h)) continue;
    const int64_t offset = DilatedOffset(spec, task.branch, h);
    for (const Range& segment : SegmentsIn(branch, spec.q_len, task.q)) {
      const KeptPositions kq = KeptIn(segment, r, offset, task.q);
      const KeptPositions kk = KeptIn(segment, r, offset, task.k);
      if (kq.count == 0 || kk.count == 0) continue;
      const int64_t q_first = task.q_row + kq.first - task.q.begin;
      const int64_t k_first = task.k_row + kk.first - task.k.begin;
      const int64_t kv_head = spec.KvHeadOf(h);
      BlockAttentionArgs args;
      args.q = StridedHead(buffers.q, q_first, r, kq.count, h);
      args.k = StridedHead(buffers.k.f32(), k_first, r, kk.count, kv_head);
      args.v = StridedHead(buffers.v.f32(), k_first, r, kk.count, kv_head);
      // Positions counted in kept rows of the segment, so causal stays a plain
      // shift.
      const int64_t origin = segment.begin + offset;
      args.q_position = (kq.first - origin) / r;
      args.k_position = (kk.first - origin) / r;
      args.scale = spec.EffectiveScale();
      args.mask.causal = spec.causal;
      AttendAndMerge(CpuKernel::kBlock, args,
                     StridedHead(buffers.o, q_first, r, kq.count, h),
                     StridedHead(buffers.lse, q_first, r, kq.count, h),
                     *buffers.scratch);
    }
  }
}

}  // namespace

CpuKernel RunAttentionTask(const AttentionSpec& spec, const BlockMask* blocks,
                           const AttentionTask& task,
                           const WorkerBuffers& buffers) {
  if (task.kind == TaskKind::kDilated) {
    RunDilatedTask(spec, task, buffers);
    return CpuKernel::kBlock;
  }
  const int64_t q_end = task.q_row + task.q.size();
  const int64_t k_end = task.k_row + task.k.size();
  BlockAttentionArgs args;
  args.q = buffers.q.Slice(task.q_row, q_end);
  args.k = buffers.k.Slice(task.k_row, k_end);
  args.v = buffers.v.Slice(task.k_row, k_end);
  args.q_position = task.q.begin;
  args.k_position = task.k.begin;
  args.scale = spec.EffectiveScale();
  args.mask.causal = spec.causal && task.kind != TaskKind::kFull;
  args.mask.causal_shift = spec.kv_len - spec.q_len;
  if (task.kind == TaskKind::kBlockSparse) args.mask.blocks = blocks;
  const CpuKernel kernel =
      task.kind != TaskKind::kBlockSparse &&
              task.q.size() * spec.GqaRatio() <= kDecodeMaxPackedRows
          ? CpuKernel::kDecode
          : CpuKernel::kBlock;
  AttendAndMerge(kernel, args, buffers.o.Slice(task.q_row, q_end),
                 buffers.lse.Slice(task.q_row, q_end), *buffers.scratch);
  return kernel;
}

void FinishAttention(const AttentionSpec& spec, View<float> o) {
  if (spec.dilated.empty() || spec.combine != DilatedCombine::kHeadGroups) {
    return;
  }
  const float inverse = 1.0f / static_cast<float>(spec.dilated.size());
  const Shape& s = o.shape();
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t n = 0; n < s.seq; ++n) {
      float* row = o.Row(b, n, 0);
      for (int64_t x = 0; x < s.heads * s.dim; ++x) row[x] *= inverse;
    }
  }
}

}  // namespace ringattn
