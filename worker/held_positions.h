#ifndef RINGATTN_WORKER_HELD_POSITIONS_H_
#define RINGATTN_WORKER_HELD_POSITIONS_H_

// HeldPositions: which positions of one resident context a worker holds and
// where their rows lie. Pieces (runs of consecutive positions the uploads
// gave the worker; an append that follows on extends the last) come in
// position order and their rows follow one another from row 0, so a query's
// chunks of this worker are one run of rows. The context stores keep one per
// context beside the buffers the rows are in. Thread-compatible.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/range.h"

namespace ringattn {

class HeldPositions {
 public:
  // Rows held: those of the pieces.
  int64_t rows() const;
  bool empty() const { return pieces_.empty(); }

  // INVALID_ARGUMENT (naming context `name`) unless `positions` come after
  // every position held.
  absl::Status CheckAppend(const std::string& name, Range positions) const;
  // Holds `positions` (CheckAppend passed) in the rows after the last.
  void Append(Range positions);
  // Forgets the positions from `keep_length` on (an undone append).
  void DropFrom(int64_t keep_length);

  // The row of `position`, or -1 if it is not held.
  int64_t RowOf(int64_t position) const;
  // The rows of `chunks` (positions, in order), which must be one run.
  // FAILED_PRECONDITION (naming context `name`) if some position is not held
  // or the chunks skip held rows.
  absl::StatusOr<Range> RowsOf(const std::string& name,
                               const std::vector<Range>& chunks) const;
  // The rows of `positions` piece by piece: (first row, count) runs, in
  // order. FAILED_PRECONDITION (naming context `name`) if some position is
  // not held.
  struct RowRun {
    int64_t row;
    int64_t count;
  };
  absl::StatusOr<std::vector<RowRun>> RunsOf(const std::string& name,
                                             Range positions) const;

 private:
  struct Piece {
    Range positions;
    int64_t first_row = 0;  // where its rows start
  };

  // The piece holding `position`, or null.
  const Piece* PieceHolding(int64_t position) const;

  std::vector<Piece> pieces_;  // in position order
};

}  // namespace ringattn

#endif  // RINGATTN_WORKER_HELD_POSITIONS_H_
