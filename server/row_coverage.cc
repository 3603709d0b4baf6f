#include "server/row_coverage.h"

namespace ringattn {

std::optional<Range> RowCoverage::Mark(int64_t begin, int64_t end) {
  for (int64_t r = begin; r < end; ++r) {
    if (!seen_[r]) continue;
    int64_t last = r;
    while (last + 1 < end && seen_[last + 1]) ++last;
    return Range{r, last + 1};
  }
  for (int64_t r = begin; r < end; ++r) seen_[r] = true;
  return std::nullopt;
}

std::optional<Range> RowCoverage::FirstMissing() const {
  const int64_t rows = static_cast<int64_t>(seen_.size());
  for (int64_t r = 0; r < rows; ++r) {
    if (seen_[r]) continue;
    int64_t last = r;
    while (last + 1 < rows && !seen_[last + 1]) ++last;
    return Range{r, last + 1};
  }
  return std::nullopt;
}

}  // namespace ringattn
