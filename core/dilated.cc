#include "core/dilated.h"

#include <algorithm>

namespace ringattn {

Range HeadGroup(int64_t num_heads, int64_t num_groups, int64_t group) {
  const int64_t base = num_heads / num_groups;
  const int64_t larger = num_heads % num_groups;
  const int64_t begin = group * base + std::min(group, larger);
  return Range{begin, begin + base + (group < larger ? 1 : 0)};
}

bool HeadTakesBranch(const AttentionSpec& spec, int64_t branch, int64_t head) {
  if (spec.combine == DilatedCombine::kLse) return true;
  const Range group = HeadGroup(
      spec.q_heads, static_cast<int64_t>(spec.dilated.size()), branch);
  return head >= group.begin && head < group.end;
}

int64_t DilatedOffset(const AttentionSpec& spec, int64_t branch, int64_t head) {
  const int64_t dilation = spec.dilated[branch].dilation;
  return (spec.combine == DilatedCombine::kLse ? head : branch) % dilation;
}

Range SegmentOf(const DilatedBranch& branch, int64_t seq_len,
                int64_t position) {
  const int64_t begin =
      position / branch.segment_length * branch.segment_length;
  return Range{begin, std::min(begin + branch.segment_length, seq_len)};
}

KeptPositions KeptIn(const Range& segment, int64_t dilation, int64_t offset,
                     const Range& window) {
  const Range part = segment.Intersect(window);
  KeptPositions kept;
  kept.stride = dilation;
  if (part.empty()) return kept;
  const int64_t origin = segment.begin + offset;  // the segment's first kept
  const int64_t skip = part.begin <= origin
                           ? 0
                           : (part.begin - origin + dilation - 1) / dilation;
  kept.first = origin + skip * dilation;
  if (kept.first < part.end) {
    kept.count = (part.end - 1 - kept.first) / dilation + 1;
  }
  return kept;
}

std::vector<Range> SegmentsIn(const DilatedBranch& branch, int64_t seq_len,
                              const Range& window) {
  std::vector<Range> segments;
  for (int64_t p = window.begin; p < window.end;) {
    const Range segment = SegmentOf(branch, seq_len, p);
    segments.push_back(segment);
    p = segment.end;
  }
  return segments;
}

}  // namespace ringattn
