#include "worker/attention_tiles.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace ringattn {
namespace {

AttentionTile Rows(int64_t q_row, int64_t q_len, int64_t k_row = 0) {
  AttentionTile tile;
  tile.q_row = q_row;
  tile.q_len = q_len;
  tile.k_row = k_row;
  tile.kv_len = 64;
  return tile;
}

std::vector<bool> FreshFlags(
    const std::vector<std::vector<AttentionTile>>& steps) {
  std::vector<bool> flags;
  for (const std::vector<AttentionTile>& step : steps) {
    for (const AttentionTile& tile : step) flags.push_back(tile.fresh);
  }
  return flags;
}

// A zigzag rank on two workers: its own step is one tile over all its rows,
// the next step's tile covers half of them.
TEST(MarkFreshTilesTest, MarksTheFirstStepsTileWhereItCoversEveryRow) {
  std::vector<std::vector<AttentionTile>> steps = {{Rows(0, 100)},
                                                   {Rows(50, 50)}};
  EXPECT_TRUE(MarkFreshTiles(100, steps));
  EXPECT_EQ(FreshFlags(steps), (std::vector<bool>{true, false}));
}

// Rows cut into pieces, each against key tiles: the first key tile of each
// piece stores, wherever in the order the pieces come.
TEST(MarkFreshTilesTest, MarksTheFirstTileOfEveryRowPieceInLaunchOrder) {
  std::vector<std::vector<AttentionTile>> steps = {
      {Rows(40, 30, 0), Rows(0, 40, 0), Rows(40, 30, 64), Rows(0, 40, 64)},
      {Rows(70, 13, 0), Rows(0, 83, 0)}};
  EXPECT_TRUE(MarkFreshTiles(83, steps));
  EXPECT_EQ(FreshFlags(steps),
            (std::vector<bool>{true, true, false, false, true, false}));
}

// A tile over rows both written and unwritten before it would fold into
// rows nobody cleared: nothing is marked.
TEST(MarkFreshTilesTest, RefusesATileStraddlingWrittenAndUnwrittenRows) {
  std::vector<std::vector<AttentionTile>> steps = {{Rows(0, 50)},
                                                   {Rows(25, 50)}};
  EXPECT_FALSE(MarkFreshTiles(75, steps));
  EXPECT_EQ(FreshFlags(steps), (std::vector<bool>{false, false}));
}

// Rows no tile writes (queries that see no key) must hold the empty result,
// which only a clear gives them.
TEST(MarkFreshTilesTest, RefusesRowsNoTileWrites) {
  std::vector<std::vector<AttentionTile>> steps = {{Rows(0, 40)},
                                                   {Rows(50, 50)}};
  EXPECT_FALSE(MarkFreshTiles(100, steps));
  EXPECT_EQ(FreshFlags(steps), (std::vector<bool>{false, false}));
  std::vector<std::vector<AttentionTile>> none = {{}, {}};
  EXPECT_FALSE(MarkFreshTiles(7, none));
}

TEST(MarkFreshTilesTest, RefusesTilesBeyondTheRows) {
  std::vector<std::vector<AttentionTile>> steps = {{Rows(0, 64), Rows(64, 8)}};
  EXPECT_FALSE(MarkFreshTiles(64, steps));
  EXPECT_EQ(FreshFlags(steps), (std::vector<bool>{false, false}));
}

}  // namespace
}  // namespace ringattn
