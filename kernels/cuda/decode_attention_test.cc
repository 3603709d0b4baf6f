// The decode kernel against the float64 reference on fresh random inputs:
// its own shapes (1, 3, 17 and more query rows against prime key counts, each
// compiled head dim (64, 80, 96, 128, 256) and ones padded to the next, GQA
// and MQA, causal and dense, strided and unaligned), every standard shape, and
// the same with no workspace (one split). Tolerances are AttentionProblem's:
// |o - ref| <= tol * (1 + |ref|) with tol 2e-2 for bf16 and 5e-3 for fp16,
// |lse - ref| <= 1e-2; outputs are NaN-filled before each run. Needs a CUDA
// device; skips with the reason where there is none (the argument checks run
// anywhere).

#include "kernels/cuda/decode_attention.h"

#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/attention_test_util.h"
#include "kernels/cuda/device_buffer.h"

namespace ringattn {
namespace {

std::vector<AttentionCase> DecodeCases() {
  std::vector<AttentionCase> cases = {
      MakeAttentionCase("OneRowGqa", 1, 1, 4099, 32, 8, 128, true),
      MakeAttentionCase("OneRowMqaDense", 2, 1, 1009, 8, 1, 64, false),
      MakeAttentionCase("ThreeRowsCausal", 1, 3, 4099, 8, 2, 128, true),
      MakeAttentionCase("SeventeenRowsDim80", 2, 17, 2003, 6, 2, 80, true),
      MakeAttentionCase("SeventeenRowsMqa", 1, 17, 4099, 4, 1, 64, false),
      MakeAttentionCase("SixteenRowsGqa", 1, 16, 8191, 32, 8, 128, false),
      MakeAttentionCase("SeventeenRowsDim256", 1, 17, 1009, 4, 2, 256, true),
      MakeAttentionCase("ThreeRowsDim81", 1, 3, 1009, 4, 2, 81, true),
      MakeAttentionCase("OneRowGqaDim96", 1, 1, 4099, 32, 8, 96, true),
      MakeAttentionCase("TenRowsGqaDim96Dense", 1, 10, 3001, 16, 4, 96, false),
      MakeAttentionCase("HundredRowsDim80Causal", 1, 100, 2003, 8, 2, 80, true),
      MakeAttentionCase("ThreeRowsDim72", 1, 3, 1009, 4, 2, 72, true),
      MakeAttentionCase("SeventeenRowsDim88", 2, 17, 2003, 6, 2, 88, false),
      MakeAttentionCase("HundredRowsCausal", 1, 100, 2003, 8, 2, 128, true),
      MakeAttentionCase("ThreeRowsNoGroup", 1, 3, 1009, 2, 2, 128, false),
      MakeAttentionCase("StridedSeventeenRows", 2, 17, 1009, 8, 2, 128, true),
  };
  for (AttentionCase& c : cases) {
    if (c.name == "StridedSeventeenRows") c.row_padding = 24;
  }
  return InBothDTypes(cases);
}

// Runs one case with the workspace the kernel asks for (or none) and checks it.
void RunAndCheck(const AttentionCase& c, bool with_workspace) {
  const uint32_t seed = std::random_device()();
  absl::StatusOr<AttentionProblem> problem = AttentionProblem::Create(c, seed);
  ASSERT_TRUE(problem.ok()) << problem.status();
  ASSERT_TRUE(problem->PoisonOutputs().ok());
  DeviceBuffer workspace;
  if (with_workspace) {
    const size_t bytes = DecodeAttentionWorkspaceBytes(problem->args());
    if (bytes > 0) {
      absl::StatusOr<DeviceBuffer> buffer = DeviceBuffer::Allocate(bytes);
      ASSERT_TRUE(buffer.ok()) << buffer.status();
      workspace = *std::move(buffer);
    }
  }
  ASSERT_EQ(LaunchDecodeAttention(problem->args(), workspace.as<void>(),
                                  workspace.bytes(), nullptr),
            cudaSuccess);
  EXPECT_TRUE(problem->OutputsMatchReference()) << "seed " << seed;
}

class DecodeAttentionTest : public ::testing::TestWithParam<AttentionCase> {};

TEST_P(DecodeAttentionTest, MatchesFloat64Reference) {
  SkipWithoutGpu();
  if (IsSkipped()) return;
  RunAndCheck(GetParam(), /*with_workspace=*/true);
}

TEST_P(DecodeAttentionTest, MatchesFloat64ReferenceInOneSplit) {
  SkipWithoutGpu();
  if (IsSkipped()) return;
  RunAndCheck(GetParam(), /*with_workspace=*/false);
}

INSTANTIATE_TEST_SUITE_P(Decode, DecodeAttentionTest,
                         ::testing::ValuesIn(DecodeCases()), AttentionCaseName);
INSTANTIATE_TEST_SUITE_P(Standard, DecodeAttentionTest,
                         ::testing::ValuesIn(StandardAttentionCases()),
                         AttentionCaseName);
INSTANTIATE_TEST_SUITE_P(Unaligned, DecodeAttentionTest,
                         ::testing::ValuesIn(UnalignedAttentionCases()),
                         AttentionCaseName);

TEST(DecodeAttentionArgsTest, RejectsMalformedArgsBeforeTouchingTheDevice) {
  static char memory[64];
  DeviceAttentionArgs args;
  args.q_len = 4;
  args.kv_len = 4;
  args.q_heads = 4;
  args.kv_heads = 3;  // not a divisor of q_heads
  args.head_dim = 64;
  args.q = {memory, 4 * 4 * 64, 4 * 64};
  args.k = {memory, 4 * 3 * 64, 3 * 64};
  args.v = args.k;
  args.o = {memory, 4 * 4 * 64, 4 * 64};
  EXPECT_EQ(LaunchDecodeAttention(args, nullptr, 0, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(DecodeAttentionWorkspaceBytes(args), 0u);
}

TEST(DecodeAttentionArgsTest, EnqueuesNothingForEmptyBlocks) {
  DeviceAttentionArgs args;
  args.q_len = 0;
  args.kv_len = 4;
  args.q_heads = 2;
  args.kv_heads = 1;
  args.head_dim = 64;
  EXPECT_EQ(LaunchDecodeAttention(args, nullptr, 0, nullptr), cudaSuccess);
}

}  // namespace
}  // namespace ringattn
