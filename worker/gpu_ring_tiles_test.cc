// TileTask, which cuts the GPU ring's tasks into tiles, checked pair by pair
// against the mask's definition over whole ring plans (dense and causal, equal
// and unequal lengths, several world sizes, tiny tiles). Needs no GPU.

#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/ring_plan.h"
#include "core/shard_layout.h"
#include "gtest/gtest.h"
#include "worker/gpu_ring_executor.h"

namespace ringattn {
namespace {

struct Case {
  int64_t q_len;
  int64_t kv_len;
  bool causal;
  int world_size;
  int64_t tile_q;
  int64_t tile_kv;
};

// For every task of the plan: each visible (query, key) pair lies in exactly
// one tile, no tile holds a hidden pair, tiles respect the tile sizes, and
// every row of a tile sees at least one key.
void CheckPlan(const Case& c) {
  SCOPED_TRACE(absl::StrCat("q_len ", c.q_len, " kv_len ", c.kv_len,
                            c.causal ? " causal" : " dense", " world ",
                            c.world_size, " tiles ", c.tile_q, "x", c.tile_kv));
  AttentionSpec spec;
  spec.q_len = c.q_len;
  spec.kv_len = c.kv_len;
  spec.q_heads = 2;
  spec.kv_heads = 1;
  spec.head_dim = 8;
  spec.causal = c.causal;
  ASSERT_TRUE(spec.Validate().ok());
  const ShardKind kind = ChooseShardKind(spec);
  const ShardLayout q_layout = ShardLayout::Make(kind, c.q_len, c.world_size);
  const ShardLayout kv_layout = ShardLayout::Make(kind, c.kv_len, c.world_size);
  const RingPlan plan = RingPlan::Build(spec, q_layout, kv_layout, nullptr);
  for (int rank = 0; rank < c.world_size; ++rank) {
    for (int64_t s = 0; s < plan.num_steps(); ++s) {
      for (const AttentionTask& task : plan.Step(rank, s).tasks) {
        const auto visible = [&](int64_t qp, int64_t kp) {
          return !c.causal || kp <= qp + c.kv_len - c.q_len;
        };
        // covered[i][j]: tiles holding (query row i, key row j) of the task.
        std::vector<std::vector<int>> covered(
            static_cast<size_t>(task.q.size()),
            std::vector<int>(static_cast<size_t>(task.k.size()), 0));
        for (const AttentionTile& tile :
             TileTask(spec, task, c.tile_q, c.tile_kv)) {
          ASSERT_GT(tile.q_len, 0);
          ASSERT_GT(tile.kv_len, 0);
          ASSERT_LE(tile.q_len, c.tile_q);
          ASSERT_LE(tile.kv_len, c.tile_kv);
          ASSERT_GE(tile.q_row, task.q_row);
          ASSERT_LE(tile.q_row + tile.q_len, task.q_row + task.q.size());
          ASSERT_GE(tile.k_row, task.k_row);
          ASSERT_LE(tile.k_row + tile.kv_len, task.k_row + task.k.size());
          for (int64_t i = 0; i < tile.q_len; ++i) {
            int64_t seen = 0;
            for (int64_t j = 0; j < tile.kv_len; ++j) {
              if (tile.causal && j > i + tile.kv_len - tile.q_len) continue;
              const int64_t qi = tile.q_row + i - task.q_row;
              const int64_t kj = tile.k_row + j - task.k_row;
              ASSERT_TRUE(visible(task.q.begin + qi, task.k.begin + kj))
                  << "tile holds a hidden pair: query " << task.q.begin + qi
                  << ", key " << task.k.begin + kj;
              ++covered[qi][kj];
              ++seen;
            }
            ASSERT_GT(seen, 0) << "a tile row sees no key";
          }
        }
        for (int64_t i = 0; i < task.q.size(); ++i) {
          for (int64_t j = 0; j < task.k.size(); ++j) {
            const int want =
                visible(task.q.begin + i, task.k.begin + j) ? 1 : 0;
            ASSERT_EQ(covered[i][j], want)
                << "query " << task.q.begin + i << ", key " << task.k.begin + j
                << " at rank " << rank << " step " << s;
          }
        }
      }
    }
  }
}

TEST(TileTaskTest, CoversEveryVisiblePairOnce) {
  const std::vector<Case> cases = {
      {1, 1, false, 1, 1, 1},          {37, 37, false, 1, 8, 5},
      {37, 37, true, 1, 8, 5},         {37, 37, true, 1, 5, 8},
      {64, 64, true, 2, 16, 16},       {97, 97, true, 2, 7, 11},
      {97, 97, false, 3, 7, 11},       {101, 101, true, 4, 3, 3},
      {20, 90, true, 2, 6, 9},         {90, 20, true, 2, 6, 9},
      {90, 20, false, 3, 9, 6},        {3, 3, true, 4, 1, 2},
      {5, 200, true, 3, 64, 64},       {200, 5, true, 3, 64, 64},
      {128, 128, true, 2, 1000, 1000},
  };
  for (const Case& c : cases) CheckPlan(c);
}

TEST(TileTaskTest, WholeDiagonalTaskIsOneCausalTile) {
  AttentionSpec spec;
  spec.q_len = spec.kv_len = 100;
  spec.q_heads = spec.kv_heads = 1;
  spec.head_dim = 8;
  spec.causal = true;
  AttentionTask task;
  task.q = task.k = Range{10, 60};
  task.q_row = 5;
  task.k_row = 7;
  task.kind = TaskKind::kCausal;
  const std::vector<AttentionTile> tiles = TileTask(spec, task, 64, 64);
  ASSERT_EQ(tiles.size(), 1u);
  EXPECT_EQ(tiles[0], (AttentionTile{5, 50, 7, 50, true}));
}

TEST(TileTaskTest, CausalTaskSkipsTilesAboveTheDiagonal) {
  AttentionSpec spec;
  spec.q_len = spec.kv_len = 64;
  spec.q_heads = spec.kv_heads = 1;
  spec.head_dim = 8;
  spec.causal = true;
  AttentionTask task;
  task.q = task.k = Range{0, 64};
  task.kind = TaskKind::kCausal;
  // 4 x 4 tiles: 4 on the diagonal (causal), 6 below it (full), 6 skipped.
  const std::vector<AttentionTile> tiles = TileTask(spec, task, 16, 16);
  int causal = 0;
  for (const AttentionTile& tile : tiles) causal += tile.causal ? 1 : 0;
  EXPECT_EQ(tiles.size(), 10u);
  EXPECT_EQ(causal, 4);
}

}  // namespace
}  // namespace ringattn
