// Our attention kernel against the float64 reference on fresh random inputs,
// over every standard shape and the unaligned ones only it takes, and in work
// list mode over random and hand-written lists. Needs a CUDA device; skips
// with the reason where there is none (the argument checks run anywhere).

#include "kernels/cuda/flash_attention.h"

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/attention_dispatch.h"
#include "kernels/cuda/attention_test_util.h"
#include "kernels/cuda/hopper_attention.h"

namespace ringattn {
namespace {

// Our mma.sync kernel on `problem` (made from `seed`), its outputs poisoned
// first, against the float64 reference.
void ExpectFlashRunMatchesReference(AttentionProblem& problem, uint32_t seed) {
  ASSERT_TRUE(problem.PoisonOutputs().ok());
  ASSERT_TRUE(RunFlashAttention(problem.args(), nullptr).ok());
  EXPECT_TRUE(problem.OutputsMatchReference()) << "seed " << seed;
}

// The same on our Hopper kernel.
void ExpectHopperRunMatchesReference(AttentionProblem& problem, uint32_t seed) {
  ASSERT_TRUE(problem.PoisonOutputs().ok());
  ASSERT_EQ(LaunchHopperAttention(problem.args(), nullptr), cudaSuccess)
      << "seed " << seed;
  EXPECT_TRUE(problem.OutputsMatchReference()) << "seed " << seed;
}

class FlashAttentionTest : public ::testing::TestWithParam<AttentionCase> {};

TEST_P(FlashAttentionTest, MatchesFloat64Reference) {
  SkipWithoutGpu();
  if (IsSkipped()) return;
  const uint32_t seed = std::random_device()();
  absl::StatusOr<AttentionProblem> problem =
      AttentionProblem::Create(GetParam(), seed);
  ASSERT_TRUE(problem.ok()) << problem.status();
  ExpectFlashRunMatchesReference(*problem, seed);
}

INSTANTIATE_TEST_SUITE_P(Standard, FlashAttentionTest,
                         ::testing::ValuesIn(StandardAttentionCases()),
                         AttentionCaseName);
INSTANTIATE_TEST_SUITE_P(Unaligned, FlashAttentionTest,
                         ::testing::ValuesIn(UnalignedAttentionCases()),
                         AttentionCaseName);

// A random work list over q_len x kv_len: tiles of 1 to kWorkListTileRows
// rows with gaps of rows in no tile between them, each with 0 to 4 disjoint
// spans in random order, causal or not with shifts from far below to far
// above the diagonal.
HostAttentionWorkList RandomWorkList(int64_t q_len, int64_t kv_len,
                                     std::mt19937& rng) {
  auto uniform = [&rng](int64_t lo, int64_t hi) {  // [lo, hi]
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  HostAttentionWorkList list;
  int64_t row = uniform(0, 3);
  while (row < q_len) {
    QueryTile tile;
    tile.begin = static_cast<int32_t>(row);
    tile.end = static_cast<int32_t>(
        std::min(q_len, row + uniform(1, kWorkListTileRows)));
    tile.first_span = static_cast<int32_t>(list.spans.size());
    std::vector<int64_t> cuts;
    for (int64_t n = uniform(0, 4) * 2; n > 0; --n) {
      cuts.push_back(uniform(0, kv_len));
    }
    std::sort(cuts.begin(), cuts.end());
    for (size_t c = 0; c + 1 < cuts.size(); c += 2) {
      if (cuts[c] == cuts[c + 1]) continue;
      KeySpan span;
      span.begin = static_cast<int32_t>(cuts[c]);
      span.end = static_cast<int32_t>(cuts[c + 1]);
      span.causal = uniform(0, 1) == 1;
      span.shift = static_cast<int32_t>(uniform(-q_len, kv_len));
      list.spans.push_back(span);
    }
    tile.span_count = static_cast<int32_t>(list.spans.size()) - tile.first_span;
    std::shuffle(list.spans.begin() + tile.first_span, list.spans.end(), rng);
    list.tiles.push_back(tile);
    row = tile.end + uniform(0, 1) * uniform(1, 20);
  }
  return list;
}

// Fixed tiles over the first rows of a q_len x kv_len block: a full tile with
// a dense span and a causal one past a gap, a short tile under a causal span
// ahead of the diagonal, a tile with no span, rows in no tile, and a tile
// whose causal span hides all keys from its first rows.
HostAttentionWorkList HandWrittenWorkList(int32_t q_len, int32_t kv_len) {
  HostAttentionWorkList list;
  auto row = [q_len](int32_t r) { return std::min(r, q_len); };
  auto key = [kv_len](int32_t k) { return std::min(k, kv_len); };
  list.spans = {
      {0, key(17), 0, 0},       {key(40), key(300), 1, -20},
      {key(3), kv_len, 1, 100}, {0, key(9), 1, -30},
      {key(50), key(61), 0, 0},
  };
  list.tiles = {
      {0, row(128), 0, 2},
      {row(128), row(160), 2, 1},
      {row(160), row(170), 3, 0},
      {row(190), row(300), 3, 2},
  };
  return list;
}

class FlashWorkListTest : public ::testing::TestWithParam<AttentionCase> {};

TEST_P(FlashWorkListTest, RandomListsMatchFloat64ReferenceAndSpareOtherRows) {
  SkipWithoutGpu();
  if (IsSkipped()) return;
  for (int draw = 0; draw < 3; ++draw) {
    const uint32_t seed = std::random_device()();
    std::mt19937 rng(seed);
    const HostAttentionWorkList list =
        RandomWorkList(GetParam().q_len, GetParam().kv_len, rng);
    absl::StatusOr<AttentionProblem> problem =
        AttentionProblem::CreateWithWorkList(GetParam(), seed, list);
    ASSERT_TRUE(problem.ok()) << problem.status();
    ASSERT_TRUE(problem->PoisonOutputs().ok());
    ASSERT_TRUE(RunFlashAttention(problem->args(), nullptr).ok());
    EXPECT_TRUE(problem->OutputsMatchReference())
        << "seed " << seed << ", " << list.tiles.size() << " tiles, "
        << list.spans.size() << " spans";
  }
}

TEST_P(FlashWorkListTest, GapsShiftsAndEmptyTilesMatchFloat64Reference) {
  SkipWithoutGpu();
  if (IsSkipped()) return;
  const uint32_t seed = std::random_device()();
  const HostAttentionWorkList list =
      HandWrittenWorkList(static_cast<int32_t>(GetParam().q_len),
                          static_cast<int32_t>(GetParam().kv_len));
  absl::StatusOr<AttentionProblem> problem =
      AttentionProblem::CreateWithWorkList(GetParam(), seed, list);
  ASSERT_TRUE(problem.ok()) << problem.status();
  ExpectFlashRunMatchesReference(*problem, seed);
}

TEST_P(FlashWorkListTest, DispatcherSendsListsToOurKernel) {
  SkipWithoutGpu();
  if (IsSkipped()) return;
  const uint32_t seed = std::random_device()();
  std::mt19937 rng(seed);
  const HostAttentionWorkList list =
      RandomWorkList(GetParam().q_len, GetParam().kv_len, rng);
  absl::StatusOr<AttentionProblem> problem =
      AttentionProblem::CreateWithWorkList(GetParam(), seed, list);
  ASSERT_TRUE(problem.ok()) << problem.status();
  ASSERT_TRUE(problem->PoisonOutputs().ok());
  AttentionDispatcher dispatcher;
  absl::StatusOr<AttentionPath> path =
      dispatcher.Forward(problem->args(), nullptr);
  ASSERT_TRUE(path.ok()) << path.status() << ", seed " << seed;
  EXPECT_EQ(*path, HopperAttentionTakes(problem->args())
                       ? AttentionPath::kHopper
                       : AttentionPath::kFlash);
  EXPECT_TRUE(problem->OutputsMatchReference()) << "seed " << seed;
}

// The same lists on the Hopper kernel, where the GPU and the shape allow it.
TEST_P(FlashWorkListTest,
       HopperKernelMatchesReferenceOnRandomAndHandWrittenLists) {
  SkipWithoutGpu();
  if (IsSkipped()) return;
  const uint32_t seed = std::random_device()();
  std::mt19937 rng(seed);
  for (const HostAttentionWorkList& list :
       {RandomWorkList(GetParam().q_len, GetParam().kv_len, rng),
        HandWrittenWorkList(static_cast<int32_t>(GetParam().q_len),
                            static_cast<int32_t>(GetParam().kv_len))}) {
    absl::StatusOr<AttentionProblem> problem =
        AttentionProblem::CreateWithWorkList(GetParam(), seed, list);
    ASSERT_TRUE(problem.ok()) << problem.status();
    if (!HopperAttentionTakes(problem->args())) {
      GTEST_SKIP() << "the Hopper kernel does not take this GPU or shape "
                      "(it needs compute capability 9.0, head_dim a multiple "
                      "of 8 up to 128 and 16-byte rows)";
    }
    ExpectHopperRunMatchesReference(*problem, seed);
  }
}

// A list whose tiles carry no span at all (no spans to point to): every row
// of them sees no key, on both kernels. The Hopper kernel refused such a list
// as if its spans were missing (RandomWorkList makes one now and then).
TEST_P(FlashWorkListTest, TilesWithoutAnySpanMatchReferenceOnBothKernels) {
  SkipWithoutGpu();
  if (IsSkipped()) return;
  const uint32_t seed = std::random_device()();
  HostAttentionWorkList list;
  QueryTile tile;
  tile.begin = 0;
  tile.end = static_cast<int32_t>(
      std::min<int64_t>(GetParam().q_len, kWorkListTileRows));
  list.tiles.push_back(tile);
  absl::StatusOr<AttentionProblem> problem =
      AttentionProblem::CreateWithWorkList(GetParam(), seed, list);
  ASSERT_TRUE(problem.ok()) << problem.status();
  ExpectFlashRunMatchesReference(*problem, seed);
  if (HopperAttentionTakes(problem->args())) {
    ExpectHopperRunMatchesReference(*problem, seed);
  }
}

AttentionCase ListCase(std::string name, int64_t batch, int64_t q_len,
                       int64_t kv_len, int64_t q_heads, int64_t kv_heads,
                       int64_t head_dim, DeviceDType dtype,
                       int64_t row_padding = 0) {
  AttentionCase c = MakeAttentionCase(std::move(name), batch, q_len, kv_len,
                                      q_heads, kv_heads, head_dim, false);
  c.dtype = dtype;
  c.row_padding = row_padding;
  return c;
}

constexpr DeviceDType kBf16 = DeviceDType::kBFloat16;
constexpr DeviceDType kFp16 = DeviceDType::kFloat16;

INSTANTIATE_TEST_SUITE_P(
    WorkList, FlashWorkListTest,
    ::testing::Values(
        ListCase("GroupedD64Primes", 2, 257, 389, 4, 2, 64, kBf16),
        ListCase("D64Fp16", 1, 263, 131, 2, 2, 64, kFp16),
        ListCase("D80FewerRowsThanTile", 1, 97, 61, 2, 1, 80, kFp16),
        ListCase("GroupedD128", 2, 509, 1021, 8, 2, 128, kBf16),
        ListCase("D128Fp16MultiQuery", 1, 331, 257, 4, 1, 128, kFp16),
        ListCase("D256TwoPassesPerTile", 1, 263, 331, 2, 2, 256, kBf16),
        ListCase("D256Fp16", 1, 131, 389, 2, 1, 256, kFp16),
        ListCase("StridedD128", 2, 257, 263, 4, 2, 128, kBf16, 24),
        ListCase("UnalignedD36", 1, 131, 127, 2, 1, 36, kFp16, 3)),
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

TEST(FlashAttentionArgsTest, RejectsWorkListsWithoutMemoryOrPastLimits) {
  DeviceAttentionArgs no_tiles = WellFormedArgs();
  no_tiles.work.tile_count = 3;
  DeviceAttentionArgs no_spans = WellFormedArgs();
  static const QueryTile tile;
  no_spans.work.tiles = &tile;
  no_spans.work.tile_count = 1;
  no_spans.work.span_count = 2;
  DeviceAttentionArgs negative = WellFormedArgs();
  negative.work.span_count = -1;
  for (const DeviceAttentionArgs& bad : {no_tiles, no_spans, negative}) {
    EXPECT_NE(FindAttentionArgsProblem(bad), nullptr);
    EXPECT_EQ(LaunchFlashAttention(bad, nullptr), cudaErrorInvalidValue);
    EXPECT_TRUE(absl::IsInvalidArgument(RunFlashAttention(bad, nullptr)));
  }
  DeviceAttentionArgs too_many = WellFormedArgs();
  too_many.work.tiles = &tile;
  too_many.work.tile_count = kMaxWorkListTiles + 1;
  EXPECT_EQ(FindAttentionArgsProblem(too_many), nullptr);
  EXPECT_EQ(LaunchFlashAttention(too_many, nullptr), cudaErrorInvalidValue);
  EXPECT_TRUE(absl::IsInvalidArgument(RunFlashAttention(too_many, nullptr)));
}

TEST(FlashAttentionArgsTest, ListsNeverGoToTheDecodeKernel) {
  DeviceAttentionArgs args = WellFormedArgs();
  args.q_len = 1;
  args.kv_len = 4096;
  ASSERT_TRUE(PrefersDecode(args));
  static const QueryTile tile;
  args.work.tiles = &tile;
  args.work.tile_count = 1;
  EXPECT_FALSE(PrefersDecode(args));
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
