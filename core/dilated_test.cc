#include "core/dilated.h"

#include "gtest/gtest.h"

namespace ringattn {
namespace {

TEST(Dilated, HeadGroupsGiveExtraHeadsToFirstGroups) {
  // 8 heads in 3 groups: sizes 3, 3, 2.
  EXPECT_EQ(HeadGroup(8, 3, 0), (Range{0, 3}));
  EXPECT_EQ(HeadGroup(8, 3, 1), (Range{3, 6}));
  EXPECT_EQ(HeadGroup(8, 3, 2), (Range{6, 8}));
  EXPECT_EQ(HeadGroup(4, 4, 3), (Range{3, 4}));
}

TEST(Dilated, OffsetFollowsCombineMode) {
  AttentionSpec spec;
  spec.q_heads = 8;
  spec.dilated = {{8, 1}, {16, 2}, {32, 4}};
  EXPECT_EQ(DilatedOffset(spec, 2, 7), 3);  // LSE: head % r
  EXPECT_TRUE(HeadTakesBranch(spec, 0, 7));
  spec.combine = DilatedCombine::kHeadGroups;
  EXPECT_EQ(DilatedOffset(spec, 2, 7), 2);  // HEAD_GROUPS: branch % r
  EXPECT_TRUE(HeadTakesBranch(spec, 2, 7));
  EXPECT_FALSE(HeadTakesBranch(spec, 0, 7));
}

TEST(Dilated, LastSegmentMayBeShort) {
  const DilatedBranch branch{10, 3};
  EXPECT_EQ(SegmentOf(branch, 25, 24), (Range{20, 25}));
  const std::vector<Range> segments = SegmentsIn(branch, 25, Range{5, 25});
  ASSERT_EQ(segments.size(), 3u);
  EXPECT_EQ(segments[2], (Range{20, 25}));
}

TEST(Dilated, KeptPositionsInsideAWindow) {
  // Segment [20, 40), dilation 3, offset 2: kept 22, 25, 28, 31, 34, 37.
  const KeptPositions all = KeptIn(Range{20, 40}, 3, 2, Range{0, 100});
  EXPECT_EQ(all.first, 22);
  EXPECT_EQ(all.count, 6);
  const KeptPositions part = KeptIn(Range{20, 40}, 3, 2, Range{26, 35});
  EXPECT_EQ(part.first, 28);
  EXPECT_EQ(part.count, 3);
  EXPECT_EQ(KeptIn(Range{20, 40}, 3, 2, Range{29, 31}).count, 0);
  EXPECT_EQ(KeptIn(Range{20, 40}, 3, 2, Range{40, 50}).count, 0);
}

}  // namespace
}  // namespace ringattn
