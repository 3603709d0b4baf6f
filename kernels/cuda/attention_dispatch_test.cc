// The dispatcher: right results on every shape, cuDNN where it takes the
// shape, our kernels where it does not or where they are faster (the decode
// kernel, the split Hopper kernel). Needs a CUDA device; skips with the
// reason where there is none.

#include "kernels/cuda/attention_dispatch.h"

#include <random>
#include <string>
#include <utility>

#include "gtest/gtest.h"
#include "kernels/cuda/attention_test_util.h"
#include "kernels/cuda/hopper_attention.h"

namespace ringattn {
namespace {

TEST(AttentionPathTest, NamesReadAsWords) {
  EXPECT_EQ(std::string(AttentionPathName(AttentionPath::kCudnn)), "cudnn");
  EXPECT_EQ(std::string(AttentionPathName(AttentionPath::kFlash)), "flash");
  EXPECT_EQ(std::string(AttentionPathName(AttentionPath::kHopper)), "hopper");
  EXPECT_EQ(std::string(AttentionPathName(AttentionPath::kDecode)), "decode");
}

// Runs `c` through a dispatcher; returns the path taken and whether the
// split Hopper kernel, the decode kernel or the whole Hopper kernel should
// have taken it.
struct Ran {
  AttentionPath path = AttentionPath::kFlash;
  bool split_expected = false;
  bool decode_expected = false;
  bool whole_expected = false;
};

Ran RunAndCheck(AttentionDispatcher& dispatcher, const AttentionCase& c) {
  const uint32_t seed = std::random_device()();
  absl::StatusOr<AttentionProblem> problem = AttentionProblem::Create(c, seed);
  EXPECT_TRUE(problem.ok()) << problem.status();
  if (!problem.ok()) return {};
  EXPECT_TRUE(problem->PoisonOutputs().ok());
  absl::StatusOr<AttentionPath> path =
      dispatcher.Forward(problem->args(), nullptr);
  EXPECT_TRUE(path.ok()) << path.status();
  if (!path.ok()) return {};
  EXPECT_TRUE(problem->OutputsMatchReference())
      << "path " << AttentionPathName(*path) << ", seed " << seed;
  return {*path, PrefersHopperSplit(problem->args()),
          PrefersDecode(problem->args()), PrefersHopperWhole(problem->args())};
}

class AttentionDispatchTest : public ::testing::TestWithParam<AttentionCase> {};

// Each shape twice, on fresh inputs: a block for cuDNN runs on our kernel the
// first time (no plan is built for a shape met once) and on cuDNN the second
// if it has kMinPlanFlops of work (on our kernel again if not); a block
// without keys needs no plan and goes to cuDNN at once.
TEST_P(AttentionDispatchTest, MatchesFloat64ReferenceOnWhicheverPathRuns) {
  SkipWithoutGpu();
  if (IsSkipped()) return;
  AttentionDispatcher dispatcher;
  const AttentionCase& c = GetParam();
  const Ran first = RunAndCheck(dispatcher, c);
  const Ran ran = RunAndCheck(dispatcher, c);
  RecordProperty("path", AttentionPathName(ran.path));
  const bool worth_a_plan =
      4.0 * c.batch * c.q_len * c.kv_len * c.q_heads * c.head_dim >=
      kMinPlanFlops;
  if (ran.split_expected) {
    EXPECT_EQ(ran.path, AttentionPath::kHopper);
  } else if (ran.decode_expected) {
    EXPECT_EQ(ran.path, AttentionPath::kDecode);
  } else if (ran.whole_expected) {
    EXPECT_EQ(ran.path, AttentionPath::kHopper);
  } else if (dispatcher.cudnn_status().ok() && c.kv_len == 0) {
    EXPECT_EQ(ran.path, AttentionPath::kCudnn);
  } else if (dispatcher.cudnn_status().ok()) {
    EXPECT_NE(first.path, AttentionPath::kCudnn)
        << "cuDNN built a plan for a shape met once";
    if (worth_a_plan) {
      EXPECT_EQ(ran.path, AttentionPath::kCudnn)
          << "cuDNN refused a shape it takes on Hopper with cuDNN 9.19";
    } else {
      EXPECT_NE(ran.path, AttentionPath::kCudnn)
          << "cuDNN built a plan for a block too small to repay it";
    }
  }
}

// Folds the case's two key parts through the dispatcher from `start`, each
// shape twice (so that cuDNN takes the shapes worth a plan the second time),
// and compares with the reference.
void ExpectForwardIntoMatchesReference(const AttentionCase& c,
                                       AttentionProblem::Start start) {
  AttentionDispatcher dispatcher;
  for (int round = 0; round < 2; ++round) {
    const uint32_t seed = std::random_device()();
    absl::StatusOr<AttentionProblem> problem =
        AttentionProblem::Create(c, seed);
    ASSERT_TRUE(problem.ok()) << problem.status();
    std::string paths;
    const absl::Status folded = problem->FoldKeyParts(
        [&](const DeviceAttentionArgs& args, const AccumulatorRows& into) {
          absl::StatusOr<AttentionPath> path =
              dispatcher.ForwardInto(args, into, nullptr);
          if (!path.ok()) return path.status();
          paths += std::string(" ") + AttentionPathName(*path);
          return absl::OkStatus();
        },
        start);
    ASSERT_TRUE(folded.ok()) << folded;
    EXPECT_TRUE(problem->OutputsMatchReference())
        << "paths" << paths << ", seed " << seed;
  }
}

// ForwardInto folds two key parts into cleared accumulators to the whole
// block's result on whichever paths run: the Hopper kernel folding as it
// stores, or a path that writes the partial result and a merge after it.
TEST_P(AttentionDispatchTest, ForwardIntoAccumulatorsMatchesFloat64Reference) {
  SkipWithoutGpu();
  if (IsSkipped()) return;
  ExpectForwardIntoMatchesReference(GetParam(),
                                    AttentionProblem::Start::kCleared);
}

// The same with the first key part stored into accumulators that were never
// cleared (they hold NaN): every path stores a fresh row without reading it.
TEST_P(AttentionDispatchTest, ForwardIntoFreshAccumulatorsMatchesReference) {
  SkipWithoutGpu();
  if (IsSkipped()) return;
  ExpectForwardIntoMatchesReference(GetParam(),
                                    AttentionProblem::Start::kFresh);
}

// Preferring our kernel moves every block cuDNN would take, and that the
// Hopper kernel takes, to it; results stay right.
TEST_P(AttentionDispatchTest, PreferringOwnKernelRunsTheHopperKernel) {
  SkipWithoutGpu();
  if (IsSkipped()) return;
  AttentionDispatcher dispatcher;
  dispatcher.PreferOwnKernel(true);
  const uint32_t seed = std::random_device()();
  absl::StatusOr<AttentionProblem> problem =
      AttentionProblem::Create(GetParam(), seed);
  ASSERT_TRUE(problem.ok()) << problem.status();
  const bool hopper =
      !PrefersDecode(problem->args()) && HopperAttentionTakes(problem->args());
  const Ran ran = RunAndCheck(dispatcher, GetParam());
  if (hopper) EXPECT_EQ(ran.path, AttentionPath::kHopper);
  if (ran.decode_expected) EXPECT_EQ(ran.path, AttentionPath::kDecode);
}

INSTANTIATE_TEST_SUITE_P(Standard, AttentionDispatchTest,
                         ::testing::ValuesIn(StandardAttentionCases()),
                         AttentionCaseName);

// Blocks with enough work for a cuDNN plan (kMinPlanFlops) that no other path
// prefers: D=64, under 16K keys, too many rows for the decode kernel.
INSTANTIATE_TEST_SUITE_P(
    WorthAPlan, AttentionDispatchTest,
    ::testing::ValuesIn(InBothDTypes(
        {MakeAttentionCase("CausalGqa", 2, 1021, 1021, 4, 2, 64, true),
         MakeAttentionCase("Dense", 1, 1500, 1201, 8, 8, 64, false)})),
    AttentionCaseName);

// One to a few hundred rows against many keys: too few query tiles to fill
// the GPU, so the Hopper kernel runs with its keys split (where the GPU is a
// Hopper), a decode step's single row included.
TEST(AttentionSplitTest, SendsFewRowsAgainstManyKeysToTheSplitKernel) {
  SkipWithoutGpu();
  if (IsSkipped()) return;
  for (const int64_t rows : {1, 16, 150}) {
    for (const bool causal : {false, true}) {
      AttentionDispatcher dispatcher;
      const Ran ran = RunAndCheck(
          dispatcher,
          MakeAttentionCase("FewRowsGqa", 1, rows, 12007, 8, 2, 128, causal));
      if (!ran.split_expected) {
        GTEST_SKIP() << "the Hopper kernel does not run on this GPU";
      }
      EXPECT_EQ(ran.path, AttentionPath::kHopper) << rows << " rows";
    }
  }
}

// Groups of heads that are not a power of two (6 and 7 query heads on each
// K/V head) pack whole into the split kernel's tiles too, which read each K/V
// head once: one row and 14 rows (98 packed) run there.
TEST(AttentionSplitTest, SendsFewRowsOfGroupsOfSixAndSevenToTheSplitKernel) {
  SkipWithoutGpu();
  if (IsSkipped()) return;
  for (const int64_t rows : {1, 14}) {
    for (const auto& [q_heads, kv_heads] :
         {std::pair{12, 2}, std::pair{7, 1}}) {
      AttentionDispatcher dispatcher;
      const Ran ran = RunAndCheck(
          dispatcher, MakeAttentionCase("FewRowsOddGroup", 1, rows, 12007,
                                        q_heads, kv_heads, 128, rows == 1));
      if (!ran.split_expected) {
        GTEST_SKIP() << "the Hopper kernel does not run on this GPU";
      }
      EXPECT_EQ(ran.path, AttentionPath::kHopper)
          << rows << " rows, " << q_heads << " / " << kv_heads << " heads";
    }
  }
}

// Too few keys to split (under 8192): the decode kernel keeps few rows.
TEST(AttentionDecodeTest, SendsFewRowsAgainstFewThousandKeysToTheDecodeKernel) {
  SkipWithoutGpu();
  if (IsSkipped()) return;
  AttentionDispatcher dispatcher;
  const Ran ran = RunAndCheck(
      dispatcher,
      MakeAttentionCase("ThreeRowsGqa", 1, 3, 4099, 8, 2, 128, true));
  EXPECT_TRUE(ran.decode_expected);
  EXPECT_EQ(ran.path, AttentionPath::kDecode);
}

// Args of a whole bf16 block with contiguous rows at aligned (never read)
// addresses: enough for the dispatcher's predicates.
DeviceAttentionArgs WholeBlockArgs(int64_t q_len, int64_t kv_len,
                                   int64_t head_dim) {
  alignas(16) static char placeholder[16];
  DeviceAttentionArgs args;
  args.q_len = q_len;
  args.kv_len = kv_len;
  args.q_heads = 32;
  args.kv_heads = 8;
  args.head_dim = head_dim;
  const int64_t q_row = args.q_heads * head_dim;
  const int64_t kv_row = args.kv_heads * head_dim;
  args.q = {placeholder, q_len * q_row, q_row};
  args.k = {placeholder, kv_len * kv_row, kv_row};
  args.v = {placeholder, kv_len * kv_row, kv_row};
  args.o = {placeholder, q_len * q_row, q_row};
  args.scale = 0.125f;
  args.causal = true;
  return args;
}

// Long blocks from D=64 up go to our Hopper kernel whole, where it runs, and
// at D=80 and D=96 shorter ones too; smaller head dims (padded to 64 there),
// short blocks and work lists do not.
TEST(AttentionWholeBlockTest, SendsLongBlocksFromHeadDim64ToTheHopperKernel) {
  SkipWithoutGpu();
  if (IsSkipped()) return;
  if (!HopperAttentionAvailable(128)) {
    EXPECT_FALSE(PrefersHopperWhole(WholeBlockArgs(4096, 1 << 20, 128)));
    GTEST_SKIP() << "the Hopper kernel does not run on this GPU";
  }
  EXPECT_TRUE(PrefersHopperWhole(WholeBlockArgs(4096, 1 << 20, 128)));
  EXPECT_TRUE(PrefersHopperWhole(WholeBlockArgs(16384, 16384, 128)));
  EXPECT_TRUE(PrefersHopperWhole(WholeBlockArgs(300, 16411, 80)));
  EXPECT_TRUE(PrefersHopperWhole(WholeBlockArgs(4099, 4099, 80)));
  EXPECT_TRUE(PrefersHopperWhole(WholeBlockArgs(4096, 4096, 96)));
  EXPECT_FALSE(PrefersHopperWhole(WholeBlockArgs(4095, 4095, 96)));
  EXPECT_FALSE(PrefersHopperWhole(WholeBlockArgs(8192, 8192, 128)));
  EXPECT_FALSE(PrefersHopperWhole(WholeBlockArgs(8192, 8192, 72)));
  EXPECT_TRUE(PrefersHopperWhole(WholeBlockArgs(16384, 16384, 64)));
  EXPECT_FALSE(PrefersHopperWhole(WholeBlockArgs(16384, 16384, 40)));
  EXPECT_FALSE(PrefersHopperWhole(WholeBlockArgs(16384, 16383, 128)));
  DeviceAttentionArgs listed = WholeBlockArgs(16384, 16384, 128);
  static QueryTile tile;
  static KeySpan span;
  listed.work = {&tile, 1, &span, 1};
  EXPECT_FALSE(PrefersHopperWhole(listed));
}

class AttentionFallbackTest : public ::testing::TestWithParam<AttentionCase> {};

TEST_P(AttentionFallbackTest, FallsBackToOurKernelWhereCudnnRefuses) {
  SkipWithoutGpu();
  if (IsSkipped()) return;
  AttentionDispatcher dispatcher;
  const Ran ran = RunAndCheck(dispatcher, GetParam());
  EXPECT_EQ(ran.path, ran.decode_expected ? AttentionPath::kDecode
                                          : AttentionPath::kFlash);
}

INSTANTIATE_TEST_SUITE_P(Unaligned, AttentionFallbackTest,
                         ::testing::ValuesIn(UnalignedAttentionCases()),
                         AttentionCaseName);

}  // namespace
}  // namespace ringattn
