// The strategy cost model: byte counts for known shapes, the AUTO choice on
// both sides of the break-even point, pass-Q's place in the model, forced
// strategies kept or refused (pass-Q now on any cluster, GPU ones included).

#include "server/strategy_choice.h"

#include <string>

#include "gtest/gtest.h"

namespace ringattn {
namespace {

AttentionSpec Spec(int64_t nq, int64_t nk) {
  AttentionSpec spec;
  spec.q_len = nq;
  spec.kv_len = nk;
  spec.q_heads = 8;
  spec.kv_heads = 2;
  spec.head_dim = 80;
  spec.causal = true;
  return spec;
}

TEST(StrategyChoice, CountsBytesPerTheFormula) {
  // Q = 1*8*80*4 = 2560, R = 1*8*81*4 = 2592, KV = 2*1009*2*80*4 = 1291520,
  // A = 1*8*161*4 = 5152.
  const BytesMoved bytes = EstimateBytesMoved(Spec(1, 1009), 3, 4);
  EXPECT_DOUBLE_EQ(bytes.pass_kv, 2560 + 2592 + 2 * 1291520.0);
  EXPECT_DOUBLE_EQ(bytes.pass_q, 2560 + 2592 + 3 * 5152.0);
  EXPECT_DOUBLE_EQ(bytes.broadcast_q, 3 * (2560 + 2592.0));
  // One worker: no ring, so only Q and its output move.
  const BytesMoved alone = EstimateBytesMoved(Spec(1, 1009), 1, 4);
  EXPECT_DOUBLE_EQ(alone.pass_q, 2560 + 2592.0);
  EXPECT_DOUBLE_EQ(alone.pass_kv, alone.pass_q);
}

TEST(StrategyChoice, PassQUndercutsPassKvButNeverBroadcastQ) {
  // A medium query batch against a long context, fp16 on the wire.
  for (int64_t p : {2, 3, 8}) {
    SCOPED_TRACE(p);
    const BytesMoved bytes = EstimateBytesMoved(Spec(512, 100000), p, 2);
    EXPECT_LT(bytes.pass_q, bytes.pass_kv);
    EXPECT_LT(bytes.broadcast_q, bytes.pass_q);
    EXPECT_EQ(*ChooseStrategy(Spec(512, 100000), v1::STRATEGY_AUTO, p, 2),
              v1::BROADCAST_Q);
  }
  // Where broadcast-Q cannot run the patterns need Nq = Nk, and pass-KV
  // moves less.
  AttentionSpec sparse = Spec(4096, 4096);
  sparse.block_sparse = BlockSparseRules{.block_size = 64, .local = 1};
  const BytesMoved sparse_bytes = EstimateBytesMoved(sparse, 4, 4);
  EXPECT_LT(sparse_bytes.pass_kv, sparse_bytes.pass_q);
  EXPECT_EQ(*ChooseStrategy(sparse, v1::STRATEGY_AUTO, 4, 4), v1::PASS_KV);
}

TEST(StrategyChoice, AutoPicksBroadcastQForShortQueriesOnly) {
  auto choose = [](int64_t nq, int64_t nk, int64_t p) {
    return *ChooseStrategy(Spec(nq, nk), v1::STRATEGY_AUTO, p, 4);
  };
  EXPECT_EQ(choose(1, 1009, 3), v1::BROADCAST_Q);
  EXPECT_EQ(choose(17, 1009, 3), v1::BROADCAST_Q);
  EXPECT_EQ(choose(1009, 1009, 3), v1::PASS_KV);
  // Break-even: Q + R = 5152 * Nq against KV = 1280 * Nk.
  EXPECT_EQ(choose(248, 1000, 3), v1::BROADCAST_Q);
  EXPECT_EQ(choose(249, 1000, 3), v1::PASS_KV);
  // One worker moves the same either way: pass-KV.
  EXPECT_EQ(choose(1, 1009, 1), v1::PASS_KV);
}

TEST(StrategyChoice, AutoKeepsPassKvWhereBroadcastQCannotRun) {
  AttentionSpec sparse = Spec(64, 64);
  sparse.block_sparse = BlockSparseRules{.block_size = 16, .local = 0};
  EXPECT_EQ(*ChooseStrategy(sparse, v1::STRATEGY_AUTO, 8, 4), v1::PASS_KV);
}

TEST(StrategyChoice, ForcedStrategiesAreKeptOrRefused) {
  EXPECT_EQ(*ChooseStrategy(Spec(1009, 1009), v1::BROADCAST_Q, 3, 4),
            v1::BROADCAST_Q);
  EXPECT_EQ(*ChooseStrategy(Spec(1, 1009), v1::PASS_KV, 3, 4), v1::PASS_KV);
  EXPECT_EQ(*ChooseStrategy(Spec(1, 9), v1::PASS_Q, 3, 4), v1::PASS_Q);
  AttentionSpec sparse = Spec(64, 64);
  sparse.block_sparse = BlockSparseRules{.block_size = 16, .local = 0};
  EXPECT_EQ(*ChooseStrategy(sparse, v1::PASS_Q, 3, 4), v1::PASS_Q);
  EXPECT_EQ(ChooseStrategy(Spec(1, 9), static_cast<v1::Strategy>(77), 3, 4)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  AttentionSpec dilated = Spec(16, 16);
  dilated.dilated = {DilatedBranch{8, 2}};
  const absl::Status refused =
      ChooseStrategy(dilated, v1::BROADCAST_Q, 3, 4).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(refused.message().find("dilated"), std::string::npos);
}

TEST(StrategyChoice, ForcedPassQRunsOnAnyClusterAndEveryPattern) {
  // GPU workers run pass-Q too (they used to be refused): forcing it is kept
  // for every pattern, whatever the workers are.
  AttentionSpec dilated = Spec(1009, 1009);
  dilated.dilated = {DilatedBranch{64, 2}};
  AttentionSpec sparse = Spec(1009, 1009);
  sparse.block_sparse = BlockSparseRules{.block_size = 64, .local = 1};
  for (const AttentionSpec& spec :
       {Spec(1, 1009), Spec(1009, 1009), dilated, sparse}) {
    for (int64_t p : {1, 2, 8}) {
      EXPECT_EQ(*ChooseStrategy(spec, v1::PASS_Q, p, 2), v1::PASS_Q);
    }
  }
}

}  // namespace
}  // namespace ringattn
