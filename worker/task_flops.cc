#include "worker/task_flops.h"

#include <algorithm>

#include "core/dilated.h"

namespace ringattn {
namespace {

// Visible pairs of one head of a dilated task, summed over its segments.
int64_t DilatedPairs(const AttentionSpec& spec, const AttentionTask& task,
                     int64_t head) {
  const DilatedBranch& branch = spec.dilated[task.branch];
  const int64_t r = branch.dilation;
  const int64_t offset = DilatedOffset(spec, task.branch, head);
  int64_t pairs = 0;
  for (const Range& segment : SegmentsIn(branch, spec.q_len, task.q)) {
    const KeptPositions kq = KeptIn(segment, r, offset, task.q);
    const KeptPositions kk = KeptIn(segment, r, offset, task.k);
    if (kq.count == 0 || kk.count == 0) continue;
    if (!spec.causal) {
      pairs += kq.count * kk.count;
      continue;
    }
    // Causal among kept positions, counted in kept rows of the segment.
    const int64_t origin = segment.begin + offset;
    const int64_t q_first = (kq.first - origin) / r;
    const int64_t k_first = (kk.first - origin) / r;
    pairs += CausalPairs(Range{q_first, q_first + kq.count},
                         Range{k_first, k_first + kk.count}, 0);
  }
  return pairs;
}

// Visible pairs of a block-sparse task (one head).
int64_t BlockSparsePairs(const AttentionSpec& spec, const BlockMask& blocks,
                         const AttentionTask& task) {
  const int64_t size = blocks.block_size();
  const int64_t shift = spec.kv_len - spec.q_len;
  int64_t pairs = 0;
  for (int64_t qb = task.q.begin / size; qb * size < task.q.end; ++qb) {
    const Range q = task.q.Intersect(Range{qb * size, (qb + 1) * size});
    for (int64_t kb = task.k.begin / size; kb * size < task.k.end; ++kb) {
      if (!blocks.Allowed(qb, kb)) continue;
      const Range k = task.k.Intersect(Range{kb * size, (kb + 1) * size});
      pairs += spec.causal ? CausalPairs(q, k, shift) : q.size() * k.size();
    }
  }
  return pairs;
}

}  // namespace

int64_t CausalPairs(const Range& q, const Range& k, int64_t shift) {
  const int64_t n = k.size();
  if (q.empty() || n <= 0) return 0;
  // Query qp sees clamp(qp - c, 0, n) keys.
  const int64_t c = k.begin - shift - 1;
  // Partly visible rows: qp in [c + 1, c + n).
  const int64_t a = std::max(q.begin, c + 1);
  const int64_t b = std::min(q.end, c + n);
  int64_t pairs = 0;
  if (a < b) pairs += (b - a) * ((a - c) + (b - 1 - c)) / 2;
  // Rows that see the whole key range.
  const int64_t full_begin = std::max(q.begin, c + n);
  if (full_begin < q.end) pairs += (q.end - full_begin) * n;
  return pairs;
}

double TaskFlops(const AttentionSpec& spec, const BlockMask* blocks,
                 const AttentionTask& task) {
  const double per_pair = 4.0 * static_cast<double>(spec.head_dim) *
                          static_cast<double>(spec.batch);
  switch (task.kind) {
    case TaskKind::kFull:
      return per_pair * spec.q_heads * task.q.size() * task.k.size();
    case TaskKind::kCausal:
      return per_pair * spec.q_heads *
             CausalPairs(task.q, task.k, spec.kv_len - spec.q_len);
    case TaskKind::kBlockSparse:
      return per_pair * spec.q_heads * BlockSparsePairs(spec, *blocks, task);
    case TaskKind::kDilated: {
      int64_t pairs = 0;
      for (int64_t h = 0; h < spec.q_heads; ++h) {
        if (HeadTakesBranch(spec, task.branch, h)) {
          pairs += DilatedPairs(spec, task, h);
        }
      }
      return per_pair * pairs;
    }
  }
  return 0;
}

}  // namespace ringattn
