#include "worker/attention_tiles.h"

#include <cstdint>
#include <random>
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

// How many of `tiles` show each (query, key) pair of an n x n square.
std::vector<int> TimesShown(int64_t n,
                            const std::vector<AttentionTile>& tiles) {
  std::vector<int> times(n * n, 0);
  for (const AttentionTile& t : tiles) {
    const int64_t diagonal = t.k_row + t.kv_len - (t.q_row + t.q_len);
    for (int64_t i = t.q_row; i < t.q_row + t.q_len; ++i) {
      for (int64_t j = t.k_row; j < t.k_row + t.kv_len; ++j) {
        if (!t.causal || j - i <= diagonal) ++times[i * n + j];
      }
    }
  }
  return times;
}

// A causal square cut into chunks of random sizes, every chunk pair tiled on
// its own (as a ring's tasks are), joins into tiles that show each pair the
// chunks showed exactly once, fit the tile sizes, and of which no two join.
TEST(JoinTilesTest, JoinsChunkTilesIntoAsFewAsKeepTheMask) {
  std::mt19937 rng(20261201);
  for (int trial = 0; trial < 40; ++trial) {
    const int64_t tile_q_rows =
        std::uniform_int_distribution<int64_t>(3, 29)(rng);
    const int64_t tile_kv_rows =
        std::uniform_int_distribution<int64_t>(3, 41)(rng);
    std::vector<int64_t> cuts = {0};
    while (cuts.back() < 97) {
      cuts.push_back(std::min<int64_t>(
          97,
          cuts.back() + std::uniform_int_distribution<int64_t>(1, 23)(rng)));
    }
    const int64_t n = cuts.back();
    std::vector<AttentionTile> tiles;
    for (size_t a = 0; a + 1 < cuts.size(); ++a) {
      for (size_t b = 0; b + 1 < cuts.size(); ++b) {
        AddRectangleTiles(cuts[a], cuts[a + 1] - cuts[a], cuts[b],
                          cuts[b + 1] - cuts[b], true, cuts[a] - cuts[b],
                          tile_q_rows, tile_kv_rows, tiles);
      }
    }
    const std::vector<int> before = TimesShown(n, tiles);
    const size_t tiles_before = tiles.size();
    JoinTiles(tile_q_rows, tile_kv_rows, tiles);
    EXPECT_EQ(TimesShown(n, tiles), before) << "trial " << trial;
    EXPECT_LE(tiles.size(), tiles_before);
    for (size_t i = 0; i < tiles.size(); ++i) {
      EXPECT_LE(tiles[i].q_len, tile_q_rows);
      EXPECT_LE(tiles[i].kv_len, tile_kv_rows);
      for (size_t j = i + 1; j < tiles.size(); ++j) {
        std::vector<AttentionTile> pair = {tiles[i], tiles[j]};
        JoinTiles(tile_q_rows, tile_kv_rows, pair);
        EXPECT_EQ(pair.size(), 2u)
            << "trial " << trial << ": " << i << ", " << j << " still join";
      }
    }
  }
}

}  // namespace
}  // namespace ringattn
