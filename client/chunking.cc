#include "client/chunking.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"

namespace ringattn {

int64_t SplitChunkBytes(int64_t chunk_bytes, int64_t total_bytes) {
  return std::min(chunk_bytes,
                  std::max(kLeastSplitChunkBytes, total_bytes / 32));
}

ChunkStream::ChunkStream(DType wire_dtype, int64_t chunk_bytes)
    : wire_dtype_(wire_dtype), chunk_bytes_(chunk_bytes) {}

void ChunkStream::Add(v1::TensorName name, View<const float> tensor) {
  entries_.push_back({name, tensor});
}

void ChunkStream::Plan() {
  if (planned_) return;
  planned_ = true;
  const int64_t chunk_bytes = SplitChunkBytes(chunk_bytes_, total_bytes());
  for (size_t e = 0; e < entries_.size(); ++e) {
    const Shape& shape = entries_[e].tensor.shape();
    const int64_t row_bytes =
        std::max<int64_t>(1, shape.heads * shape.dim * DTypeSize(wire_dtype_));
    const int64_t rows_per_chunk =
        std::max<int64_t>(1, chunk_bytes / row_bytes);
    for (int64_t b = 0; b < shape.batch; ++b) {
      for (int64_t token = 0; token < shape.seq; token += rows_per_chunk) {
        places_.push_back(
            {e, b, token, std::min(rows_per_chunk, shape.seq - token)});
      }
    }
  }
}

bool ChunkStream::Next(v1::TensorChunk* chunk) {
  Plan();
  if (next_ == places_.size()) return false;
  Fill(static_cast<int64_t>(next_++), chunk);
  return true;
}

int64_t ChunkStream::chunk_count() {
  Plan();
  return static_cast<int64_t>(places_.size());
}

void ChunkStream::Fill(int64_t index, v1::TensorChunk* chunk) const {
  const Place& place = places_[static_cast<size_t>(index)];
  const Entry& entry = entries_[place.entry];
  const Shape& shape = entry.tensor.shape();
  const int64_t row_values = shape.heads * shape.dim;
  const int64_t row_bytes = row_values * DTypeSize(wire_dtype_);
  chunk->set_tensor(entry.name);
  chunk->set_batch(place.batch);
  chunk->set_token_offset(place.token);
  chunk->set_token_count(place.rows);
  std::string* data = chunk->mutable_data();
  data->resize(static_cast<size_t>(place.rows * row_bytes));
  for (int64_t r = 0; r < place.rows; ++r) {
    ConvertFromFloat(wire_dtype_,
                     entry.tensor.Row(place.batch, place.token + r, 0),
                     data->data() + r * row_bytes, row_values);
  }
}

int64_t ChunkStream::total_bytes() const {
  int64_t total = 0;
  for (const Entry& entry : entries_) {
    total += entry.tensor.shape().NumElements() * DTypeSize(wire_dtype_);
  }
  return total;
}

std::vector<v1::TensorChunk> SplitTensor(v1::TensorName name,
                                         View<const float> tensor,
                                         DType wire_dtype,
                                         int64_t chunk_bytes) {
  ChunkStream stream(wire_dtype, chunk_bytes);
  stream.Add(name, tensor);
  std::vector<v1::TensorChunk> chunks;
  v1::TensorChunk chunk;
  while (stream.Next(&chunk)) chunks.push_back(chunk);
  return chunks;
}

OutputAssembler::OutputAssembler(Shape shape, bool with_lse, DType dtype)
    : shape_(shape),
      with_lse_(with_lse),
      dtype_(dtype),
      output_(shape),
      lse_(with_lse ? shape.batch * shape.heads * shape.seq : 0),
      received_(shape.batch * shape.seq, false) {}

OutputAssembler::OutputAssembler(Shape shape, bool with_lse, DType dtype,
                                 Consumer consumer)
    : shape_(shape),
      with_lse_(with_lse),
      dtype_(dtype),
      consumer_(std::move(consumer)),
      received_(shape.batch * shape.seq, false) {}

absl::Status OutputAssembler::Add(const v1::OutputChunk& chunk) {
  const int64_t batch = chunk.batch();
  const int64_t offset = chunk.token_offset();
  const int64_t count = chunk.token_count();
  // Named by count, not by offset + count, which could overflow.
  const std::string rows = absl::StrCat(count, " output rows from token ",
                                        offset, " of batch entry ", batch);
  if (batch < 0 || batch >= shape_.batch || offset < 0 || count < 1 ||
      offset > shape_.seq - count) {
    return absl::InternalError(absl::StrCat(
        "the server sent ", rows, ", outside the output of ", shape_.batch,
        " batch entries of ", shape_.seq, " tokens"));
  }
  const int64_t row_values = shape_.heads * shape_.dim;
  const size_t data_bytes = count * row_values * DTypeSize(dtype_);
  if (chunk.data().size() != data_bytes) {
    return absl::InternalError(
        absl::StrCat("the server sent ", rows, " with ", chunk.data().size(),
                     " data bytes, expected ", data_bytes));
  }
  const size_t lse_bytes = with_lse_ ? count * shape_.heads * sizeof(float) : 0;
  if (chunk.lse().size() != lse_bytes) {
    return absl::InternalError(
        absl::StrCat("the server sent ", rows, " with ", chunk.lse().size(),
                     " LSE bytes, expected ", lse_bytes,
                     with_lse_ ? "" : " (LSE was not asked for)"));
  }
  const int64_t first = batch * shape_.seq + offset;
  for (int64_t row = first; row < first + count; ++row) {
    if (received_[row]) {
      return absl::InternalError(absl::StrCat(
          "the server sent output row ", row - batch * shape_.seq,
          " of batch entry ", batch, " twice (again in ", rows, ")"));
    }
  }
  std::fill(received_.begin() + first, received_.begin() + first + count, true);
  rows_received_ += count;
  bytes_received_ += data_bytes + lse_bytes;
  if (consumer_) return consumer_(chunk);
  ConvertToFloat(dtype_, chunk.data().data(),
                 output_.data() + first * row_values, count * row_values);
  for (int64_t h = 0; h < shape_.heads && with_lse_; ++h) {
    std::memcpy(lse_.data() + (batch * shape_.heads + h) * shape_.seq + offset,
                chunk.lse().data() + h * count * sizeof(float),
                count * sizeof(float));
  }
  return absl::OkStatus();
}

absl::Status OutputAssembler::CheckComplete() const {
  const int64_t rows = shape_.batch * shape_.seq;
  if (rows_received_ == rows) return absl::OkStatus();
  const int64_t first =
      std::find(received_.begin(), received_.end(), false) - received_.begin();
  return absl::DataLossError(absl::StrCat(
      "the server's output is missing ", rows - rows_received_, " of ", rows,
      " token rows (the first: token ", first % shape_.seq, " of batch entry ",
      first / shape_.seq, ")"));
}

int64_t OutputAssembler::total_bytes() const {
  const int64_t lse_values =
      with_lse_ ? shape_.batch * shape_.heads * shape_.seq : 0;
  return shape_.NumElements() * DTypeSize(dtype_) +
         lse_values * static_cast<int64_t>(sizeof(float));
}

}  // namespace ringattn
