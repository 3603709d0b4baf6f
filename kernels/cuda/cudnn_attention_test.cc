// cuDNN's path against the float64 reference on fresh random inputs, its
// refusals of shapes it does not take, and its plan cache. Needs a CUDA device
// and cuDNN; skips with the reason where there is none.

#include "kernels/cuda/cudnn_attention.h"

#include <memory>
#include <random>

#include "gtest/gtest.h"
#include "kernels/cuda/attention_test_util.h"

namespace ringattn {
namespace {

class CudnnAttentionTest : public ::testing::TestWithParam<AttentionCase> {
 protected:
  void SetUp() override {
    SkipWithoutGpu();
    if (IsSkipped()) return;
    absl::StatusOr<std::unique_ptr<CudnnAttention>> created =
        CudnnAttention::Create();
    ASSERT_TRUE(created.ok()) << created.status();
    cudnn_ = *std::move(created);
  }

  std::unique_ptr<CudnnAttention> cudnn_;
};

// Every standard shape: the cuDNN path either computes it to tolerance or
// refuses it with UNIMPLEMENTED (named in the skip) so the caller falls back.
TEST_P(CudnnAttentionTest, MatchesFloat64ReferenceOrRefusesTheShape) {
  const uint32_t seed = std::random_device()();
  absl::StatusOr<AttentionProblem> problem =
      AttentionProblem::Create(GetParam(), seed);
  ASSERT_TRUE(problem.ok()) << problem.status();
  ASSERT_TRUE(problem->PoisonOutputs().ok());
  const absl::Status status = cudnn_->Forward(problem->args(), nullptr);
  if (absl::IsUnimplemented(status)) {
    GTEST_SKIP() << "cuDNN " << CudnnAttention::LibraryVersion()
                 << " refuses this shape: " << status.message();
  }
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_TRUE(problem->OutputsMatchReference()) << "seed " << seed;
}

INSTANTIATE_TEST_SUITE_P(Standard, CudnnAttentionTest,
                         ::testing::ValuesIn(StandardAttentionCases()),
                         AttentionCaseName);

class CudnnAttentionRefusalTest : public CudnnAttentionTest {};

TEST_P(CudnnAttentionRefusalTest, RefusesUnalignedShapesAsUnimplemented) {
  absl::StatusOr<AttentionProblem> problem =
      AttentionProblem::Create(GetParam(), 1);
  ASSERT_TRUE(problem.ok()) << problem.status();
  const absl::Status status = cudnn_->Forward(problem->args(), nullptr);
  EXPECT_TRUE(absl::IsUnimplemented(status)) << status;
}

INSTANTIATE_TEST_SUITE_P(Unaligned, CudnnAttentionRefusalTest,
                         ::testing::ValuesIn(UnalignedAttentionCases()),
                         AttentionCaseName);

class CudnnAttentionPlanTest : public CudnnAttentionTest {};

TEST_F(CudnnAttentionPlanTest, ReusesThePlanWhenOnlyPointersChange) {
  AttentionCase c = StandardAttentionCases()[1];
  absl::StatusOr<AttentionProblem> first = AttentionProblem::Create(c, 2);
  absl::StatusOr<AttentionProblem> second = AttentionProblem::Create(c, 3);
  ASSERT_TRUE(first.ok() && second.ok());
  ASSERT_TRUE(cudnn_->Forward(first->args(), nullptr).ok());
  ASSERT_TRUE(cudnn_->Forward(second->args(), nullptr).ok());
  EXPECT_EQ(cudnn_->cached_plans(), 1);
  EXPECT_TRUE(second->OutputsMatchReference());
  c.causal = !c.causal;
  absl::StatusOr<AttentionProblem> other_mask = AttentionProblem::Create(c, 4);
  ASSERT_TRUE(other_mask.ok());
  ASSERT_TRUE(cudnn_->Forward(other_mask->args(), nullptr).ok());
  EXPECT_EQ(cudnn_->cached_plans(), 2);
}

// A cache of three plans fed five shapes keeps the three last used, and a
// dropped shape is built again and still matches the reference.
TEST_F(CudnnAttentionPlanTest, KeepsOnlyTheMostRecentlyUsedPlans) {
  absl::StatusOr<std::unique_ptr<CudnnAttention>> small =
      CudnnAttention::Create(/*max_plans=*/3);
  ASSERT_TRUE(small.ok()) << small.status();
  CudnnAttention& cudnn = **small;
  auto run = [&](int64_t kv_len, uint32_t seed) {
    absl::StatusOr<AttentionProblem> problem = AttentionProblem::Create(
        MakeAttentionCase("lru", 1, 37, kv_len, 4, 2, 64, /*causal=*/true),
        seed);
    ASSERT_TRUE(problem.ok()) << problem.status();
    ASSERT_TRUE(problem->PoisonOutputs().ok());
    ASSERT_TRUE(cudnn.Forward(problem->args(), nullptr).ok());
    EXPECT_TRUE(problem->OutputsMatchReference()) << "kv_len " << kv_len;
  };
  for (int64_t kv_len : {101, 211, 307, 401, 503}) run(kv_len, 10);
  EXPECT_EQ(cudnn.cached_plans(), 3);
  EXPECT_EQ(cudnn.built_plans(), 5);
  run(503, 11);  // still cached: no build
  EXPECT_EQ(cudnn.built_plans(), 5);
  run(101, 12);  // dropped: built again, and 307 (least recently used) goes
  EXPECT_EQ(cudnn.built_plans(), 6);
  run(401, 13);
  EXPECT_EQ(cudnn.built_plans(), 6);
  EXPECT_EQ(cudnn.cached_plans(), 3);
  EXPECT_TRUE(absl::IsInvalidArgument(CudnnAttention::Create(0).status()));
}

// A block of 2 x 1021 x 1021 x 4 heads x 64 (2.1 GFLOP) is worth a plan from
// its second sighting; one under kMinPlanFlops (as every standard case is)
// never; a block without keys needs none.
TEST_F(CudnnAttentionPlanTest, LargeShapesAreWorthAPlanOnTheirSecondSighting) {
  absl::StatusOr<AttentionProblem> problem = AttentionProblem::Create(
      MakeAttentionCase("worth", 2, 1021, 1021, 4, 2, 64, /*causal=*/true), 6);
  ASSERT_TRUE(problem.ok());
  EXPECT_FALSE(cudnn_->WorthRunning(problem->args()));
  EXPECT_TRUE(cudnn_->WorthRunning(problem->args()));
  ASSERT_TRUE(problem->PoisonOutputs().ok());
  ASSERT_TRUE(cudnn_->Forward(problem->args(), nullptr).ok());
  EXPECT_TRUE(problem->OutputsMatchReference());
  EXPECT_EQ(cudnn_->built_plans(), 1);
  EXPECT_TRUE(cudnn_->WorthRunning(problem->args()));  // its plan is cached
  DeviceAttentionArgs other = problem->args();
  other.q_len -= 1;
  EXPECT_FALSE(cudnn_->WorthRunning(other));
  other.batch = 1;
  other.q_len = 400;  // 0.42 GFLOP
  EXPECT_FALSE(cudnn_->WorthRunning(other));
  EXPECT_FALSE(cudnn_->WorthRunning(other));
  absl::StatusOr<AttentionProblem> no_keys = AttentionProblem::Create(
      MakeAttentionCase("no_keys", 2, 7, 0, 2, 2, 64, /*causal=*/false), 7);
  ASSERT_TRUE(no_keys.ok());
  EXPECT_TRUE(cudnn_->WorthRunning(no_keys->args()));
}

TEST_F(CudnnAttentionPlanTest, RejectsMalformedArgsAsInvalidArgument) {
  absl::StatusOr<AttentionProblem> problem =
      AttentionProblem::Create(StandardAttentionCases()[0], 5);
  ASSERT_TRUE(problem.ok());
  DeviceAttentionArgs args = problem->args();
  args.kv_heads = 3;
  EXPECT_TRUE(absl::IsInvalidArgument(cudnn_->Forward(args, nullptr)));
  EXPECT_EQ(cudnn_->cached_plans(), 0);
}

}  // namespace
}  // namespace ringattn
