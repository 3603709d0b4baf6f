#include "worker/held_positions.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace ringattn {

int64_t HeldPositions::rows() const {
  return pieces_.empty()
             ? 0
             : pieces_.back().first_row + pieces_.back().positions.size();
}

absl::Status HeldPositions::CheckAppend(const std::string& name,
                                        Range positions) const {
  if (pieces_.empty() || positions.begin >= pieces_.back().positions.end) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "context '", name, "' holds positions up to ",
      pieces_.back().positions.end,
      " on this worker; a worker takes new rows only after those, got [",
      positions.begin, ", ", positions.end, ")"));
}

void HeldPositions::Append(Range positions) {
  if (!pieces_.empty() && pieces_.back().positions.end == positions.begin) {
    // Its rows follow the last piece's too: one piece, however many appends.
    pieces_.back().positions.end = positions.end;
    return;
  }
  pieces_.push_back(Piece{positions, rows()});
}

void HeldPositions::DropFrom(int64_t keep_length) {
  while (!pieces_.empty() && pieces_.back().positions.begin >= keep_length) {
    pieces_.pop_back();
  }
  if (!pieces_.empty() && pieces_.back().positions.end > keep_length) {
    pieces_.back().positions.end = keep_length;
  }
}

const HeldPositions::Piece* HeldPositions::PieceHolding(
    int64_t position) const {
  auto piece = std::upper_bound(
      pieces_.begin(), pieces_.end(), position,
      [](int64_t p, const Piece& piece) { return p < piece.positions.begin; });
  if (piece == pieces_.begin()) return nullptr;
  --piece;
  return position < piece->positions.end ? &*piece : nullptr;
}

int64_t HeldPositions::RowOf(int64_t position) const {
  const Piece* piece = PieceHolding(position);
  return piece == nullptr
             ? -1
             : piece->first_row + position - piece->positions.begin;
}

absl::StatusOr<Range> HeldPositions::RowsOf(
    const std::string& name, const std::vector<Range>& chunks) const {
  int64_t first = -1;
  int64_t rows = 0;
  for (const Range& chunk : chunks) {
    if (chunk.empty()) continue;
    const int64_t begin = RowOf(chunk.begin);
    const int64_t last = RowOf(chunk.end - 1);
    if (begin < 0 || last < 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("context '", name, "' positions [", chunk.begin, ", ",
                       chunk.end, ") are not all held by this worker"));
    }
    if (last - begin != chunk.size() - 1 ||
        (first >= 0 && begin != first + rows)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "context '", name, "' positions [", chunk.begin, ", ", chunk.end,
          ") are not the rows that follow the query's previous ones here"));
    }
    if (first < 0) first = begin;
    rows += chunk.size();
  }
  first = std::max<int64_t>(first, 0);
  return Range{first, first + rows};
}

absl::StatusOr<std::vector<HeldPositions::RowRun>> HeldPositions::RunsOf(
    const std::string& name, Range positions) const {
  std::vector<RowRun> runs;
  for (int64_t p = positions.begin; p < positions.end;) {
    const Piece* piece = PieceHolding(p);
    if (piece == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "context '", name, "' position ", p, " is not held by this worker"));
    }
    const int64_t end = std::min(positions.end, piece->positions.end);
    runs.push_back(
        RowRun{piece->first_row + p - piece->positions.begin, end - p});
    p = end;
  }
  return runs;
}

}  // namespace ringattn
