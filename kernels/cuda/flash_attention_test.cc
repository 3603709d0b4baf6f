// Our attention kernel against the float64 reference on fresh random inputs,
// over every standard shape and the unaligned ones only it takes. Needs a CUDA
// device; skips with the reason where there is none (the argument checks run
// anywhere).

#include "kernels/cuda/flash_attention.h"

#include <random>

#include "gtest/gtest.h"
#include "kernels/cuda/attention_dispatch.h"
#include "kernels/cuda/attention_test_util.h"

namespace ringattn {
namespace {

class FlashAttentionTest : public ::testing::TestWithParam<AttentionCase> {};

TEST_P(FlashAttentionTest, MatchesFloat64Reference) {
  SkipWithoutGpu();
  if (IsSkipped()) return;
  const uint32_t seed = std::random_device()();
  absl::StatusOr<AttentionProblem> problem =
      AttentionProblem::Create(GetParam(), seed);
  ASSERT_TRUE(problem.ok()) << problem.status();
  ASSERT_TRUE(problem->PoisonOutputs().ok());
  ASSERT_TRUE(RunFlashAttention(problem->args(), nullptr).ok());
  EXPECT_TRUE(problem->OutputsMatchReference()) << "seed " << seed;
}

INSTANTIATE_TEST_SUITE_P(Standard, FlashAttentionTest,
                         ::testing::ValuesIn(StandardAttentionCases()),
                         AttentionCaseName);
INSTANTIATE_TEST_SUITE_P(Unaligned, FlashAttentionTest,
                         ::testing::ValuesIn(UnalignedAttentionCases()),
                         AttentionCaseName);

DeviceAttentionArgs WellFormedArgs() {
  static char memory[64];
  DeviceAttentionArgs args;
  args.batch = 1;
  args.q_len = 4;
  args.kv_len = 4;
  args.q_heads = 4;
  args.kv_heads = 2;
  args.head_dim = 64;
  args.q = {memory, 4 * 4 * 64, 4 * 64};
  args.k = {memory, 4 * 2 * 64, 2 * 64};
  args.v = args.k;
  args.o = {memory, 4 * 4 * 64, 4 * 64};
  args.scale = 0.125f;
  return args;
}

TEST(FlashAttentionArgsTest, RejectsMalformedArgsBeforeTouchingTheDevice) {
  EXPECT_EQ(FindAttentionArgsProblem(WellFormedArgs()), nullptr);
  DeviceAttentionArgs heads = WellFormedArgs();
  heads.kv_heads = 3;
  DeviceAttentionArgs dim = WellFormedArgs();
  dim.head_dim = 257;
  DeviceAttentionArgs scale = WellFormedArgs();
  scale.scale = 0.0f;
  DeviceAttentionArgs stride = WellFormedArgs();
  stride.k.seq_stride = 64;
  DeviceAttentionArgs null_v = WellFormedArgs();
  null_v.v.data = nullptr;
  for (const DeviceAttentionArgs& bad : {heads, dim, scale, stride, null_v}) {
    EXPECT_NE(FindAttentionArgsProblem(bad), nullptr);
    EXPECT_EQ(LaunchFlashAttention(bad, nullptr), cudaErrorInvalidValue);
    EXPECT_TRUE(absl::IsInvalidArgument(RunFlashAttention(bad, nullptr)));
  }
}

TEST(FlashAttentionArgsTest, EnqueuesNothingForEmptyBlocks) {
  DeviceAttentionArgs args = WellFormedArgs();
  args.q_len = 0;
  EXPECT_EQ(LaunchFlashAttention(args, nullptr), cudaSuccess);
  args = WellFormedArgs();
  args.batch = 0;
  EXPECT_EQ(LaunchFlashAttention(args, nullptr), cudaSuccess);
}

}  // namespace
}  // namespace ringattn
