#include "core/ring_plan.h"

#include <vector>

#include "gtest/gtest.h"

namespace ringattn {
namespace {

AttentionSpec Spec(int64_t n, bool causal) {
  AttentionSpec spec;
  spec.q_len = spec.kv_len = n;
  spec.q_heads = spec.kv_heads = 4;
  spec.head_dim = 64;
  spec.causal = causal;
  return spec;
}

RingPlan PlanFor(const AttentionSpec& spec, int64_t p,
                 const BlockMask* blocks = nullptr) {
  const ShardKind kind = ChooseShardKind(spec);
  return RingPlan::Build(spec, ShardLayout::Make(kind, spec.q_len, p),
                         ShardLayout::Make(kind, spec.kv_len, p), blocks);
}

TEST(RingPlan, DenseVisitsEveryBlockOnEveryWorker) {
  const RingPlan plan = PlanFor(Spec(100, false), 4);
  EXPECT_EQ(plan.num_steps(), 4);
  EXPECT_EQ(plan.NumTransfers(), 4 * 3);
  for (int64_t i = 0; i < 4; ++i) {
    for (int64_t s = 0; s < 4; ++s) {
      const RingStep& step = plan.Step(i, s);
      EXPECT_EQ(step.kv_owner, (i - s + 4) % 4);
      ASSERT_EQ(step.tasks.size(), 1u);
      EXPECT_EQ(step.tasks[0].kind, TaskKind::kFull);
    }
  }
}

TEST(RingPlan, CausalZigzagSkipsMaskedPairsAndBalancesWork) {
  const int64_t p = 4;
  const RingPlan plan = PlanFor(Spec(800, true), p);
  // Zigzag: each of the 2p x 2p chunk pairs below the diagonal is one task;
  // pairs above it are skipped. 2p(2p+1)/2 = 36 pairs in all, 2p of them
  // diagonal.
  EXPECT_EQ(plan.NumTasks(), 2 * p * (2 * p + 1) / 2);
  int64_t diagonal = 0;
  for (int64_t i = 0; i < p; ++i) {
    int64_t work = 0;
    for (int64_t s = 0; s < plan.num_steps(); ++s) {
      for (const AttentionTask& t : plan.Step(i, s).tasks) {
        work += t.kind == TaskKind::kCausal ? 1 : 2;  // in half chunk pairs
        diagonal += t.kind == TaskKind::kCausal;
        EXPECT_LE(t.k.begin, t.q.end - 1);
      }
    }
    EXPECT_EQ(work, 2 * (2 * p + 1) - 2) << "worker " << i;
  }
  EXPECT_EQ(diagonal, 2 * p);
}

TEST(RingPlan, TasksAgainstBlockGathersEveryWorkersTasksOnThatBlock) {
  const int64_t p = 3;
  const RingPlan plan = PlanFor(Spec(301, true), p);
  int64_t gathered = 0;
  for (int64_t kv_owner = 0; kv_owner < p; ++kv_owner) {
    const std::vector<std::vector<AttentionTask>> tasks =
        plan.TasksAgainstBlock(kv_owner);
    ASSERT_EQ(tasks.size(), static_cast<size_t>(p));
    for (int64_t w = 0; w < p; ++w) {
      size_t expected = 0;
      for (int64_t s = 0; s < plan.num_steps(); ++s) {
        if (plan.Step(w, s).kv_owner == kv_owner) {
          expected += plan.Step(w, s).tasks.size();
        }
      }
      EXPECT_EQ(tasks[w].size(), expected) << w << " on " << kv_owner;
      gathered += static_cast<int64_t>(tasks[w].size());
    }
  }
  EXPECT_EQ(gathered, plan.NumTasks());
}

TEST(RingPlan, ShortCausalQueryBatchSeesWholeContext) {
  AttentionSpec spec = Spec(1000, true);
  spec.q_len = 3;
  const RingPlan plan = PlanFor(spec, 3);
  int64_t keys = 0;
  for (int64_t i = 0; i < 3; ++i) {
    for (int64_t s = 0; s < plan.num_steps(); ++s) {
      for (const AttentionTask& t : plan.Step(i, s).tasks) {
        keys += t.k.size();
      }
    }
  }
  EXPECT_EQ(keys, 1000 * 3 - 0) << "each query row's worker sees every key";
}

TEST(QueryLayout, ShortCausalBatchIsOneRunPerWorker) {
  AttentionSpec spec = Spec(128 * kShortQueryRatio, true);
  spec.q_len = 128;
  const ShardLayout short_batch = QueryLayoutFor(spec, 2);
  EXPECT_EQ(short_batch.Chunks(0), (std::vector<Range>{{0, 64}}));
  EXPECT_EQ(short_batch.Chunks(1), (std::vector<Range>{{64, 128}}));
  spec.q_len = 129;
  EXPECT_EQ(QueryLayoutFor(spec, 2).Chunks(0).size(), 2u)
      << "a batch of comparable length keeps zigzag's balance";
}

// Pass-Q: a short causal batch's travelling block is one run, so each of its
// tasks against a K/V block reads one of that block's chunks once.
TEST(RingPlan, PassQReadsEachKeyChunkOnceForAShortCausalBatch) {
  AttentionSpec spec = Spec(100003, true);
  spec.q_len = 128;
  const int64_t p = 2;
  const ShardLayout kv_layout = LayoutFor(spec, spec.kv_len, p);
  const RingPlan plan = RingPlan::Build(spec, QueryLayoutFor(spec, p),
                                        kv_layout, /*blocks=*/nullptr);
  for (int64_t owner = 0; owner < p; ++owner) {
    const std::vector<std::vector<AttentionTask>> tasks =
        plan.TasksAgainstBlock(owner);
    for (int64_t w = 0; w < p; ++w) {
      ASSERT_EQ(tasks[w].size(), kv_layout.Chunks(owner).size())
          << w << " on " << owner;
      for (const AttentionTask& t : tasks[w]) EXPECT_EQ(t.q.size(), 64);
    }
  }
}

// Broadcast-Q: a world of one holds every query row against its own keys. A
// causal batch of 16 rows is one task per key chunk, so the keys are read
// once (split in two, the rows read them twice).
TEST(RingPlan, CausalQueriesOfAWorldOfOneAreOneTask) {
  AttentionSpec spec = Spec(1000, true);
  spec.q_len = 16;
  const RingPlan plan = PlanFor(spec, 1);
  ASSERT_EQ(plan.Step(0, 0).tasks.size(), 1u);
  const AttentionTask& task = plan.Step(0, 0).tasks[0];
  EXPECT_EQ(task.q, (Range{0, 16}));
  EXPECT_EQ(task.k, (Range{0, 1000}));
  EXPECT_EQ(task.kind, TaskKind::kCausal);
}

TEST(RingPlan, DilatedSegmentsInsideShardsSendNothing) {
  AttentionSpec spec = Spec(4096, false);
  spec.dilated = {{256, 1}, {512, 2}, {1024, 4}};
  const RingPlan plan = PlanFor(spec, 4);
  EXPECT_EQ(plan.num_steps(), 1);
  EXPECT_EQ(plan.NumTransfers(), 0);
  EXPECT_EQ(plan.NumTasks(), 4 * 3);
}

TEST(RingPlan, DilatedSegmentSpanningTwoShardsRingsAmongThoseTwo) {
  AttentionSpec spec = Spec(4096, false);
  spec.dilated = {{2048, 2}};
  const RingPlan plan = PlanFor(spec, 4);
  // Workers 0 and 1 share a segment, so do 2 and 3: two rings of two.
  EXPECT_EQ(plan.num_steps(), 2);
  EXPECT_EQ(plan.NumTransfers(), 4);
  EXPECT_EQ(plan.Next(0), 1);
  EXPECT_EQ(plan.Next(1), 0);
  EXPECT_EQ(plan.Next(3), 2);
  EXPECT_EQ(plan.Step(0, 1).kv_owner, 1);
  EXPECT_EQ(plan.Step(2, 1).kv_owner, 3);
  EXPECT_EQ(plan.Step(1, 1).tasks.size(), 1u);
}

TEST(RingPlan, BlockSparseLocalSkipsFarBlocks) {
  AttentionSpec spec = Spec(800, false);
  BlockSparseRules rules;
  rules.block_size = 100;
  rules.local = 0;
  spec.block_sparse = rules;
  const BlockMask mask = BlockMask::FromRules(rules, 800);
  const RingPlan plan = PlanFor(spec, 4, &mask);
  EXPECT_EQ(plan.num_steps(), 1);
  EXPECT_EQ(plan.NumTransfers(), 0);
  for (int64_t i = 0; i < 4; ++i) {
    ASSERT_EQ(plan.Step(i, 0).tasks.size(), 1u);
    EXPECT_EQ(plan.Step(i, 0).tasks[0].kind, TaskKind::kBlockSparse);
  }
}

TEST(RingPlan, EmptyWorkersStillForwardTheRing) {
  const RingPlan plan = PlanFor(Spec(2, false), 5);
  // Worker 1's block reaches worker 0 through the empty workers 2, 3 and 4.
  EXPECT_EQ(plan.num_steps(), 5);
  EXPECT_TRUE(plan.Step(0, 0).send);
  EXPECT_FALSE(plan.Step(1, 1).send);
  for (int64_t s = 0; s < 4; ++s) {
    EXPECT_TRUE(plan.Step(1 + s, s).send) << "step " << s;
  }
  EXPECT_EQ(plan.Step(0, 4).kv_owner, 1);
  for (int64_t i = 2; i < 5; ++i) {
    for (int64_t s = 0; s < plan.num_steps(); ++s) {
      EXPECT_TRUE(plan.Step(i, s).tasks.empty());
    }
  }
}

}  // namespace
}  // namespace ringattn
