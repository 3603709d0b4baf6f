#include "core/block_mask.h"

#include <limits>

#include "gtest/gtest.h"

namespace ringattn {
namespace {

BlockSparseRules Rules(int64_t block_size) {
  BlockSparseRules rules;
  rules.block_size = block_size;
  return rules;
}

TEST(BlockMask, LastBlockMayBeShort) {
  BlockSparseRules rules = Rules(10);
  rules.local = 0;
  const BlockMask mask = BlockMask::FromRules(rules, 95);
  EXPECT_EQ(mask.num_blocks(), 10);
  EXPECT_EQ(mask.CountAllowed(), 10);
}

TEST(BlockMask, BlockLongerThanTheSequenceIsOneBlock) {
  BlockSparseRules rules = Rules(std::numeric_limits<int64_t>::max());
  rules.local = 0;
  const BlockMask mask = BlockMask::FromRules(rules, 95);
  EXPECT_EQ(mask.num_blocks(), 1);
  EXPECT_TRUE(mask.Allowed(0, 0));
}

TEST(BlockMask, LocalAllowsBand) {
  BlockSparseRules rules = Rules(4);
  rules.local = 1;
  const BlockMask mask = BlockMask::FromRules(rules, 32);
  for (int64_t i = 0; i < 8; ++i) {
    for (int64_t j = 0; j < 8; ++j) {
      EXPECT_EQ(mask.Allowed(i, j), std::abs(i - j) <= 1) << i << "," << j;
    }
  }
}

TEST(BlockMask, GlobalAllowsFirstRowsAndColumns) {
  BlockSparseRules rules = Rules(4);
  rules.global = 2;
  const BlockMask mask = BlockMask::FromRules(rules, 32);
  for (int64_t i = 0; i < 8; ++i) {
    for (int64_t j = 0; j < 8; ++j) {
      EXPECT_EQ(mask.Allowed(i, j), i < 2 || j < 2) << i << "," << j;
    }
  }
}

TEST(BlockMask, DilatedAllowsEveryRthDiagonal) {
  BlockSparseRules rules = Rules(4);
  rules.dilated = 3;
  const BlockMask mask = BlockMask::FromRules(rules, 40);
  for (int64_t i = 0; i < 10; ++i) {
    for (int64_t j = 0; j < 10; ++j) {
      EXPECT_EQ(mask.Allowed(i, j), (i - j) % 3 == 0) << i << "," << j;
    }
  }
}

TEST(BlockMask, RandomDrawsDistinctBlocksDeterministically) {
  BlockSparseRules rules = Rules(8);
  rules.random = 3;
  rules.seed = 7;
  const BlockMask a = BlockMask::FromRules(rules, 160);
  const BlockMask b = BlockMask::FromRules(rules, 160);
  for (int64_t i = 0; i < a.num_blocks(); ++i) {
    int64_t row = 0;
    for (int64_t j = 0; j < a.num_blocks(); ++j) {
      row += a.Allowed(i, j);
      EXPECT_EQ(a.Allowed(i, j), b.Allowed(i, j));
    }
    EXPECT_EQ(row, 3) << "query block " << i;
  }
  rules.seed = 8;
  const BlockMask c = BlockMask::FromRules(rules, 160);
  int64_t differ = 0;
  for (int64_t i = 0; i < a.num_blocks(); ++i) {
    for (int64_t j = 0; j < a.num_blocks(); ++j) {
      differ += a.Allowed(i, j) != c.Allowed(i, j);
    }
  }
  EXPECT_GT(differ, 0) << "another seed should draw other blocks";
}

TEST(BlockMask, RandomCapsAtNumberOfBlocks) {
  BlockSparseRules rules = Rules(8);
  rules.random = 100;
  EXPECT_EQ(BlockMask::FromRules(rules, 20).CountAllowed(), 9);
}

TEST(BlockMask, ExplicitPairsAndUnion) {
  BlockSparseRules rules = Rules(10);
  rules.pairs = {{0, 3}, {2, 1}};
  rules.local = 0;
  const BlockMask mask = BlockMask::FromRules(rules, 40);
  EXPECT_TRUE(mask.Allowed(0, 3));
  EXPECT_TRUE(mask.Allowed(2, 1));
  EXPECT_FALSE(mask.Allowed(3, 0));
  EXPECT_EQ(mask.CountAllowed(), 4 + 2);
}

TEST(BlockMask, AnyAllowedLooksAtEveryOverlappingBlock) {
  BlockSparseRules rules = Rules(10);
  rules.pairs = {{2, 3}};
  const BlockMask mask = BlockMask::FromRules(rules, 50);
  EXPECT_TRUE(mask.AnyAllowed(25, 26, 39, 41));
  EXPECT_FALSE(mask.AnyAllowed(0, 20, 0, 50));
  EXPECT_FALSE(mask.AnyAllowed(20, 30, 40, 50));
  EXPECT_FALSE(mask.AnyAllowed(20, 20, 30, 40));
}

}  // namespace
}  // namespace ringattn
