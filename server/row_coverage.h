#ifndef RINGATTN_SERVER_ROW_COVERAGE_H_
#define RINGATTN_SERVER_ROW_COVERAGE_H_

// RowCoverage: which token rows of one tensor (one batch entry) have arrived,
// so that duplicate, overlapping and missing chunks are caught.
// Thread-compatible.

#include <cstdint>
#include <optional>
#include <vector>

#include "core/range.h"

namespace ringattn {

class RowCoverage {
 public:
  explicit RowCoverage(int64_t rows)
      : seen_(static_cast<size_t>(rows), false) {}

  // Marks rows [begin, end) as arrived. Returns the first already-arrived run
  // inside them, if any (and then marks nothing).
  std::optional<Range> Mark(int64_t begin, int64_t end);
  // The first run of rows that has not arrived, if any.
  std::optional<Range> FirstMissing() const;

 private:
  std::vector<bool> seen_;
};

}  // namespace ringattn

#endif  // RINGATTN_SERVER_ROW_COVERAGE_H_
