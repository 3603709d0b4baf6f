// The merge cost model: its formula for a known shape, the AUTO choice for a
// one-row decode step (the coordinator) and for thousands of rows over p >= 2
// workers (the tree), the cost of connecting a new communicator, a world of
// one, and forced or unknown choices.

#include "server/merge_choice.h"

#include <cmath>

#include "gtest/gtest.h"

namespace ringattn {
namespace {

AttentionSpec Spec(int64_t nq) {
  AttentionSpec spec;
  spec.q_len = nq;
  spec.kv_len = int64_t{1} << 20;
  spec.q_heads = 32;
  spec.kv_heads = 8;
  spec.head_dim = 128;
  spec.causal = true;
  return spec;
}

TEST(MergeChoice, EstimatesSecondsPerTheFormula) {
  const MergeRates rates{/*grpc=*/1e9,       /*interconnect=*/1e10,
                         /*host_merge=*/2e9, /*worker_merge=*/4e9,
                         /*join_kept=*/1e-3, /*join_new=*/0.5};
  // R = 256*32*129*4 = 4227072, Y (bf16) = 256*32*(128*2+4) = 2129920.
  const double r = 4227072, y = 2129920;
  const MergeSeconds five = EstimateMergeSeconds(Spec(256), 5, 2, rates,
                                                 /*communicator_kept=*/true);
  EXPECT_DOUBLE_EQ(five.at_coordinator, 5 * r / 1e9 + 5 * r / 2e9);
  EXPECT_DOUBLE_EQ(five.on_workers, 1e-3 + 3 * (r / 1e10 + r / 4e9) + y / 1e9);
  const MergeSeconds fresh = EstimateMergeSeconds(Spec(256), 5, 2, rates,
                                                  /*communicator_kept=*/false);
  EXPECT_DOUBLE_EQ(fresh.on_workers - five.on_workers, 0.5 - 1e-3);
  // A world of one joins nothing and has nothing to send to a peer.
  EXPECT_DOUBLE_EQ(
      EstimateMergeSeconds(Spec(256), 1, 2, rates, false).on_workers, y / 1e9);
}

TEST(MergeChoice, OneRowDecodeOverSeveralWorkersStaysAtTheCoordinator) {
  for (const MergeRates& rates : {GpuMergeRates(), CpuMergeRates()}) {
    for (int64_t p : {2, 3, 4, 8}) {
      for (int64_t out : {2, 4}) {
        for (bool kept : {true, false}) {
          EXPECT_EQ(
              *ChoosePartialMerge(Spec(1), v1::MERGE_AUTO, p, out, rates, kept),
              v1::MERGE_AT_COORDINATOR)
              << "p " << p << ", output bytes " << out << ", kept " << kept;
        }
      }
    }
  }
}

TEST(MergeChoice, ThousandsOfRowsOverTwoOrMoreWorkersGoToTheTree) {
  for (const MergeRates& rates : {GpuMergeRates(), CpuMergeRates()}) {
    for (int64_t p : {2, 3, 5, 8}) {
      for (int64_t nq : {2048, 4096}) {
        for (int64_t out : {2, 4}) {
          EXPECT_EQ(*ChoosePartialMerge(Spec(nq), v1::MERGE_AUTO, p, out, rates,
                                        /*communicator_kept=*/true),
                    v1::MERGE_ON_WORKERS)
              << "p " << p << ", Nq " << nq << ", output bytes " << out;
        }
      }
    }
  }
}

TEST(MergeChoice, ANewCommunicatorMustPayForItself) {
  // 256 rows on 2 GPUs: worth the tree over the kept communicator (about 3 ms
  // against 13 ms), not when NCCL must connect anew (50 ms).
  EXPECT_EQ(*ChoosePartialMerge(Spec(256), v1::MERGE_AUTO, 2, 2,
                                GpuMergeRates(), /*communicator_kept=*/true),
            v1::MERGE_ON_WORKERS);
  EXPECT_EQ(*ChoosePartialMerge(Spec(256), v1::MERGE_AUTO, 2, 2,
                                GpuMergeRates(), /*communicator_kept=*/false),
            v1::MERGE_AT_COORDINATOR);
}

TEST(MergeChoice, AWorldOfOneSendsItsPartialAsTheOutput) {
  for (const MergeRates& rates : {GpuMergeRates(), CpuMergeRates()}) {
    for (int64_t rows : {1, 4096}) {
      for (bool kept : {false, true}) {
        EXPECT_EQ(
            *ChoosePartialMerge(Spec(rows), v1::MERGE_AUTO, 1, 2, rates, kept),
            v1::MERGE_ON_WORKERS);
      }
    }
  }
}

TEST(MergeChoice, ForcedChoicesWinAndUnknownValuesAreRefused) {
  EXPECT_EQ(*ChoosePartialMerge(Spec(1), v1::MERGE_ON_WORKERS, 2, 4,
                                CpuMergeRates(), false),
            v1::MERGE_ON_WORKERS);
  EXPECT_EQ(*ChoosePartialMerge(Spec(4096), v1::MERGE_AT_COORDINATOR, 8, 2,
                                GpuMergeRates(), true),
            v1::MERGE_AT_COORDINATOR);
  const absl::StatusOr<v1::PartialMerge> bad = ChoosePartialMerge(
      Spec(1), static_cast<v1::PartialMerge>(7), 2, 4, CpuMergeRates(), true);
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status())) << bad.status();
  EXPECT_EQ(bad.status().message(), "field 'partial_merge' has no value 7");
}

}  // namespace
}  // namespace ringattn
