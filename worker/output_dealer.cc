#include "worker/output_dealer.h"

#include <algorithm>
#include <utility>

#include "proto/spec_conversion.h"

namespace ringattn {

OutputDealer::OutputDealer(TypedTensor o, Tensor<float> lse,
                           std::vector<Range> chunks, bool list_positions,
                           int64_t max_message_bytes)
    : o_(std::move(o)),
      lse_(std::move(lse)),
      chunks_(std::move(chunks)),
      list_positions_(list_positions) {
  const int64_t row_bytes =
      o_.view().row_bytes() + sizeof(float) * o_.shape().heads;
  if (row_bytes > 0) {
    rows_per_message_ = std::max<int64_t>(1, max_message_bytes / row_bytes);
  }
}

bool OutputDealer::SkipDealt() {
  while (batch_ < o_.shape().batch) {
    if (chunk_ == chunks_.size()) {
      ++batch_;
      chunk_ = 0;
      chunk_row_ = 0;
      offset_ = 0;
      continue;
    }
    if (offset_ >= chunks_[chunk_].size()) {
      chunk_row_ += chunks_[chunk_].size();
      ++chunk_;
      offset_ = 0;
      continue;
    }
    return true;
  }
  return false;
}

bool OutputDealer::Next(v1::ShardOutput* out) {
  Claim claim;
  {
    absl::MutexLock lock(&mutex_);
    if (!SkipDealt()) return false;
    const Range& chunk = chunks_[chunk_];
    claim.batch = batch_;
    claim.row = chunk_row_ + offset_;
    claim.position = chunk.begin + offset_;
    claim.count = std::min(rows_per_message_, chunk.size() - offset_);
    offset_ += claim.count;
    ++messages_;
  }
  out->set_batch(claim.batch);
  out->set_count(claim.count);
  if (list_positions_) {
    for (int64_t i = 0; i < claim.count; ++i) {
      out->add_positions(claim.position + i);
    }
  } else {
    out->set_first_position(claim.position);
  }
  const TypedView o = o_.view();
  out->set_data(o.Row(claim.batch, claim.row), claim.count * o.row_bytes());
  out->set_dtype(DTypeToProto(o.dtype()));
  out->set_lse(lse_.view().Row(claim.batch, claim.row, 0),
               sizeof(float) * claim.count * lse_.shape().heads);
  return true;
}

bool OutputDealer::HasMore() {
  absl::MutexLock lock(&mutex_);
  return SkipDealt();
}

int64_t OutputDealer::messages() const {
  absl::MutexLock lock(&mutex_);
  return messages_;
}

}  // namespace ringattn
