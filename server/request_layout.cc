#include "server/request_layout.h"

#include "core/hilbert.h"
#include "core/ring_plan.h"

namespace ringattn {

RequestLayout::RequestLayout(const AttentionSpec& spec, int64_t workers)
    : q_layout_(QueryLayoutFor(spec, workers)),
      kv_layout_(LayoutFor(spec, spec.kv_len, workers)) {
  if (spec.hilbert.has_value()) {
    order_ = HilbertOrder(spec.hilbert->height, spec.hilbert->width);
    position_of_ = InversePermutation(order_);
  }
}

int64_t RequestLayout::WorkerOf(const ShardLayout& layout,
                                int64_t position) const {
  return layout.Locate(position).worker;
}

int64_t RequestLayout::TokenAt(int64_t position) const {
  return order_.empty() ? position : order_[position];
}

std::vector<RequestLayout::Piece> RequestLayout::Route(bool keys,
                                                       int64_t first_token,
                                                       int64_t count) const {
  const ShardLayout& layout = keys ? kv_layout_ : q_layout_;
  std::vector<Piece> pieces;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t token = first_token + i;
    const int64_t position = order_.empty() ? token : position_of_[token];
    const int64_t worker = WorkerOf(layout, position);
    if (pieces.empty() || pieces.back().worker != worker) {
      pieces.push_back(Piece{worker, i, {}, true});
    }
    Piece& piece = pieces.back();
    if (!piece.positions.empty() && piece.positions.back() + 1 != position) {
      piece.contiguous = false;
    }
    piece.positions.push_back(position);
  }
  return pieces;
}

}  // namespace ringattn
