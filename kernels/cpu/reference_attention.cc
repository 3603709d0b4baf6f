#include "kernels/cpu/reference_attention.h"

#include <cmath>
#include <limits>
#include <numeric>
#include <optional>
#include <vector>

#include "core/block_mask.h"
#include "core/dilated.h"
#include "core/hilbert.h"

namespace ringattn {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Softmax attention of one query row over the keys `visible` accepts.
struct RowResult {
  std::vector<double> o;
  double lse = kNegInf;
};

template <typename Visible>
RowResult AttendRow(const float* q_row, View<const float> k,
                    View<const float> v, int64_t b, int64_t kv_head,
                    const std::vector<int64_t>& order, double scale,
                    Visible visible) {
  const int64_t d_len = k.shape().dim;
  const int64_t nk = k.shape().seq;
  RowResult result;
  result.o.assign(static_cast<size_t>(d_len), 0.0);
  std::vector<double> scores(static_cast<size_t>(nk), kNegInf);
  double max = kNegInf;
  for (int64_t t = 0; t < nk; ++t) {
    if (!visible(t)) continue;
    const float* k_row = k.Row(b, order[t], kv_head);
    double dot = 0;
    for (int64_t d = 0; d < d_len; ++d) {
      dot += static_cast<double>(q_row[d]) * k_row[d];
    }
    scores[t] = dot * scale;
    max = std::max(max, scores[t]);
  }
  if (max == kNegInf) return result;
  double sum = 0;
  for (int64_t t = 0; t < nk; ++t) {
    if (scores[t] == kNegInf) continue;
    const double p = std::exp(scores[t] - max);
    sum += p;
    const float* v_row = v.Row(b, order[t], kv_head);
    for (int64_t d = 0; d < d_len; ++d) result.o[d] += p * v_row[d];
  }
  for (double& x : result.o) x /= sum;
  result.lse = max + std::log(sum);
  return result;
}

// Folds `part` into `acc` by log-sum-exp (the LSE combine of dilated branches).
void MergeRow(RowResult& acc, const RowResult& part) {
  if (part.lse == kNegInf) return;
  if (acc.lse == kNegInf) {
    acc = part;
    return;
  }
  const double lse = std::max(acc.lse, part.lse) +
                     std::log1p(std::exp(-std::fabs(acc.lse - part.lse)));
  for (size_t d = 0; d < acc.o.size(); ++d) {
    acc.o[d] = acc.o[d] * std::exp(acc.lse - lse) +
               part.o[d] * std::exp(part.lse - lse);
  }
  acc.lse = lse;
}

}  // namespace

void ReferenceAttention(const AttentionSpec& spec, View<const float> q,
                        View<const float> k, View<const float> v,
                        View<double> o, View<double> lse) {
  std::vector<int64_t> rows(static_cast<size_t>(spec.q_len));
  std::iota(rows.begin(), rows.end(), 0);
  ReferenceAttentionRows(spec, q, k, v, rows, o, lse);
}

void ReferenceAttentionRows(const AttentionSpec& spec, View<const float> q,
                            View<const float> k, View<const float> v,
                            const std::vector<int64_t>& rows, View<double> o,
                            View<double> lse) {
  const int64_t nq = spec.q_len;
  const int64_t nk = spec.kv_len;
  const int64_t shift = nk - nq;
  const double scale = spec.EffectiveScale();
  // order[t]: the caller's row at position t of the order masks are applied in.
  std::vector<int64_t> q_order(static_cast<size_t>(nq));
  std::vector<int64_t> k_order(static_cast<size_t>(nk));
  std::iota(q_order.begin(), q_order.end(), 0);
  std::iota(k_order.begin(), k_order.end(), 0);
  if (spec.hilbert.has_value()) {
    q_order = k_order = HilbertOrder(spec.hilbert->height, spec.hilbert->width);
  }
  const std::vector<int64_t> q_position = InversePermutation(q_order);
  std::optional<BlockMask> blocks;
  if (spec.block_sparse.has_value()) {
    blocks = BlockMask::FromRules(*spec.block_sparse, nk);
  }
  const int64_t num_branches = static_cast<int64_t>(spec.dilated.size());
  for (int64_t b = 0; b < spec.batch; ++b) {
    for (int64_t h = 0; h < spec.q_heads; ++h) {
      const int64_t kv_head = spec.KvHeadOf(h);
      for (const int64_t row_index : rows) {
        const int64_t tq = q_position[row_index];
        const float* q_row = q.Row(b, q_order[tq], h);
        RowResult row;
        if (num_branches == 0) {
          row = AttendRow(
              q_row, k, v, b, kv_head, k_order, scale, [&](int64_t tk) {
                if (spec.causal && tk > tq + shift) return false;
                const int64_t bs = blocks ? blocks->block_size() : 1;
                return !blocks || blocks->Allowed(tq / bs, tk / bs);
              });
        } else {
          row.o.assign(static_cast<size_t>(spec.head_dim), 0.0);
          for (int64_t br = 0; br < num_branches; ++br) {
            if (!HeadTakesBranch(spec, br, h)) continue;
            const int64_t r = spec.dilated[br].dilation;
            const int64_t offset = DilatedOffset(spec, br, h);
            const Range segment = SegmentOf(spec.dilated[br], nq, tq);
            if ((tq - segment.begin) % r != offset) continue;
            MergeRow(row, AttendRow(q_row, k, v, b, kv_head, k_order, scale,
                                    [&](int64_t tk) {
                                      return tk >= segment.begin &&
                                             tk < segment.end &&
                                             (tk - segment.begin) % r ==
                                                 offset &&
                                             (!spec.causal || tk <= tq);
                                    }));
          }
          if (spec.combine == DilatedCombine::kHeadGroups) {
            for (double& x : row.o) x /= num_branches;
          }
        }
        double* out = o.Row(b, q_order[tq], h);
        for (int64_t d = 0; d < spec.head_dim; ++d) out[d] = row.o[d];
        lse.At(b, q_order[tq], h, 0) = row.lse;
      }
    }
  }
}

}  // namespace ringattn
