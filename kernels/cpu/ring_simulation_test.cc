// The distributed algorithm (plan + tasks + LSE merges across simulated
// workers) against the float64 reference, for every semantic of DESIGN.md.
// Inputs are fresh uniform random values in [-1, 1); fp32 tolerance: |O -
// O_ref| <= 2e-5 * (1 + |O_ref|) per element and |LSE - LSE_ref| <= 2e-5 * (1 +
// |LSE_ref|), with rows that see no key exactly O = 0, LSE = -inf.

#include "kernels/cpu/ring_simulation.h"

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/random_tensor.h"
#include "gtest/gtest.h"
#include "kernels/cpu/reference_attention.h"
#include "kernels/cpu/reference_checks.h"

namespace ringattn {
namespace {

constexpr double kTolerance = 2e-5;

struct Inputs {
  Tensor<float> q, k, v;
  Tensor<double> o_ref, lse_ref;
};

Inputs MakeInputs(const AttentionSpec& spec, uint32_t seed) {
  Inputs in;
  in.q =
      RandomTensor({spec.batch, spec.q_len, spec.q_heads, spec.head_dim}, seed);
  in.k = RandomTensor({spec.batch, spec.kv_len, spec.kv_heads, spec.head_dim},
                      seed + 1);
  in.v = RandomTensor({spec.batch, spec.kv_len, spec.kv_heads, spec.head_dim},
                      seed + 2);
  in.o_ref = Tensor<double>(in.q.shape());
  in.lse_ref = Tensor<double>({spec.batch, spec.q_len, spec.q_heads, 1});
  ReferenceAttention(spec, in.q.view(), in.k.view(), in.v.view(),
                     in.o_ref.view(), in.lse_ref.view());
  return in;
}

// Runs the ring on each worker count and compares with the reference.
void ExpectRingMatchesReference(const AttentionSpec& spec,
                                const std::vector<int64_t>& worker_counts,
                                uint32_t seed = 1) {
  ASSERT_TRUE(spec.Validate().ok()) << spec.Validate();
  const Inputs in = MakeInputs(spec, seed);
  for (int64_t p : worker_counts) {
    SCOPED_TRACE("workers=" + std::to_string(p));
    absl::StatusOr<AttentionOutput> out =
        SimulateRing(spec, in.q.view(), in.k.view(), in.v.view(), p);
    ASSERT_TRUE(out.ok()) << out.status();
    ExpectCloseToReference(out->o, out->lse, in.o_ref, in.lse_ref, kTolerance);
  }
}

AttentionSpec Spec(int64_t n, int64_t hq, int64_t hkv, int64_t d, bool causal) {
  AttentionSpec spec;
  spec.q_len = spec.kv_len = n;
  spec.q_heads = hq;
  spec.kv_heads = hkv;
  spec.head_dim = d;
  spec.causal = causal;
  return spec;
}

const std::vector<int64_t> kWorkers = {1, 2, 3, 5, 8};

TEST(RingSimulation, DenseMatchesReferenceForOddLengths) {
  for (int64_t n : {1, 7, 257, 1000}) {
    SCOPED_TRACE("N=" + std::to_string(n));
    ExpectRingMatchesReference(Spec(n, 8, 2, 64, false), kWorkers);
  }
}

TEST(RingSimulation, CausalZigzagMatchesReferenceForOddLength) {
  for (int64_t n : {1, 7, 257, 1000}) {
    SCOPED_TRACE("N=" + std::to_string(n));
    ExpectRingMatchesReference(Spec(n, 8, 1, 80, true), kWorkers);
  }
}

TEST(RingSimulation, CausalMatchesReferenceForLongPrimeLength) {
  ExpectRingMatchesReference(Spec(4099, 2, 1, 64, true), {5});
}

TEST(RingSimulation, DenseHeadDim128WithGqaAndBatch) {
  AttentionSpec spec = Spec(257, 8, 2, 128, false);
  spec.batch = 2;
  spec.scale = 0.3f;
  ExpectRingMatchesReference(spec, {3});
  spec.causal = true;
  ExpectRingMatchesReference(spec, {2});
}

TEST(RingSimulation, OddHeadDimsAreCorrect) {
  for (int64_t d : {1, 33, 200, 256}) {
    SCOPED_TRACE("D=" + std::to_string(d));
    ExpectRingMatchesReference(Spec(37, 2, 1, d, true), {3});
  }
}

TEST(RingSimulation, CausalContinuationOfShortQueryBatch) {
  for (int64_t nq : {1, 3, 17}) {
    AttentionSpec spec = Spec(257, 4, 2, 64, true);
    spec.q_len = nq;
    SCOPED_TRACE("Nq=" + std::to_string(nq));
    ExpectRingMatchesReference(spec, {1, 3, 5});
  }
}

TEST(RingSimulation, MoreQueriesThanKeysLeavesEarlyRowsEmpty) {
  AttentionSpec spec = Spec(101, 2, 1, 64, true);
  spec.q_len = 300;  // queries 0..198 see no key: O = 0, LSE = -inf
  ExpectRingMatchesReference(spec, {1, 2, 3});
}

AttentionSpec DilatedSpec(int64_t n, DilatedCombine combine, bool causal) {
  AttentionSpec spec = Spec(n, 8, 2, 64, causal);
  spec.dilated = {{64, 1}, {128, 2}, {256, 4}};
  spec.combine = combine;
  return spec;
}

TEST(RingSimulation, DilatedLseCombineMatchesReference) {
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "dense");
    ExpectRingMatchesReference(DilatedSpec(1000, DilatedCombine::kLse, causal),
                               {1, 3, 5});
  }
}

TEST(RingSimulation, DilatedHeadGroupsMatchesReference) {
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "dense");
    ExpectRingMatchesReference(
        DilatedSpec(1000, DilatedCombine::kHeadGroups, causal), {1, 2, 8});
  }
}

TEST(RingSimulation, DilatedWithShortLastSegmentAndMoreHeadsThanGroups) {
  AttentionSpec spec = DilatedSpec(257, DilatedCombine::kHeadGroups, true);
  spec.q_heads = 7;  // groups of 3, 2, 2
  spec.kv_heads = 7;
  ExpectRingMatchesReference(spec, {1, 3});
  spec.combine = DilatedCombine::kLse;
  ExpectRingMatchesReference(spec, {2});
}

TEST(RingSimulation, BlockSparseRulesMatchReference) {
  AttentionSpec spec = Spec(1000, 4, 2, 64, false);
  BlockSparseRules rules;
  rules.block_size = 32;
  rules.local = 1;
  rules.global = 1;
  rules.dilated = 5;
  rules.random = 2;
  rules.seed = 42;
  rules.pairs = {{30, 3}, {2, 29}};
  spec.block_sparse = rules;
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "dense");
    spec.causal = causal;
    ExpectRingMatchesReference(spec, {1, 3, 8});
  }
}

TEST(RingSimulation, BlockSparseSingleRules) {
  AttentionSpec spec = Spec(257, 2, 1, 64, false);
  BlockSparseRules local;
  local.block_size = 16;
  local.local = 0;
  BlockSparseRules pairs;
  pairs.block_size = 50;
  pairs.pairs = {{5, 0}, {0, 5}};  // rows outside block 0 and 5 see nothing
  for (const BlockSparseRules& rules : {local, pairs}) {
    spec.block_sparse = rules;
    ExpectRingMatchesReference(spec, {2, 5});
  }
}

TEST(RingSimulation, HilbertOnNonSquareGridMatchesReference) {
  AttentionSpec spec = Spec(13 * 21, 4, 1, 64, true);
  spec.hilbert = HilbertGrid{13, 21};
  ExpectRingMatchesReference(spec, {1, 3});
  BlockSparseRules rules;
  rules.block_size = 16;
  rules.local = 1;
  spec.block_sparse = rules;
  ExpectRingMatchesReference(spec, {4});
  spec.block_sparse.reset();
  spec.dilated = {{32, 2}, {91, 3}};
  ExpectRingMatchesReference(spec, {2});
}

TEST(RingSimulation, HilbertOnSingleRowGrid) {
  AttentionSpec spec = Spec(7, 2, 2, 64, false);
  spec.hilbert = HilbertGrid{1, 7};
  ExpectRingMatchesReference(spec, {1, 8});
}

TEST(RingSimulation, DilatedSegmentsInsideShardsNeedNoTraffic) {
  AttentionSpec spec = Spec(1024, 2, 1, 64, false);
  spec.dilated = {{128, 1}, {256, 2}};
  const Inputs in = MakeInputs(spec, 3);
  absl::StatusOr<AttentionOutput> out =
      SimulateRing(spec, in.q.view(), in.k.view(), in.v.view(), 4);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->stats.num_transfers, 0);
  EXPECT_EQ(out->stats.num_steps, 1);
}

TEST(RingSimulation, MemoryPerWorkerFallsWithWorkers) {
  const AttentionSpec spec = Spec(4096, 1, 1, 16, true);
  const Inputs in = MakeInputs(spec, 4);
  int64_t previous = 0;
  for (int64_t p : {1, 2, 4, 8}) {
    absl::StatusOr<AttentionOutput> out =
        SimulateRing(spec, in.q.view(), in.k.view(), in.v.view(), p);
    ASSERT_TRUE(out.ok()) << out.status();
    if (previous != 0) {
      EXPECT_LE(out->stats.peak_rows_per_worker, previous / 2 + 2);
    }
    previous = out->stats.peak_rows_per_worker;
  }
}

TEST(RingSimulation, RejectsTensorsThatDisagreeWithSpec) {
  const AttentionSpec spec = Spec(16, 2, 1, 64, false);
  Tensor<float> q({1, 16, 2, 64}), k({1, 15, 1, 64}), v({1, 16, 1, 64});
  absl::StatusOr<AttentionOutput> out =
      SimulateRing(spec, q.view(), k.view(), v.view(), 2);
  ASSERT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(out.status().message().find("'k'"), std::string::npos)
      << out.status();
}

}  // namespace
}  // namespace ringattn
