// AddBlockSparseLaunches checked pair by pair against the mask's definition
// over whole ring plans: block-sparse masks of every rule, causal or not,
// prime lengths and block sizes, lengths below one tile, several world sizes
// and launch sizes. Needs no GPU.

#include "worker/work_list.h"

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/block_mask.h"
#include "core/ring_plan.h"
#include "core/shard_layout.h"
#include "gtest/gtest.h"

namespace ringattn {
namespace {

struct Case {
  int64_t n;
  bool causal;
  int world_size;
  int64_t most_launch_rows;
  BlockSparseRules rules;
};

// For every task of the plan: each launch stays inside the task and within
// its row limit, its tiles hold every launch row once and at most
// kWorkListTileRows each, their spans lie in the launch's keys without
// overlapping, and each visible (query, key) pair is shown by exactly one
// span of one tile, no hidden pair by any.
void CheckPlan(const Case& c) {
  SCOPED_TRACE(absl::StrCat("n ", c.n, c.causal ? " causal" : " dense",
                            " world ", c.world_size, " launches of ",
                            c.most_launch_rows, " rows, blocks of ",
                            c.rules.block_size));
  AttentionSpec spec;
  spec.q_len = c.n;
  spec.kv_len = c.n;
  spec.q_heads = 2;
  spec.kv_heads = 1;
  spec.head_dim = 8;
  spec.causal = c.causal;
  spec.block_sparse = c.rules;
  ASSERT_TRUE(spec.Validate().ok()) << spec.Validate();
  const BlockMask blocks = BlockMask::FromRules(c.rules, c.n);
  const auto visible = [&](int64_t qp, int64_t kp) {
    if (c.causal && kp > qp) return false;
    return blocks.Allowed(qp / blocks.block_size(), kp / blocks.block_size());
  };
  const ShardKind kind = ChooseShardKind(spec);
  const ShardLayout layout = ShardLayout::Make(kind, c.n, c.world_size);
  const RingPlan plan = RingPlan::Build(spec, layout, layout, &blocks);
  int64_t shown_pairs = 0;
  for (int rank = 0; rank < c.world_size; ++rank) {
    for (int64_t s = 0; s < plan.num_steps(); ++s) {
      for (const AttentionTask& task : plan.Step(rank, s).tasks) {
        ASSERT_EQ(task.kind, TaskKind::kBlockSparse);
        WorkList list;
        AddBlockSparseLaunches(spec, blocks, task, c.most_launch_rows, list);
        // shown[i][j]: spans showing (task query i, task key j).
        std::vector<std::vector<int>> shown(
            static_cast<size_t>(task.q.size()),
            std::vector<int>(static_cast<size_t>(task.k.size()), 0));
        for (const WorkListLaunch& launch : list.launches) {
          ASSERT_GT(launch.q_len, 0);
          ASSERT_LE(launch.q_len, c.most_launch_rows);
          ASSERT_GE(launch.q_row, task.q_row);
          ASSERT_LE(launch.q_row + launch.q_len, task.q_row + task.q.size());
          ASSERT_EQ(launch.k_row, task.k_row);
          ASSERT_EQ(launch.kv_len, task.k.size());
          ASSERT_GT(launch.tile_count, 0);
          ASSERT_LE(launch.first_tile + launch.tile_count,
                    static_cast<int64_t>(list.tiles.size()));
          std::vector<int> row_tiles(static_cast<size_t>(launch.q_len), 0);
          for (int64_t t = 0; t < launch.tile_count; ++t) {
            const QueryTile& tile = list.tiles[launch.first_tile + t];
            ASSERT_GE(tile.begin, 0);
            ASSERT_LT(tile.begin, tile.end);
            ASSERT_LE(tile.end, launch.q_len);
            ASSERT_LE(tile.end - tile.begin, kWorkListTileRows);
            ASSERT_GE(tile.first_span, 0);
            ASSERT_GE(tile.span_count, 0);
            ASSERT_LE(tile.first_span + tile.span_count,
                      static_cast<int64_t>(list.spans.size()));
            std::vector<int> key_spans(static_cast<size_t>(launch.kv_len), 0);
            for (int32_t p = 0; p < tile.span_count; ++p) {
              const KeySpan& span = list.spans[tile.first_span + p];
              ASSERT_GE(span.begin, 0);
              ASSERT_LT(span.begin, span.end);
              ASSERT_LE(span.end, launch.kv_len);
              for (int32_t j = span.begin; j < span.end; ++j) {
                ASSERT_EQ(++key_spans[j], 1) << "spans of a tile overlap";
              }
            }
            for (int32_t i = tile.begin; i < tile.end; ++i) {
              ++row_tiles[i];
              const int64_t qi = launch.q_row - task.q_row + i;
              for (int32_t p = 0; p < tile.span_count; ++p) {
                const KeySpan& span = list.spans[tile.first_span + p];
                for (int32_t j = span.begin; j < span.end; ++j) {
                  if (span.causal && j > i + span.shift) continue;
                  const int64_t kj = launch.k_row - task.k_row + j;
                  ASSERT_TRUE(visible(task.q.begin + qi, task.k.begin + kj))
                      << "a span shows a hidden pair: query "
                      << task.q.begin + qi << ", key " << task.k.begin + kj;
                  ++shown[qi][kj];
                  ++shown_pairs;
                }
              }
            }
          }
          for (int64_t i = 0; i < launch.q_len; ++i) {
            ASSERT_EQ(row_tiles[i], 1) << "launch row " << i;
          }
        }
        for (int64_t i = 0; i < task.q.size(); ++i) {
          for (int64_t j = 0; j < task.k.size(); ++j) {
            ASSERT_EQ(shown[i][j],
                      visible(task.q.begin + i, task.k.begin + j) ? 1 : 0)
                << "query " << task.q.begin + i << ", key " << task.k.begin + j
                << " at rank " << rank << " step " << s;
          }
        }
      }
    }
  }
  int64_t visible_pairs = 0;
  for (int64_t qp = 0; qp < c.n; ++qp) {
    for (int64_t kp = 0; kp < c.n; ++kp) visible_pairs += visible(qp, kp);
  }
  EXPECT_EQ(shown_pairs, visible_pairs);
}

BlockSparseRules Rules(int64_t block_size) {
  BlockSparseRules rules;
  rules.block_size = block_size;
  return rules;
}

std::vector<BlockSparseRules> RuleSets() {
  std::vector<BlockSparseRules> sets;
  BlockSparseRules local = Rules(7);
  local.local = 1;
  sets.push_back(local);
  BlockSparseRules local0 = Rules(131);
  local0.local = 0;
  sets.push_back(local0);
  BlockSparseRules global = Rules(29);
  global.global = 2;
  sets.push_back(global);
  BlockSparseRules dilated = Rules(5);
  dilated.dilated = 3;
  sets.push_back(dilated);
  BlockSparseRules random = Rules(37);
  random.random = 2;
  random.seed = 12345;
  sets.push_back(random);
  BlockSparseRules pairs = Rules(13);
  pairs.pairs = {{0, 0}, {1, 0}, {3, 1}, {3, 2}, {3, 3}, {6, 6}, {2, 5}};
  sets.push_back(pairs);
  BlockSparseRules mixed = Rules(61);
  mixed.local = 1;
  mixed.global = 1;
  mixed.random = 1;
  mixed.seed = 7;
  sets.push_back(mixed);
  BlockSparseRules everything = Rules(4);
  everything.global = 1000;
  sets.push_back(everything);
  BlockSparseRules one_block = Rules(1000);
  one_block.local = 0;
  sets.push_back(one_block);
  return sets;
}

TEST(WorkListTest, EveryVisiblePairInExactlyOneSpanOfOneTile) {
  for (const BlockSparseRules& rules : RuleSets()) {
    for (const int64_t n :
         {int64_t{1}, int64_t{37}, int64_t{97}, int64_t{131}, int64_t{389}}) {
      const int64_t block_count = (n + rules.block_size - 1) / rules.block_size;
      bool fits = true;
      for (const auto& [i, j] : rules.pairs) {
        fits = fits && i < block_count && j < block_count;
      }
      if (!fits) continue;
      for (const bool causal : {false, true}) {
        for (const int world : {1, 2, 3}) {
          for (const int64_t most_rows :
               {int64_t{1000}, int64_t{50}, int64_t{7}}) {
            CheckPlan(Case{n, causal, world, most_rows, rules});
            if (HasFatalFailure()) return;
          }
        }
      }
    }
  }
}

// The list of one task over all n rows of a mask in which each block of
// `block` rows sees only itself, launched n query rows at a time.
WorkList DiagonalBlocksList(int64_t n, int64_t block, bool causal) {
  AttentionSpec spec;
  spec.q_len = spec.kv_len = n;
  spec.q_heads = spec.kv_heads = 1;
  spec.head_dim = 8;
  spec.causal = causal;
  spec.block_sparse = Rules(block);
  spec.block_sparse->local = 0;
  const BlockMask blocks = BlockMask::FromRules(*spec.block_sparse, n);
  AttentionTask task;
  task.q = Range{0, n};
  task.k = Range{0, n};
  task.kind = TaskKind::kBlockSparse;
  WorkList list;
  AddBlockSparseLaunches(spec, blocks, task, n, list);
  return list;
}

TEST(WorkListTest, TilesOfOneQueryBlockSplitEvenlyAndShareSpans) {
  const WorkList list = DiagonalBlocksList(1000, 500, /*causal=*/false);
  ASSERT_EQ(list.launches.size(), 1u);
  ASSERT_EQ(list.tiles.size(), 8u);  // 500 rows: 4 tiles of 125 per block
  for (const QueryTile& tile : list.tiles) {
    EXPECT_EQ(tile.end - tile.begin, 125);
    ASSERT_EQ(tile.span_count, 1);
    const KeySpan& span = list.spans[tile.first_span];
    EXPECT_EQ(span.begin, tile.begin < 500 ? 0 : 500);
    EXPECT_EQ(span.end, span.begin + 500);
    EXPECT_EQ(span.causal, 0);
  }
}

TEST(WorkListTest, CausalSpansAreMaskedOnlyWhereTheDiagonalCrossesThem) {
  const WorkList list = DiagonalBlocksList(256, 256, /*causal=*/true);
  ASSERT_EQ(list.tiles.size(), 2u);
  // Rows [0, 128) see keys [0, 128) under the diagonal; rows [128, 256) see
  // keys [0, 256), the same diagonal.
  const KeySpan first = list.spans[list.tiles[0].first_span];
  const KeySpan second = list.spans[list.tiles[1].first_span];
  EXPECT_EQ(first.end, 128);
  EXPECT_EQ(first.causal, 1);
  EXPECT_EQ(first.shift, 0);
  EXPECT_EQ(second.end, 256);
  EXPECT_EQ(second.causal, 1);
  EXPECT_EQ(second.shift, 0);
}

TEST(WorkListTest, LeavesOutLaunchesWithNothingVisible) {
  AttentionSpec spec;
  spec.q_len = spec.kv_len = 300;
  spec.q_heads = spec.kv_heads = 1;
  spec.head_dim = 8;
  spec.block_sparse = Rules(100);
  spec.block_sparse->pairs = {{2, 0}};
  const BlockMask blocks = BlockMask::FromRules(*spec.block_sparse, 300);
  AttentionTask task;
  task.q = Range{0, 300};
  task.k = Range{0, 300};
  task.kind = TaskKind::kBlockSparse;
  WorkList list;
  AddBlockSparseLaunches(spec, blocks, task, 100, list);
  ASSERT_EQ(list.launches.size(), 1u);
  EXPECT_EQ(list.launches[0].q_row, 200);
  EXPECT_EQ(list.launches[0].q_len, 100);
}

}  // namespace
}  // namespace ringattn
