// The dispatcher: right results on every shape, cuDNN where it takes the
// shape, our kernel where it does not. Needs a CUDA device; skips with the
// reason where there is none.

#include "kernels/cuda/attention_dispatch.h"

#include <random>
#include <string>

#include "gtest/gtest.h"
#include "kernels/cuda/attention_test_util.h"

namespace ringattn {
namespace {

TEST(AttentionPathTest, NamesReadAsWords) {
  EXPECT_EQ(std::string(AttentionPathName(AttentionPath::kCudnn)), "cudnn");
  EXPECT_EQ(std::string(AttentionPathName(AttentionPath::kFlash)), "flash");
}

// Runs `c` through a dispatcher; returns the path taken.
AttentionPath RunAndCheck(AttentionDispatcher& dispatcher,
                          const AttentionCase& c) {
  const uint32_t seed = std::random_device()();
  absl::StatusOr<AttentionProblem> problem = AttentionProblem::Create(c, seed);
  EXPECT_TRUE(problem.ok()) << problem.status();
  if (!problem.ok()) return AttentionPath::kFlash;
  EXPECT_TRUE(problem->PoisonOutputs().ok());
  absl::StatusOr<AttentionPath> path =
      dispatcher.Forward(problem->args(), nullptr);
  EXPECT_TRUE(path.ok()) << path.status();
  if (!path.ok()) return AttentionPath::kFlash;
  EXPECT_TRUE(problem->OutputsMatchReference())
      << "path " << AttentionPathName(*path) << ", seed " << seed;
  return *path;
}

class AttentionDispatchTest : public ::testing::TestWithParam<AttentionCase> {};

TEST_P(AttentionDispatchTest, MatchesFloat64ReferenceOnWhicheverPathRuns) {
  SkipWithoutGpu();
  if (IsSkipped()) return;
  AttentionDispatcher dispatcher;
  const AttentionPath path = RunAndCheck(dispatcher, GetParam());
  RecordProperty("path", AttentionPathName(path));
  if (dispatcher.cudnn_status().ok()) {
    EXPECT_EQ(path, AttentionPath::kCudnn)
        << "cuDNN refused a shape it takes on Hopper with cuDNN 9.19";
  }
}

INSTANTIATE_TEST_SUITE_P(Standard, AttentionDispatchTest,
                         ::testing::ValuesIn(StandardAttentionCases()),
                         AttentionCaseName);

class AttentionFallbackTest : public ::testing::TestWithParam<AttentionCase> {};

TEST_P(AttentionFallbackTest, FallsBackToOurKernelWhereCudnnRefuses) {
  SkipWithoutGpu();
  if (IsSkipped()) return;
  AttentionDispatcher dispatcher;
  EXPECT_EQ(RunAndCheck(dispatcher, GetParam()), AttentionPath::kFlash);
}

INSTANTIATE_TEST_SUITE_P(Unaligned, AttentionFallbackTest,
                         ::testing::ValuesIn(UnalignedAttentionCases()),
                         AttentionCaseName);

}  // namespace
}  // namespace ringattn
