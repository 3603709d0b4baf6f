#include "core/shard_layout.h"

#include <vector>

#include "gtest/gtest.h"

namespace ringattn {
namespace {

// Every position is held by exactly one worker, at the row Locate reports.
void ExpectPartition(const ShardLayout& layout) {
  std::vector<int> seen(static_cast<size_t>(layout.seq_len()), 0);
  int64_t smallest = layout.seq_len(), largest = 0;
  for (int64_t w = 0; w < layout.num_workers(); ++w) {
    int64_t row = 0;
    for (const Range& chunk : layout.Chunks(w)) {
      for (int64_t p = chunk.begin; p < chunk.end; ++p, ++row) {
        ++seen[p];
        const ShardLayout::Location at = layout.Locate(p);
        EXPECT_EQ(at.worker, w);
        EXPECT_EQ(at.row, row);
      }
    }
    EXPECT_EQ(row, layout.ShardLength(w));
    smallest = std::min(smallest, row);
    largest = std::max(largest, row);
  }
  for (int64_t p = 0; p < layout.seq_len(); ++p) EXPECT_EQ(seen[p], 1) << p;
  // Balanced: contiguous within one position, zigzag within two.
  EXPECT_LE(largest - smallest,
            layout.kind() == ShardKind::kContiguous ? 1 : 2);
}

TEST(ShardLayout, PartitionsAnyLengthOverAnyWorkerCount) {
  for (ShardKind kind : {ShardKind::kContiguous, ShardKind::kZigzag}) {
    for (int64_t n : {1, 2, 7, 16, 257, 1000}) {
      for (int64_t p : {1, 2, 3, 5, 8, 13}) {
        SCOPED_TRACE(testing::Message() << "N=" << n << " p=" << p);
        ExpectPartition(ShardLayout::Make(kind, n, p));
      }
    }
  }
}

TEST(ShardLayout, ZigzagPairsChunkIWithMirrorChunk) {
  const ShardLayout layout = ShardLayout::Make(ShardKind::kZigzag, 80, 4);
  ASSERT_EQ(layout.Chunks(0).size(), 2u);
  EXPECT_EQ(layout.Chunks(0)[0], (Range{0, 10}));
  EXPECT_EQ(layout.Chunks(0)[1], (Range{70, 80}));
  EXPECT_EQ(layout.Chunks(3)[0], (Range{30, 40}));
  EXPECT_EQ(layout.Chunks(3)[1], (Range{40, 50}));
}

// A world of one (broadcast-Q's queries) holds one run, so its tasks read
// the keys once, not once per half.
TEST(ShardLayout, ZigzagOverOneWorkerIsOneRun) {
  const ShardLayout layout = ShardLayout::Make(ShardKind::kZigzag, 17, 1);
  ASSERT_EQ(layout.Chunks(0).size(), 1u);
  EXPECT_EQ(layout.Chunks(0)[0], (Range{0, 17}));
}

TEST(ShardLayout, FewerPositionsThanWorkersLeavesSomeEmpty) {
  const ShardLayout layout = ShardLayout::Make(ShardKind::kContiguous, 3, 8);
  EXPECT_EQ(layout.ShardLength(0), 1);
  EXPECT_EQ(layout.ShardLength(2), 1);
  EXPECT_EQ(layout.ShardLength(3), 0);
  EXPECT_EQ(layout.ShardLength(7), 0);
}

TEST(ShardLayout, ExplicitChunksMustPartitionTheSequence) {
  const ShardLayout good =
      ShardLayout::FromChunks(10, {{{0, 3}, {7, 8}}, {{3, 7}, {8, 10}}});
  EXPECT_TRUE(good.Validate().ok());
  EXPECT_EQ(good.Locate(7).worker, 0);
  EXPECT_EQ(good.Locate(7).row, 3);
  const ShardLayout twice = ShardLayout::FromChunks(10, {{{0, 6}}, {{5, 10}}});
  EXPECT_NE(twice.Validate().message().find("position 5"), std::string::npos);
  const ShardLayout gap = ShardLayout::FromChunks(10, {{{0, 4}}, {{5, 10}}});
  EXPECT_NE(gap.Validate().message().find("position 4 is held by no worker"),
            std::string::npos);
}

}  // namespace
}  // namespace ringattn
