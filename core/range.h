#ifndef RINGATTN_CORE_RANGE_H_
#define RINGATTN_CORE_RANGE_H_

// A half-open range [begin, end) of sequence positions.

#include <algorithm>
#include <cstdint>

namespace ringattn {

struct Range {
  int64_t begin = 0;
  int64_t end = 0;

  int64_t size() const { return end - begin; }
  bool empty() const { return end <= begin; }
  Range Intersect(const Range& other) const {
    return Range{std::max(begin, other.begin), std::min(end, other.end)};
  }
  friend bool operator==(const Range& a, const Range& b) {
    return a.begin == b.begin && a.end == b.end;
  }
};

}  // namespace ringattn

#endif  // RINGATTN_CORE_RANGE_H_
