#include "worker/output_dealer.h"

#include <algorithm>
#include <utility>

#include "proto/spec_conversion.h"

namespace ringattn {

OutputDealer::OutputDealer(TypedTensor o, Tensor<float> lse,
                           std::vector<Range> chunks, bool list_positions,
                           int64_t first_message_bytes,
                           int64_t max_message_bytes)
    : o_(std::move(o)),
      lse_(std::move(lse)),
      chunks_(std::move(chunks)),
      list_positions_(list_positions),
      row_bytes_(o_.view().row_bytes() + sizeof(float) * o_.shape().heads),
      first_message_bytes_(std::min(first_message_bytes, max_message_bytes)),
      max_message_bytes_(max_message_bytes),
      growth_bytes_(first_message_bytes_) {
  for (const Range& chunk : chunks_) rows_left_ += chunk.size();
  rows_left_ *= o_.shape().batch;
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
    const int64_t most_bytes =
        std::min(growth_bytes_,
                 std::max(first_message_bytes_, rows_left_ * row_bytes_ / 2));
    growth_bytes_ = std::min(2 * growth_bytes_, max_message_bytes_);
    const int64_t rows =
        row_bytes_ > 0 ? std::max<int64_t>(1, most_bytes / row_bytes_) : 1;
    const int64_t chunk_left = chunk.size() - offset_;
    claim.count = (chunk_left - rows) * row_bytes_ < first_message_bytes_ / 2
                      ? chunk_left
                      : rows;
    offset_ += claim.count;
    rows_left_ -= claim.count;
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
