// PlanDilatedTask, which cuts the GPU ring's dilated tasks into strided
// launches, checked triple by triple (query, key, head) against the
// definition of dilated attention over whole ring plans: both combines, causal
// or not, GQA, odd lengths, short last segments, segments spanning shards,
// several world sizes, tiny tiles and scratch. Also that launches batch what
// they can. Needs no GPU.

#include "worker/gpu_dilated_tasks.h"

#include <cstdint>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/attention_spec.h"
#include "core/dilated.h"
#include "core/ring_plan.h"
#include "core/shard_layout.h"
#include "gtest/gtest.h"

namespace ringattn {
namespace {

struct Case {
  int64_t n;
  int64_t q_heads;
  int64_t kv_heads;
  std::vector<DilatedBranch> branches;
  DilatedCombine combine;
  bool causal;
  int world_size;
  DilatedLimits limits;
};

AttentionSpec SpecOf(const Case& c) {
  AttentionSpec spec;
  spec.q_len = spec.kv_len = c.n;
  spec.q_heads = c.q_heads;
  spec.kv_heads = c.kv_heads;
  spec.head_dim = 8;
  spec.causal = c.causal;
  spec.dilated = c.branches;
  spec.combine = c.combine;
  return spec;
}

// Whether head `h` attends from `qp` to `kp` in branch `branch`, straight
// from DESIGN.md.
bool Visible(const AttentionSpec& spec, int64_t branch, int64_t h, int64_t qp,
             int64_t kp) {
  if (!HeadTakesBranch(spec, branch, h)) return false;
  if (spec.causal && kp > qp) return false;
  const DilatedBranch& b = spec.dilated[branch];
  const int64_t segment = qp / b.segment_length;
  if (kp / b.segment_length != segment) return false;
  const int64_t offset = DilatedOffset(spec, branch, h);
  const int64_t begin = segment * b.segment_length;
  return (qp - begin) % b.dilation == offset &&
         (kp - begin) % b.dilation == offset;
}

// For every task of every rank: each visible triple in exactly one launch, no
// hidden triple in any, every launch row seeing a key, and the limits kept.
void CheckPlans(const Case& c) {
  const AttentionSpec spec = SpecOf(c);
  ASSERT_TRUE(spec.Validate().ok()) << spec.Validate();
  const ShardLayout q_layout = LayoutFor(spec, c.n, c.world_size);
  const ShardLayout kv_layout = LayoutFor(spec, c.n, c.world_size);
  const RingPlan plan = RingPlan::Build(spec, q_layout, kv_layout, nullptr);
  int64_t tasks = 0;
  for (int rank = 0; rank < c.world_size; ++rank) {
    for (int64_t s = 0; s < plan.num_steps(); ++s) {
      for (const AttentionTask& task : plan.Step(rank, s).tasks) {
        SCOPED_TRACE(absl::StrCat("rank ", rank, " step ", s, " branch ",
                                  task.branch, " q [", task.q.begin, ", ",
                                  task.q.end, ") k [", task.k.begin, ", ",
                                  task.k.end, ")"));
        ASSERT_EQ(task.kind, TaskKind::kDilated);
        ++tasks;
        const DilatedBranch& branch = spec.dilated[task.branch];
        std::map<std::tuple<int64_t, int64_t, int64_t>, int> seen;
        for (const DilatedCall& call : PlanDilatedTask(spec, task, c.limits)) {
          ASSERT_EQ(call.dilation, branch.dilation);
          ASSERT_EQ(call.segment_rows, branch.segment_length);
          ASSERT_GE(call.q_len, 1);
          ASSERT_LE(call.q_len, c.limits.tile_q_rows);
          ASSERT_GE(call.kv_len, call.causal ? call.q_len : 1)
              << "a launch row sees no key";
          ASSERT_LE(call.kv_len, c.limits.tile_kv_rows);
          ASSERT_GE(call.segments, 1);
          ASSERT_LE(call.segments * call.q_len * call.q_heads,
                    c.limits.partial_rows);
          ASSERT_LE(call.segments * call.q_heads, kMaxDilatedBatchHeads);
          ASSERT_EQ(call.q_heads % call.kv_heads, 0);
          const int64_t group = call.q_heads / call.kv_heads;
          for (int64_t x = 0; x < call.q_heads; ++x) {
            const int64_t h = call.q_head + x;
            ASSERT_EQ(call.kv_head + x / group, spec.KvHeadOf(h));
            for (int64_t seg = 0; seg < call.segments; ++seg) {
              for (int64_t i = 0; i < call.q_len; ++i) {
                const int64_t q_row =
                    call.q_row + seg * call.segment_rows + i * call.dilation;
                const int64_t qp = task.q.begin + q_row - task.q_row;
                ASSERT_TRUE(qp >= task.q.begin && qp < task.q.end);
                for (int64_t j = 0; j < call.kv_len; ++j) {
                  if (call.causal && j > i + call.kv_len - call.q_len) break;
                  const int64_t k_row =
                      call.k_row + seg * call.segment_rows + j * call.dilation;
                  const int64_t kp = task.k.begin + k_row - task.k_row;
                  ASSERT_TRUE(kp >= task.k.begin && kp < task.k.end);
                  ASSERT_TRUE(Visible(spec, task.branch, h, qp, kp))
                      << "head " << h << " query " << qp << " key " << kp;
                  ASSERT_EQ(++seen[std::make_tuple(h, qp, kp)], 1)
                      << "head " << h << " query " << qp << " key " << kp
                      << " computed twice";
                }
              }
            }
          }
        }
        for (int64_t h = 0; h < spec.q_heads; ++h) {
          for (int64_t qp = task.q.begin; qp < task.q.end; ++qp) {
            for (int64_t kp = task.k.begin; kp < task.k.end; ++kp) {
              if (!Visible(spec, task.branch, h, qp, kp)) continue;
              ASSERT_EQ(seen.count(std::make_tuple(h, qp, kp)), 1u)
                  << "head " << h << " query " << qp << " key " << kp
                  << " computed by no launch";
            }
          }
        }
      }
    }
  }
  EXPECT_GT(tasks, 0);
}

DilatedLimits Limits(int64_t tile_q, int64_t tile_kv, int64_t partial_rows) {
  DilatedLimits limits;
  limits.tile_q_rows = tile_q;
  limits.tile_kv_rows = tile_kv;
  limits.partial_rows = partial_rows;
  return limits;
}

TEST(GpuDilatedTasksTest, LaunchesCoverEveryVisibleTripleOnce) {
  const std::vector<DilatedBranch> three = {{16, 1}, {32, 2}, {128, 4}};
  const DilatedLimits roomy = Limits(16384, 16384, 1 << 20);
  for (const DilatedCombine combine :
       {DilatedCombine::kLse, DilatedCombine::kHeadGroups}) {
    for (const bool causal : {false, true}) {
      for (const int world : {1, 2, 3}) {
        SCOPED_TRACE(absl::StrCat(
            combine == DilatedCombine::kLse ? "LSE" : "HEAD_GROUPS",
            causal ? " causal" : " dense", " world ", world));
        // N prime: short last segments in every branch; GQA 8 / 2, with
        // HEAD_GROUPS groups of 3, 3, 2 heads straddling K/V heads.
        CheckPlans({257, 8, 2, three, combine, causal, world, roomy});
        // Tiny tiles and scratch: segments cut into tiles and batches split.
        CheckPlans(
            {257, 8, 2, three, combine, causal, world, Limits(3, 5, 8 * 3)});
        // Segments longer than a shard; MQA.
        CheckPlans({301,
                    4,
                    1,
                    {{100, 3}, {301, 7}},
                    combine,
                    causal,
                    world,
                    Limits(7, 4, 4 * 7)});
        // Dilation equal to the segment length.
        CheckPlans({64, 2, 2, {{4, 4}, {9, 2}}, combine, causal, world, roomy});
      }
    }
  }
}

AttentionTask WholeTask(int64_t n, int64_t branch) {
  AttentionTask task;
  task.q = task.k = Range{0, n};
  task.kind = TaskKind::kDilated;
  task.branch = branch;
  return task;
}

TEST(GpuDilatedTasksTest, FullSegmentsOfAWindowShareOneLaunch) {
  AttentionSpec spec;
  spec.q_len = spec.kv_len = 1024;
  spec.q_heads = 8;
  spec.kv_heads = 2;
  spec.head_dim = 64;
  spec.causal = true;
  spec.dilated = {{64, 1}, {128, 2}};
  ASSERT_TRUE(spec.Validate().ok());
  const DilatedLimits limits = Limits(16384, 16384, 1024 * 8);
  // Dilation 1 under LSE: every head keeps every position, so one causal
  // launch takes all heads and all 16 segments.
  const std::vector<DilatedCall> all =
      PlanDilatedTask(spec, WholeTask(1024, 0), limits);
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0], (DilatedCall{0, 64, 0, 64, true, 16, 64, 1, 0, 8, 0, 2}));
  // Dilation 2: heads keep different positions; one launch per head, each
  // over all 8 segments, rows from the head's offset on.
  const std::vector<DilatedCall> per_head =
      PlanDilatedTask(spec, WholeTask(1024, 1), limits);
  ASSERT_EQ(per_head.size(), 8u);
  for (int64_t h = 0; h < 8; ++h) {
    EXPECT_EQ(per_head[h], (DilatedCall{h % 2, 64, h % 2, 64, true, 8, 128, 2,
                                        h, 1, h / 4, 1}));
  }
}

TEST(GpuDilatedTasksTest, HeadGroupsLaunchPerGroupAndKvHead) {
  AttentionSpec spec;
  spec.q_len = spec.kv_len = 256;
  spec.q_heads = 8;
  spec.kv_heads = 2;
  spec.head_dim = 64;
  spec.dilated = {{64, 1}, {64, 2}, {128, 4}};
  spec.combine = DilatedCombine::kHeadGroups;
  ASSERT_TRUE(spec.Validate().ok());
  const DilatedLimits limits = Limits(16384, 16384, 256 * 8);
  // Groups [0, 3), [3, 6), [6, 8); K/V heads change at head 4.
  EXPECT_EQ(
      PlanDilatedTask(spec, WholeTask(256, 0), limits),
      (std::vector<DilatedCall>{{0, 64, 0, 64, false, 4, 64, 1, 0, 3, 0, 1}}));
  EXPECT_EQ(
      PlanDilatedTask(spec, WholeTask(256, 1), limits),
      (std::vector<DilatedCall>{{1, 32, 1, 32, false, 4, 64, 2, 3, 1, 0, 1},
                                {1, 32, 1, 32, false, 4, 64, 2, 4, 2, 1, 1}}));
  EXPECT_EQ(
      PlanDilatedTask(spec, WholeTask(256, 2), limits),
      (std::vector<DilatedCall>{{2, 32, 2, 32, false, 2, 128, 4, 6, 2, 1, 1}}));
}

TEST(GpuDilatedTasksTest, StepsHoldTheLaunchesOfTheirTasks) {
  AttentionSpec spec;
  spec.q_len = spec.kv_len = 1009;
  spec.q_heads = spec.kv_heads = 2;
  spec.head_dim = 64;
  spec.causal = true;
  spec.dilated = {{64, 1}, {512, 4}};
  const ShardLayout layout = LayoutFor(spec, 1009, 2);
  const RingPlan plan = RingPlan::Build(spec, layout, layout, nullptr);
  for (int rank = 0; rank < 2; ++rank) {
    const int64_t q_rows = layout.ShardLength(rank);
    const std::vector<std::vector<DilatedCall>> steps =
        PlanDilatedSteps(spec, plan, rank, q_rows, 100, 90);
    ASSERT_EQ(static_cast<int64_t>(steps.size()), plan.num_steps());
    for (int64_t s = 0; s < plan.num_steps(); ++s) {
      std::vector<DilatedCall> want;
      for (const AttentionTask& task : plan.Step(rank, s).tasks) {
        const std::vector<DilatedCall> calls =
            PlanDilatedTask(spec, task, Limits(100, 90, 100 * 2));
        want.insert(want.end(), calls.begin(), calls.end());
      }
      EXPECT_EQ(steps[s], want) << "rank " << rank << " step " << s;
    }
  }
}

}  // namespace
}  // namespace ringattn
