// TileTask, which cuts the GPU ring's tasks into tiles, checked pair by pair
// against the mask's definition over whole ring plans (dense and causal, equal
// and unequal lengths, several world sizes, tiny tiles; block-sparse masks of
// every rule, causal or not, odd lengths and block sizes). Needs no GPU.

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/block_mask.h"
#include "core/ring_plan.h"
#include "core/shard_layout.h"
#include "gtest/gtest.h"
#include "worker/attention_tiles.h"
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
  std::optional<BlockSparseRules> rules = std::nullopt;
  int64_t wave_rows = 0;  // query tiles in whole multiples of these rows
};

// The global positions of a shard's rows, in order.
std::vector<int64_t> Positions(const ShardLayout& layout, int64_t worker) {
  std::vector<int64_t> positions;
  for (const Range& chunk : layout.Chunks(worker)) {
    for (int64_t p = chunk.begin; p < chunk.end; ++p) positions.push_back(p);
  }
  return positions;
}

// Each step's tiles, joined as the GPU executor joins them (StepTiles), still
// show every visible pair of the problem exactly once and no hidden one, within
// the tile sizes, every tile row seeing a key.
template <typename Visible>
void CheckJoinedSteps(const Case& c, const RingPlan& plan,
                      const ShardLayout& q_layout, const ShardLayout& kv_layout,
                      const Visible& visible) {
  AttentionSpec spec;
  spec.q_len = c.q_len;
  spec.kv_len = c.kv_len;
  spec.causal = c.causal;
  std::optional<BlockMask> mask;
  if (c.rules.has_value()) mask = BlockMask::FromRules(*c.rules, c.kv_len);
  std::vector<std::vector<int>> shown(
      static_cast<size_t>(c.q_len),
      std::vector<int>(static_cast<size_t>(c.kv_len), 0));
  for (int rank = 0; rank < c.world_size; ++rank) {
    const std::vector<int64_t> queries = Positions(q_layout, rank);
    for (int64_t s = 0; s < plan.num_steps(); ++s) {
      const RingStep& step = plan.Step(rank, s);
      if (step.tasks.empty()) continue;
      const std::vector<int64_t> keys = Positions(kv_layout, step.kv_owner);
      std::vector<std::vector<AttentionTile>> task_tiles;
      for (const AttentionTask& task : step.tasks) {
        task_tiles.push_back(TileTask(spec, mask.has_value() ? &*mask : nullptr,
                                      task, c.tile_q, c.tile_kv, c.wave_rows));
      }
      const std::vector<AttentionTile> tiles =
          StepTiles(step.tasks, task_tiles, c.tile_q, c.tile_kv);
      for (const AttentionTile& tile : tiles) {
        ASSERT_LE(tile.q_len, c.tile_q);
        ASSERT_LE(tile.kv_len, c.tile_kv);
        for (int64_t i = 0; i < tile.q_len; ++i) {
          int64_t seen = 0;
          for (int64_t j = 0; j < tile.kv_len; ++j) {
            if (tile.causal && j > i + tile.kv_len - tile.q_len) continue;
            const int64_t qp = queries[tile.q_row + i];
            const int64_t kp = keys[tile.k_row + j];
            ASSERT_TRUE(visible(qp, kp))
                << "a joined tile of rank " << rank << " step " << s
                << " holds query " << qp << ", key " << kp;
            ++shown[qp][kp];
            ++seen;
          }
          ASSERT_GT(seen, 0) << "a joined tile row sees no key";
        }
      }
    }
  }
  for (int64_t qp = 0; qp < c.q_len; ++qp) {
    for (int64_t kp = 0; kp < c.kv_len; ++kp) {
      ASSERT_EQ(shown[qp][kp], visible(qp, kp) ? 1 : 0)
          << "query " << qp << ", key " << kp << " after joining";
    }
  }
}

// For every task of the plan: each visible (query, key) pair lies in exactly
// one tile, no tile holds a hidden pair, tiles respect the tile sizes, and
// every row of a tile sees at least one key.
void CheckPlan(const Case& c) {
  SCOPED_TRACE(absl::StrCat(
      "q_len ", c.q_len, " kv_len ", c.kv_len, c.causal ? " causal" : " dense",
      " world ", c.world_size, " tiles ", c.tile_q, "x", c.tile_kv,
      c.rules.has_value()
          ? absl::StrCat(" block-sparse, blocks of ", c.rules->block_size)
          : ""));
  AttentionSpec spec;
  spec.q_len = c.q_len;
  spec.kv_len = c.kv_len;
  spec.q_heads = 2;
  spec.kv_heads = 1;
  spec.head_dim = 8;
  spec.causal = c.causal;
  spec.block_sparse = c.rules;
  ASSERT_TRUE(spec.Validate().ok()) << spec.Validate();
  std::optional<BlockMask> mask;
  if (c.rules.has_value()) mask = BlockMask::FromRules(*c.rules, c.kv_len);
  const BlockMask* blocks = mask.has_value() ? &*mask : nullptr;
  const auto visible = [&](int64_t qp, int64_t kp) {
    if (c.causal && kp > qp + c.kv_len - c.q_len) return false;
    return blocks == nullptr || blocks->Allowed(qp / blocks->block_size(),
                                                kp / blocks->block_size());
  };
  const ShardKind kind = ChooseShardKind(spec);
  const ShardLayout q_layout = QueryLayoutFor(spec, c.world_size);
  const ShardLayout kv_layout = ShardLayout::Make(kind, c.kv_len, c.world_size);
  const RingPlan plan = RingPlan::Build(spec, q_layout, kv_layout, blocks);
  // Visible pairs the plan's tiles cover, over all ranks and steps.
  int64_t covered_pairs = 0;
  for (int rank = 0; rank < c.world_size; ++rank) {
    for (int64_t s = 0; s < plan.num_steps(); ++s) {
      for (const AttentionTask& task : plan.Step(rank, s).tasks) {
        if (blocks != nullptr) {
          ASSERT_EQ(task.kind, TaskKind::kBlockSparse);
        }
        // covered[i][j]: tiles holding (query row i, key row j) of the task.
        std::vector<std::vector<int>> covered(
            static_cast<size_t>(task.q.size()),
            std::vector<int>(static_cast<size_t>(task.k.size()), 0));
        for (const AttentionTile& tile :
             TileTask(spec, blocks, task, c.tile_q, c.tile_kv, c.wave_rows)) {
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
              ++covered_pairs;
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
  // Every visible pair of the whole problem is some rank's, exactly once.
  int64_t visible_pairs = 0;
  for (int64_t qp = 0; qp < c.q_len; ++qp) {
    for (int64_t kp = 0; kp < c.kv_len; ++kp) {
      visible_pairs += visible(qp, kp) ? 1 : 0;
    }
  }
  EXPECT_EQ(covered_pairs, visible_pairs);
  CheckJoinedSteps(c, plan, q_layout, kv_layout, visible);
}

TEST(TileTaskTest, CoversEveryVisiblePairOnce) {
  const std::vector<Case> cases = {
      {1, 1, false, 1, 1, 1},
      {37, 37, false, 1, 8, 5},
      {37, 37, true, 1, 8, 5},
      {37, 37, true, 1, 5, 8},
      {64, 64, true, 2, 16, 16},
      {97, 97, true, 2, 7, 11},
      {97, 97, false, 3, 7, 11},
      {101, 101, true, 4, 3, 3},
      {20, 90, true, 2, 6, 9},
      {90, 20, true, 2, 6, 9},
      {90, 20, false, 3, 9, 6},
      {3, 3, true, 4, 1, 2},
      {5, 200, true, 3, 64, 64},
      {200, 5, true, 3, 64, 64},
      {128, 128, true, 2, 1000, 1000},
      // Query tiles cut in whole waves: of 6, 12 and 24 rows.
      {97, 97, true, 1, 20, 11, std::nullopt, 6},
      {97, 97, false, 1, 20, 11, std::nullopt, 6},
      {200, 150, true, 2, 40, 50, std::nullopt, 12},
      {301, 301, true, 3, 64, 64, std::nullopt, 24},
      {90, 20, true, 2, 30, 9, std::nullopt, 12},
      {300, 280, true, 1, 40, 64, std::nullopt, 12},
      {260, 260, true, 2, 30, 40, std::nullopt, 8},
  };
  for (const Case& c : cases) CheckPlan(c);
}

// Query rows that need more than two tiles are cut in whole waves (here 12
// rows) as far as the tile size allows, the rest last; rows that fit two
// tiles are cut evenly, as are rows where a wave is larger than a tile.
TEST(TileTaskTest, CutsQueryRowsInWholeWaves) {
  const auto query_cuts = [](int64_t q_len, int64_t tile_q, int64_t wave) {
    std::vector<AttentionTile> tiles;
    AddRectangleTiles(0, q_len, 0, 10, false, 0, tile_q, 10, tiles, wave);
    std::vector<int64_t> cuts;
    for (const AttentionTile& tile : tiles) cuts.push_back(tile.q_len);
    return cuts;
  };
  EXPECT_EQ(query_cuts(100, 40, 12), (std::vector<int64_t>{36, 36, 28}));
  EXPECT_EQ(query_cuts(81, 40, 12), (std::vector<int64_t>{36, 36, 9}));
  EXPECT_EQ(query_cuts(80, 40, 12), (std::vector<int64_t>{40, 40}));
  EXPECT_EQ(query_cuts(40, 40, 12), (std::vector<int64_t>{40}));
  EXPECT_EQ(query_cuts(100, 40, 0), (std::vector<int64_t>{34, 33, 33}));
  EXPECT_EQ(query_cuts(100, 40, 41), (std::vector<int64_t>{34, 33, 33}));
}

// A causal ring of two zigzag ranks: rank 0 holds chunks 0 and 3 of four.
// Its own step (chunk 0 against itself, chunk 3 against chunks 0 and 3) is
// one causal tile once joined, not three; the next step (chunk 3 against
// chunks 1 and 2) one dense tile, not two.
TEST(JoinTilesTest, ZigzagRankRunsEachStepAsOneTile) {
  AttentionSpec spec;
  spec.q_len = spec.kv_len = 64;
  spec.q_heads = spec.kv_heads = 1;
  spec.head_dim = 8;
  spec.causal = true;
  const ShardLayout layout = QueryLayoutFor(spec, 2);
  ASSERT_EQ(layout.Chunks(0).size(), 2u);
  const RingPlan plan = RingPlan::Build(spec, layout, layout, nullptr);
  std::vector<std::vector<AttentionTile>> steps;
  for (int64_t s = 0; s < plan.num_steps(); ++s) {
    std::vector<AttentionTile>& tiles = steps.emplace_back();
    for (const AttentionTask& task : plan.Step(0, s).tasks) {
      const std::vector<AttentionTile> task_tiles =
          TileTask(spec, task, 32, 128);
      tiles.insert(tiles.end(), task_tiles.begin(), task_tiles.end());
    }
  }
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps[0].size(), 3u);
  EXPECT_EQ(steps[1].size(), 2u);
  JoinTiles(32, 128, steps[0]);
  JoinTiles(32, 128, steps[1]);
  ASSERT_EQ(steps[0].size(), 1u);
  EXPECT_EQ(steps[0][0], (AttentionTile{0, 32, 0, 32, true}));
  ASSERT_EQ(steps[1].size(), 1u);
  EXPECT_EQ(steps[1][0], (AttentionTile{16, 16, 0, 32, false}));
  // The own step's tile writes every row first: the rank needs no clear.
  EXPECT_TRUE(MarkFreshTiles(32, steps));
  EXPECT_TRUE(steps[0][0].fresh);
  EXPECT_FALSE(steps[1][0].fresh);
}

// Tiles join only within the tile sizes.
TEST(JoinTilesTest, KeepsTheTileSizes) {
  std::vector<AttentionTile> tiles = {{0, 16, 0, 16, false},
                                      {0, 16, 16, 16, false}};
  JoinTiles(16, 16, tiles);
  EXPECT_EQ(tiles.size(), 2u);
  JoinTiles(16, 32, tiles);
  ASSERT_EQ(tiles.size(), 1u);
  EXPECT_EQ(tiles[0], (AttentionTile{0, 16, 0, 32, false}));
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

BlockSparseRules Rules(int64_t block_size) {
  BlockSparseRules rules;
  rules.block_size = block_size;
  return rules;
}

TEST(TileTaskTest, BlockSparseCoversEveryAllowedPairOnce) {
  std::vector<BlockSparseRules> rule_sets;
  BlockSparseRules local = Rules(7);
  local.local = 1;
  rule_sets.push_back(local);
  BlockSparseRules local0 = Rules(16);
  local0.local = 0;
  rule_sets.push_back(local0);
  BlockSparseRules global = Rules(9);
  global.global = 2;
  rule_sets.push_back(global);
  BlockSparseRules dilated = Rules(5);
  dilated.dilated = 3;
  rule_sets.push_back(dilated);
  BlockSparseRules random = Rules(11);
  random.random = 2;
  random.seed = 12345;
  rule_sets.push_back(random);
  BlockSparseRules pairs = Rules(13);
  pairs.pairs = {{0, 0}, {1, 0}, {3, 1}, {3, 2}, {3, 3}, {6, 6}, {2, 5}};
  rule_sets.push_back(pairs);
  BlockSparseRules mixed = Rules(6);
  mixed.local = 1;
  mixed.global = 1;
  mixed.random = 1;
  mixed.seed = 7;
  rule_sets.push_back(mixed);
  BlockSparseRules everything = Rules(4);
  everything.global = 1000;
  rule_sets.push_back(everything);
  BlockSparseRules one_block = Rules(1000);
  one_block.local = 0;
  rule_sets.push_back(one_block);

  for (const BlockSparseRules& rules : rule_sets) {
    for (const int64_t n : {int64_t{1}, int64_t{37}, int64_t{97}}) {
      // Explicit pairs must name blocks that exist.
      const int64_t blocks = (n + rules.block_size - 1) / rules.block_size;
      bool fits = true;
      for (const auto& [i, j] : rules.pairs) {
        fits = fits && i < blocks && j < blocks;
      }
      if (!fits) continue;
      for (const bool causal : {false, true}) {
        for (const int world : {1, 2, 3}) {
          for (const auto& [tile_q, tile_kv] :
               {std::pair<int64_t, int64_t>{1000, 1000},
                std::pair<int64_t, int64_t>{8, 5},
                std::pair<int64_t, int64_t>{3, 17}}) {
            Case c{n, n, causal, world, tile_q, tile_kv, rules};
            CheckPlan(c);
            if (HasFatalFailure()) return;
          }
        }
      }
    }
  }
}

// A mask that allows every pair tiles a task just like dense attention.
TEST(TileTaskTest, FullyAllowedMaskTilesLikeDense) {
  AttentionSpec spec;
  spec.q_len = spec.kv_len = 100;
  spec.q_heads = spec.kv_heads = 1;
  spec.head_dim = 8;
  BlockSparseRules rules = Rules(7);
  rules.global = 1000;
  spec.block_sparse = rules;
  const BlockMask mask = BlockMask::FromRules(rules, spec.kv_len);
  AttentionTask task;
  task.q = Range{10, 60};
  task.k = Range{0, 100};
  task.q_row = 3;
  task.k_row = 0;
  task.kind = TaskKind::kBlockSparse;
  AttentionTask dense = task;
  dense.kind = TaskKind::kFull;
  EXPECT_EQ(TileTask(spec, &mask, task, 64, 64), TileTask(spec, dense, 64, 64));
  const std::vector<AttentionTile> tiles = TileTask(spec, &mask, task, 64, 128);
  ASSERT_EQ(tiles.size(), 1u);
  EXPECT_EQ(tiles[0], (AttentionTile{3, 50, 0, 100, false}));
}

// A local band of width 1 gives each query block one tile of its (up to)
// three key blocks; causal keeps only the diagonal block and the one before.
TEST(TileTaskTest, LocalBandGroupsNeighbouringKeyBlocks) {
  AttentionSpec spec;
  spec.q_len = spec.kv_len = 40;
  spec.q_heads = spec.kv_heads = 1;
  spec.head_dim = 8;
  BlockSparseRules rules = Rules(10);
  rules.local = 1;
  spec.block_sparse = rules;
  const BlockMask mask = BlockMask::FromRules(rules, spec.kv_len);
  AttentionTask task;
  task.q = task.k = Range{0, 40};
  task.kind = TaskKind::kBlockSparse;
  const std::vector<AttentionTile> dense = TileTask(spec, &mask, task, 64, 64);
  const std::vector<AttentionTile> want_dense = {{0, 10, 0, 20, false},
                                                 {10, 10, 0, 30, false},
                                                 {20, 10, 10, 30, false},
                                                 {30, 10, 20, 20, false}};
  EXPECT_EQ(dense, want_dense);
  spec.causal = true;
  const std::vector<AttentionTile> causal = TileTask(spec, &mask, task, 64, 64);
  const std::vector<AttentionTile> want_causal = {{0, 10, 0, 10, true},
                                                  {10, 10, 0, 20, true},
                                                  {20, 10, 10, 20, true},
                                                  {30, 10, 20, 20, true}};
  EXPECT_EQ(causal, want_causal);
}

TEST(KeyRowsPerTileTest, FewPackedRowsTakeTheWholeBlock) {
  const GpuRingConfig config;
  // 16 rows x 4 query heads per K/V head = 64 packed rows: the decode kernel.
  EXPECT_EQ(KeyRowsPerTile(config, 16, 4, 5'000'000), 5'000'000);
  EXPECT_EQ(KeyRowsPerTile(config, 0, 4, 0), 1);
}

TEST(KeyRowsPerTileTest, OneQueryTileTakesLongKeyTiles) {
  const GpuRingConfig config;
  EXPECT_EQ(KeyRowsPerTile(config, 256, 4, 524'288), 524'288);
  EXPECT_EQ(KeyRowsPerTile(config, 4096, 4, 3'000'000),
            kMostKeyRowsPerLongTile);
  // Never shorter than a regular tile, even for a short block.
  EXPECT_EQ(KeyRowsPerTile(config, 4096, 1, 1000), config.tile_kv_rows);
}

TEST(KeyRowsPerTileTest, ManyQueryRowsTakeRegularTiles) {
  const GpuRingConfig config;
  EXPECT_EQ(KeyRowsPerTile(config, config.tile_q_rows + 1, 1, 1'000'000),
            config.tile_kv_rows);
}

TEST(ChooseBlockSparseRouteTest,
     ListsForSmallRectanglesAndTinyOnesOnAnyKernelUnlessForced) {
  const std::vector<AttentionTile> small = {{0, 1024, 0, 2048, false},
                                            {1024, 1024, 0, 1024, true}};
  const std::vector<AttentionTile> tiny = {{0, 16, 0, 64, false},
                                           {16, 256, 0, 256, true}};
  const std::vector<AttentionTile> large = {{0, 16384, 0, 16384, false},
                                            {16384, 1024, 0, 1024, false}};
  EXPECT_EQ(ChooseBlockSparseRoute(BlockSparseRoute::kAuto, true, small),
            BlockSparseRoute::kWorkList);
  EXPECT_EQ(ChooseBlockSparseRoute(BlockSparseRoute::kAuto, true, {}),
            BlockSparseRoute::kWorkList);
  EXPECT_EQ(ChooseBlockSparseRoute(BlockSparseRoute::kAuto, true, large),
            BlockSparseRoute::kRectangles);
  EXPECT_EQ(ChooseBlockSparseRoute(BlockSparseRoute::kAuto, false, small),
            BlockSparseRoute::kRectangles);
  // Without the Hopper kernel, lists on the mma.sync kernel for tiny ones.
  EXPECT_EQ(ChooseBlockSparseRoute(BlockSparseRoute::kAuto, false, tiny),
            BlockSparseRoute::kWorkList);
  EXPECT_EQ(ChooseBlockSparseRoute(BlockSparseRoute::kAuto, true, tiny),
            BlockSparseRoute::kWorkList);
  EXPECT_EQ(ChooseBlockSparseRoute(BlockSparseRoute::kRectangles, true, small),
            BlockSparseRoute::kRectangles);
  EXPECT_EQ(ChooseBlockSparseRoute(BlockSparseRoute::kWorkList, false, large),
            BlockSparseRoute::kWorkList);
}

}  // namespace
}  // namespace ringattn
