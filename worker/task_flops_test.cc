// TaskFlops and CausalPairs against brute-force counts of visible pairs.

#include "worker/task_flops.h"

#include <string>

#include "core/dilated.h"
#include "gtest/gtest.h"

namespace ringattn {
namespace {

int64_t BruteCausalPairs(const Range& q, const Range& k, int64_t shift) {
  int64_t pairs = 0;
  for (int64_t qp = q.begin; qp < q.end; ++qp) {
    for (int64_t kp = k.begin; kp < k.end; ++kp) pairs += kp <= qp + shift;
  }
  return pairs;
}

TEST(CausalPairs, MatchesBruteForce) {
  for (int64_t shift : {-7, -1, 0, 3, 20}) {
    for (int64_t qb = 0; qb < 12; qb += 3) {
      for (int64_t qe = qb; qe < 20; qe += 4) {
        for (int64_t kb = 0; kb < 15; kb += 2) {
          for (int64_t ke = kb; ke < 22; ke += 5) {
            const Range q{qb, qe}, k{kb, ke};
            ASSERT_EQ(CausalPairs(q, k, shift), BruteCausalPairs(q, k, shift))
                << "q=[" << qb << "," << qe << ") k=[" << kb << "," << ke
                << ") shift=" << shift;
          }
        }
      }
    }
  }
}

AttentionSpec Spec(int64_t n, bool causal) {
  AttentionSpec spec;
  spec.batch = 2;
  spec.q_len = spec.kv_len = n;
  spec.q_heads = 4;
  spec.kv_heads = 2;
  spec.head_dim = 8;
  spec.causal = causal;
  return spec;
}

TEST(TaskFlops, FullAndCausal) {
  const AttentionSpec spec = Spec(100, true);
  AttentionTask task{Range{10, 30}, 0, Range{0, 10}, 0, TaskKind::kFull};
  EXPECT_DOUBLE_EQ(TaskFlops(spec, nullptr, task), 4.0 * 8 * 2 * 4 * 20 * 10);
  task.k = Range{10, 30};
  task.kind = TaskKind::kCausal;
  EXPECT_DOUBLE_EQ(TaskFlops(spec, nullptr, task), 4.0 * 8 * 2 * 4 * 210);
}

TEST(TaskFlops, BlockSparseCountsAllowedPairsOnly) {
  AttentionSpec spec = Spec(40, false);
  BlockSparseRules rules;
  rules.block_size = 8;
  rules.local = 0;
  spec.block_sparse = rules;
  const BlockMask blocks = BlockMask::FromRules(rules, spec.kv_len);
  const AttentionTask task{Range{4, 20}, 0, Range{0, 40}, 0,
                           TaskKind::kBlockSparse};
  // Diagonal blocks only: q 4..7 x block 0, 8..15 x block 1, 16..19 x block 2.
  EXPECT_DOUBLE_EQ(TaskFlops(spec, &blocks, task),
                   4.0 * 8 * 2 * 4 * (4 * 8 + 8 * 8 + 4 * 8));
  spec.causal = true;
  EXPECT_DOUBLE_EQ(TaskFlops(spec, &blocks, task),
                   4.0 * 8 * 2 * 4 *
                       (BruteCausalPairs({4, 8}, {0, 8}, 0) +
                        BruteCausalPairs({8, 16}, {8, 16}, 0) +
                        BruteCausalPairs({16, 20}, {16, 24}, 0)));
}

TEST(TaskFlops, DilatedCountsKeptPairsPerHead) {
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "dense");
    AttentionSpec spec = Spec(50, causal);
    spec.dilated = {{16, 2}};
    const AttentionTask task{Range{0, 50},       0, Range{0, 50}, 0,
                             TaskKind::kDilated, 0};
    int64_t pairs = 0;
    for (int64_t h = 0; h < spec.q_heads; ++h) {
      const int64_t offset = DilatedOffset(spec, 0, h);
      for (int64_t qp = 0; qp < 50; ++qp) {
        for (int64_t kp = 0; kp < 50; ++kp) {
          const bool same_segment = qp / 16 == kp / 16;
          const bool kept = (qp % 16) % 2 == offset && (kp % 16) % 2 == offset;
          pairs += same_segment && kept && (!causal || kp <= qp);
        }
      }
    }
    EXPECT_DOUBLE_EQ(TaskFlops(spec, nullptr, task), 4.0 * 8 * 2 * pairs);
  }
}

}  // namespace
}  // namespace ringattn
