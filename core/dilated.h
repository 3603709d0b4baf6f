#ifndef RINGATTN_CORE_DILATED_H_
#define RINGATTN_CORE_DILATED_H_

// The positions each head keeps in each branch of dilated (LongNet) attention,
// as DESIGN.md defines them. Attention in a branch runs among the kept
// positions of one segment: `first, first + stride, ...` below `end`.

#include <cstdint>
#include <vector>

#include "core/attention_spec.h"
#include "core/range.h"

namespace ringattn {

// Whether query head `head` takes part in branch `branch` (every head does
// under kLse; under kHeadGroups only the heads of group `branch`).
bool HeadTakesBranch(const AttentionSpec& spec, int64_t branch, int64_t head);

// The offset, within each segment, of the first position head `head` keeps in
// branch `branch`: head % dilation under kLse, branch % dilation under
// kHeadGroups.
int64_t DilatedOffset(const AttentionSpec& spec, int64_t branch, int64_t head);

// The heads of group `group` under kHeadGroups: contiguous groups of H / G
// heads, the first H % G groups one larger.
Range HeadGroup(int64_t num_heads, int64_t num_groups, int64_t group);

// The segment of `branch` that holds position `position`.
Range SegmentOf(const DilatedBranch& branch, int64_t seq_len, int64_t position);

// Kept positions of one segment inside a window: first + t * stride for t in
// [0, count).
struct KeptPositions {
  int64_t first = 0;
  int64_t stride = 1;
  int64_t count = 0;
};

// The positions of `window` that lie in `segment` and that a head with `offset`
// keeps under `dilation`.
KeptPositions KeptIn(const Range& segment, int64_t dilation, int64_t offset,
                     const Range& window);

// The segments of `branch` that intersect `window`, in order.
std::vector<Range> SegmentsIn(const DilatedBranch& branch, int64_t seq_len,
                              const Range& window);

}  // namespace ringattn

#endif  // RINGATTN_CORE_DILATED_H_
