#ifndef RINGATTN_SERVER_ROW_COVERAGE_H_
#define RINGATTN_SERVER_ROW_COVERAGE_H_

// RowCoverage: which token rows of one tensor (one batch entry) have arrived,
// so that duplicate, overlapping and missing chunks are caught. Kept as
// disjoint runs of arrived rows, so marking and checking cost the log of the
// number of runs, not the number of rows (a resident context's millions of
// rows are marked at once on every query). Thread-compatible.

#include <cstdint>
#include <map>
#include <optional>

#include "core/range.h"

namespace ringattn {

class RowCoverage {
 public:
  explicit RowCoverage(int64_t rows) : rows_(rows) {}

  // Marks rows [begin, end) as arrived. Returns the first already-arrived run
  // inside them, if any (and then marks nothing).
  std::optional<Range> Mark(int64_t begin, int64_t end);
  // The first run of rows that has not arrived, if any.
  std::optional<Range> FirstMissing() const;

 private:
  int64_t rows_;
  std::map<int64_t, int64_t> runs_;  // first row -> end; disjoint, not adjacent
};

}  // namespace ringattn

#endif  // RINGATTN_SERVER_ROW_COVERAGE_H_
