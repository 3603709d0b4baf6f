#include "server/row_coverage.h"

#include <algorithm>
#include <iterator>

namespace ringattn {

std::optional<Range> RowCoverage::Mark(int64_t begin, int64_t end) {
  if (begin >= end) return std::nullopt;
  // The first run that ends after `begin`: the only one that can overlap
  // [begin, end) first, or touch it from the left.
  auto after = runs_.upper_bound(begin);
  if (after != runs_.begin() && std::prev(after)->second > begin) {
    return Range{begin, std::min(std::prev(after)->second, end)};
  }
  if (after != runs_.end() && after->first < end) {
    return Range{after->first, std::min(after->second, end)};
  }
  // Joins the neighbouring runs it touches.
  int64_t first = begin;
  int64_t last = end;
  if (after != runs_.begin() && std::prev(after)->second == begin) {
    first = std::prev(after)->first;
    runs_.erase(std::prev(after));
  }
  if (after != runs_.end() && after->first == end) {
    last = after->second;
    runs_.erase(after);
  }
  runs_[first] = last;
  return std::nullopt;
}

std::optional<Range> RowCoverage::FirstMissing() const {
  int64_t at = 0;
  for (const auto& [first, last] : runs_) {
    if (first > at) return Range{at, first};
    at = last;
  }
  if (at < rows_) return Range{at, rows_};
  return std::nullopt;
}

}  // namespace ringattn
