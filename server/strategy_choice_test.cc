// The strategy cost model: seconds per the formula for known shapes, the
// AUTO choice on both sides of its break-even points (on GPU rates, the
// choices measured fastest on 2x H200), forced strategies kept or refused.

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

// The shapes of the resident-context benchmark: Hq=32, Hkv=8, D=128.
AttentionSpec ContextSpec(int64_t nq, int64_t nk) {
  AttentionSpec spec = Spec(nq, nk);
  spec.q_heads = 32;
  spec.kv_heads = 8;
  spec.head_dim = 128;
  return spec;
}

// Round numbers, so that the expected seconds below can be read off.
StrategyRates PlainRates() {
  StrategyRates rates;
  rates.merge = MergeRates{/*grpc=*/1e9,       /*interconnect=*/1e10,
                           /*host_merge=*/1e9, /*worker_merge=*/1e10,
                           /*join_kept=*/1e-3, /*join_new=*/0.05};
  rates.memory = 1e11;
  rates.flops = 1e12;
  rates.step = 1e-4;
  rates.hop_interference = 0.5;
  rates.ring_element_bytes = 2;
  return rates;
}

v1::Strategy Auto(const AttentionSpec& spec, int64_t p,
                  const StrategyRates& rates) {
  return *ChooseStrategy(spec, v1::STRATEGY_AUTO, p, /*wire=*/2, /*output=*/2,
                         rates, /*communicator_kept=*/true);
}

TEST(StrategyChoice, EstimatesSecondsPerTheFormula) {
  AttentionSpec spec = Spec(4, 1000);
  spec.causal = false;  // c = 1
  const StrategyRates rates = PlainRates();
  const StrategySeconds s = EstimateStrategySeconds(
      spec, /*workers=*/2, /*wire=*/2, /*output=*/2, rates, true);
  // Q = 4*8*80*2 = 5120, Y = 4*8*(80*2+4) = 5248, KV(500) = 2*500*2*80*2 =
  // 320000, A = 4*8*(80*2+4*81) = 15488; T(2, 500) = 320000/1e11 +
  // 4*2*500*8*80/1e12, T(4, 500) = 320000/1e11 + 4*4*500*8*80/1e12.
  const double t2 = 320000 / 1e11 + 4.0 * 2 * 500 * 8 * 80 / 1e12;
  const double t4 = 320000 / 1e11 + 4.0 * 4 * 500 * 8 * 80 / 1e12;
  const double hop = 320000 / 1e10;
  const double copy = 2 * 320000 / 1e11;
  EXPECT_DOUBLE_EQ(s.pass_kv, (5120 + 5248) / 1e9 + copy + t2 +
                                  std::max(t2, hop) + 0.5 * std::min(t2, hop) +
                                  1e-4);
  EXPECT_DOUBLE_EQ(s.pass_q,
                   (5120 + 5248) / 1e9 + 2 * (t2 + 15488 / 2e10 + 1e-4));
  const MergeSeconds merge =
      EstimateMergeSeconds(spec, 2, 2, rates.merge, true);
  EXPECT_DOUBLE_EQ(
      s.broadcast_q,
      2 * 5120 / 1e9 + t4 + std::min(merge.at_coordinator, merge.on_workers));
}

TEST(StrategyChoice, OneGpuRunsPassKv) {
  for (int64_t nq : {1, 300, 5000}) {
    EXPECT_EQ(Auto(ContextSpec(nq, 100000), 1, GpuStrategyRates()),
              v1::PASS_KV);
  }
}

// A single CPU worker's pass-KV copies the context; broadcast-Q reads it in
// place, so it takes short queries there too.
TEST(StrategyChoice, OneCpuWorkerReadsShortQueriesInPlace) {
  const StrategyRates cpu = CpuStrategyRates();
  auto choose = [&](int64_t nq) {
    return *ChooseStrategy(ContextSpec(nq, 65536), v1::STRATEGY_AUTO, 1, 2, 2,
                           cpu, false);
  };
  EXPECT_EQ(choose(1), v1::BROADCAST_Q);
  EXPECT_EQ(choose(16), v1::BROADCAST_Q);
  const StrategySeconds s =
      EstimateStrategySeconds(ContextSpec(1, 65536), 1, 2, 2, cpu, false);
  // The copy: K and V of 65536 rows, 8 heads of 128, fp32, read and written.
  EXPECT_GT(s.pass_kv - s.broadcast_q,
            0.9 * 2 * 2 * 65536 * 8 * 128 * 4 / 1e10);
}

TEST(StrategyChoice, GpuChoicesFollowWhatRanFastestOnTwoH200) {
  // 2x H200, 1M- and 4M-token contexts (docs/results/
  // h200x2-resident-contexts-s6.md, h200x2-short-batches-s8.md):
  // broadcast-Q for 1 and 16 rows, pass-Q from 256 rows (14.9 ms at 1M
  // against broadcast-Q's 15.5-15.9; at 4096 rows 148-151 ms against
  // pass-KV's 153-163 and broadcast-Q's 184-197; 325 against 362 at 4M).
  const StrategyRates gpu = GpuStrategyRates();
  for (int64_t nk : {int64_t{1} << 20, int64_t{1} << 22}) {
    SCOPED_TRACE(nk);
    for (int64_t nq : {1, 16}) {
      EXPECT_EQ(Auto(ContextSpec(nq, nk), 2, gpu), v1::BROADCAST_Q) << nq;
    }
    for (int64_t nq : {256, 1024, 4096}) {
      EXPECT_EQ(Auto(ContextSpec(nq, nk), 2, gpu), v1::PASS_Q) << nq;
    }
  }
  // A whole sequence (Nq = Nk): pass-KV.
  EXPECT_EQ(Auto(ContextSpec(1 << 20, 1 << 20), 2, gpu), v1::PASS_KV);
}

TEST(StrategyChoice, PassQNeedsFullRateBlocks) {
  // 127 rows over 2 GPUs: blocks of 64 rows, weighed; 126: blocks of 63,
  // not weighed, whatever the estimate.
  const StrategyRates gpu = GpuStrategyRates();
  const AttentionSpec weighed = ContextSpec(127, 1 << 20);
  const AttentionSpec small = ContextSpec(126, 1 << 20);
  const StrategySeconds s = EstimateStrategySeconds(small, 2, 2, 2, gpu, true);
  EXPECT_LT(s.pass_q, std::min(s.pass_kv, s.broadcast_q));
  EXPECT_NE(Auto(small, 2, gpu), v1::PASS_Q);
  EXPECT_EQ(Auto(weighed, 2, gpu), v1::PASS_Q);
}

TEST(StrategyChoice, CpuAutoPicksBroadcastQForShortQueriesOnly) {
  const StrategyRates cpu = CpuStrategyRates();
  auto choose = [&](int64_t nq, int64_t nk, int64_t p) {
    return *ChooseStrategy(Spec(nq, nk), v1::STRATEGY_AUTO, p, 4, 4, cpu, true);
  };
  EXPECT_EQ(choose(1, 1009, 3), v1::BROADCAST_Q);
  EXPECT_EQ(choose(17, 1009, 3), v1::BROADCAST_Q);
  EXPECT_EQ(choose(1009, 1009, 3), v1::PASS_KV);
  // Somewhere between, broadcast-Q's fan-out of Q and its merge outgrow the
  // ring's steps.
  int64_t last_broadcast = 0;
  for (int64_t nq = 1; nq <= 1000; ++nq) {
    if (choose(nq, 1000, 3) == v1::BROADCAST_Q) last_broadcast = nq;
  }
  EXPECT_GT(last_broadcast, 17);
  EXPECT_LT(last_broadcast, 1000);
  EXPECT_EQ(choose(last_broadcast + 1, 1000, 3), v1::PASS_KV);
}

TEST(StrategyChoice, AutoKeepsPassKvWhereBroadcastQCannotRun) {
  AttentionSpec sparse = Spec(64, 64);
  sparse.block_sparse = BlockSparseRules{.block_size = 16, .local = 0};
  EXPECT_EQ(Auto(sparse, 8, CpuStrategyRates()), v1::PASS_KV);
  AttentionSpec dilated = ContextSpec(1, 1 << 20);
  dilated.dilated = {DilatedBranch{4096, 1}};
  EXPECT_EQ(Auto(dilated, 2, GpuStrategyRates()), v1::PASS_KV);
}

TEST(StrategyChoice, ForcedStrategiesAreKeptOrRefused) {
  const StrategyRates cpu = CpuStrategyRates();
  const auto forced = [&](const AttentionSpec& spec, v1::Strategy strategy) {
    return ChooseStrategy(spec, strategy, 3, 4, 4, cpu, true);
  };
  EXPECT_EQ(*forced(Spec(1009, 1009), v1::BROADCAST_Q), v1::BROADCAST_Q);
  EXPECT_EQ(*forced(Spec(1, 1009), v1::PASS_KV), v1::PASS_KV);
  EXPECT_EQ(*forced(Spec(1, 9), v1::PASS_Q), v1::PASS_Q);
  AttentionSpec sparse = Spec(64, 64);
  sparse.block_sparse = BlockSparseRules{.block_size = 16, .local = 0};
  EXPECT_EQ(*forced(sparse, v1::PASS_Q), v1::PASS_Q);
  EXPECT_EQ(forced(Spec(1, 9), static_cast<v1::Strategy>(77)).status().code(),
            absl::StatusCode::kInvalidArgument);
  AttentionSpec dilated = Spec(16, 16);
  dilated.dilated = {DilatedBranch{8, 2}};
  const absl::Status refused = forced(dilated, v1::BROADCAST_Q).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(refused.message().find("dilated"), std::string::npos);
}

TEST(StrategyChoice, ForcedPassQRunsOnAnyClusterAndEveryPattern) {
  AttentionSpec dilated = Spec(1009, 1009);
  dilated.dilated = {DilatedBranch{64, 2}};
  AttentionSpec sparse = Spec(1009, 1009);
  sparse.block_sparse = BlockSparseRules{.block_size = 64, .local = 1};
  for (const AttentionSpec& spec :
       {Spec(1, 1009), Spec(1009, 1009), dilated, sparse}) {
    for (int64_t p : {1, 2, 8}) {
      for (const StrategyRates& rates :
           {CpuStrategyRates(), GpuStrategyRates()}) {
        EXPECT_EQ(*ChooseStrategy(spec, v1::PASS_Q, p, 2, 2, rates, false),
                  v1::PASS_Q);
      }
    }
  }
}

}  // namespace
}  // namespace ringattn
