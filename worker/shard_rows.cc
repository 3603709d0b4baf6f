#include "worker/shard_rows.h"

#include "absl/strings/str_cat.h"

namespace ringattn {

ShardRowsTarget::ShardRowsTarget(const char* name, TypedView rows,
                                 const ShardLayout* layout, int rank)
    : name_(name),
      rows_(rows),
      layout_(layout),
      rank_(rank),
      arrived_(static_cast<size_t>(rows.shape().batch * rows.shape().seq),
               false),
      missing_(rows.shape().batch * rows.shape().seq) {}

int64_t ShardRowsTarget::LocalRow(int64_t position) const {
  int64_t row = 0;
  for (const Range& chunk : layout_->Chunks(rank_)) {
    if (position >= chunk.begin && position < chunk.end) {
      return row + position - chunk.begin;
    }
    row += chunk.size();
  }
  return -1;
}

absl::Status ShardRowsTarget::Place(const v1::ShardRows& rows,
                                    DType wire_dtype) {
  absl::StatusOr<std::vector<int64_t>> slots = Claim(rows, wire_dtype);
  if (!slots.ok()) return slots.status();
  Store(rows, wire_dtype, *slots);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> ShardRowsTarget::Claim(
    const v1::ShardRows& rows, DType wire_dtype) {
  const Shape& shape = rows_.shape();
  const int64_t seq_len = layout_->seq_len();
  if (rows.batch() < 0 || rows.batch() >= shape.batch) {
    return absl::InvalidArgumentError(
        absl::StrCat("ShardRows of ", name_, ": batch ", rows.batch(),
                     " is outside [0, ", shape.batch, ")"));
  }
  const bool listed = rows.positions_size() > 0;
  const int64_t count = listed ? rows.positions_size() : rows.count();
  if (listed && rows.count() != 0 && rows.count() != count) {
    return absl::InvalidArgumentError(
        absl::StrCat("ShardRows of ", name_, ": count ", rows.count(),
                     " disagrees with the ", count, " positions listed"));
  }
  if (!listed && (count < 0 || rows.first_position() < 0 ||
                  rows.first_position() > seq_len - count)) {
    // Named by count, not by their end, which could overflow.
    return absl::InvalidArgumentError(absl::StrCat(
        "ShardRows of ", name_, ": ", count, " rows from position ",
        rows.first_position(), " are outside [0, ", seq_len, ")"));
  }
  const int64_t values_per_row = shape.heads * shape.dim;
  const int64_t row_bytes = values_per_row * DTypeSize(wire_dtype);
  if (static_cast<int64_t>(rows.data().size()) != count * row_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("ShardRows of ", name_, " batch ", rows.batch(), " holds ",
                     rows.data().size(), " bytes, but ", count, " rows of ",
                     shape.heads, " x ", shape.dim, " ", DTypeName(wire_dtype),
                     " values take ", count * row_bytes, " bytes"));
  }
  std::vector<int64_t> slots;
  slots.reserve(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    const int64_t position = listed ? rows.positions(static_cast<int>(i))
                                    : rows.first_position() + i;
    if (position < 0 || position >= seq_len) {
      return absl::InvalidArgumentError(
          absl::StrCat("ShardRows of ", name_, ": position ", position,
                       " is outside [0, ", seq_len, ")"));
    }
    const int64_t row = LocalRow(position);
    if (row < 0) {
      const int64_t owner = layout_->Locate(position).worker;
      return absl::InvalidArgumentError(absl::StrCat(
          "ShardRows of ", name_, ": position ", position,
          owner < 0 ? " is not part of this upload"
                    : absl::StrCat(" belongs to rank ", owner,
                                   ", not to this worker (rank ", rank_, ")")));
    }
    const size_t slot = static_cast<size_t>(rows.batch() * shape.seq + row);
    if (arrived_[slot]) {
      return absl::InvalidArgumentError(
          absl::StrCat("duplicate row: ", name_, " batch ", rows.batch(),
                       " position ", position, " arrived twice"));
    }
    arrived_[slot] = true;
    --missing_;
    slots.push_back(static_cast<int64_t>(slot));
  }
  return slots;
}

void ShardRowsTarget::Store(const v1::ShardRows& rows, DType wire_dtype,
                            const std::vector<int64_t>& slots) const {
  const Shape& shape = rows_.shape();
  const int64_t values_per_row = shape.heads * shape.dim;
  const int64_t row_bytes = values_per_row * DTypeSize(wire_dtype);
  for (size_t i = 0; i < slots.size(); ++i) {
    ConvertDType(wire_dtype, rows.data().data() + i * row_bytes, rows_.dtype(),
                 rows_.Row(slots[i] / shape.seq, slots[i] % shape.seq),
                 values_per_row);
  }
}

void ShardRowsTarget::MarkAllArrived() {
  arrived_.assign(arrived_.size(), true);
  missing_ = 0;
}

absl::Status ShardRowsTarget::CheckComplete() const {
  if (missing_ == 0) return absl::OkStatus();
  const int64_t n = rows_.shape().seq;
  for (int64_t b = 0; b < rows_.shape().batch; ++b) {
    int64_t row = 0;
    for (const Range& chunk : layout_->Chunks(rank_)) {
      for (int64_t p = chunk.begin; p < chunk.end; ++p, ++row) {
        if (arrived_[static_cast<size_t>(b * n + row)]) continue;
        return absl::InvalidArgumentError(absl::StrCat(
            "missing rows: ", missing_, " rows of ", name_,
            " in this worker's shard never arrived (the first: batch ", b,
            " position ", p, "); send every row before finishing"));
      }
    }
  }
  return absl::InternalError("row accounting is inconsistent");
}

}  // namespace ringattn
