// Our Hopper kernel against the float64 reference on fresh random inputs: the
// standard shapes it takes, longer blocks that run many key steps, and work
// lists that cut the block into uneven query tiles and shuffled key spans
// (whose result must be the whole block's). Needs a Hopper GPU; skips with the
// reason elsewhere.

#include "kernels/cuda/hopper_attention.h"

#include <algorithm>
#include <random>
#include <vector>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "kernels/cuda/attention_test_util.h"
#include "kernels/cuda/device_buffer.h"

namespace ringattn {
namespace {

// The current device's SM count (0 if it cannot be read).
int SmCount() {
  int device = 0;
  int sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) !=
          cudaSuccess) {
    return 0;
  }
  return sms;
}

// Skips the calling test where the device is not a Hopper GPU.
void SkipWithoutHopper() {
  SkipWithoutGpu();
  if (::testing::Test::IsSkipped()) return;
  int device = 0;
  int major = 0;
  int minor = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  ASSERT_EQ(
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device),
      cudaSuccess);
  ASSERT_EQ(
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device),
      cudaSuccess);
  if (major != 9 || minor != 0) {
    GTEST_SKIP() << "the Hopper kernel needs compute capability 9.0; this GPU "
                    "has "
                 << major << "." << minor;
  }
}

AttentionCase Case(const char* name, int64_t batch, int64_t q_len,
                   int64_t kv_len, int64_t q_heads, int64_t kv_heads,
                   int64_t head_dim, bool causal, DeviceDType dtype) {
  AttentionCase c = MakeAttentionCase(name, batch, q_len, kv_len, q_heads,
                                      kv_heads, head_dim, causal);
  c.dtype = dtype;
  return c;
}

// The standard shapes whose head dims the kernel takes, and longer ones.
std::vector<AttentionCase> HopperCases() {
  std::vector<AttentionCase> cases;
  for (const AttentionCase& c : StandardAttentionCases()) {
    if (c.head_dim <= 128) cases.push_back(c);
  }
  const auto add = [&](const char* name, int64_t q_len, int64_t kv_len,
                       int64_t q_heads, int64_t kv_heads, int64_t head_dim,
                       bool causal) {
    for (DeviceDType dtype : {DeviceDType::kBFloat16, DeviceDType::kFloat16}) {
      cases.push_back(Case(name, 1, q_len, kv_len, q_heads, kv_heads, head_dim,
                           causal, dtype));
    }
  };
  add("LongCausalPrimeLength", 2053, 2053, 4, 2, 128, true);
  add("LongDenseManyKeys", 300, 4099, 2, 1, 64, false);
  add("LongCausalMoreKeysHeadDim80", 517, 3001, 4, 4, 80, true);
  add("HeadDim8Dense", 129, 131, 2, 2, 8, false);
  // The kernels compiled for D=80 and 96 (products over 80 or 96 of two
  // blocks' 128 columns): two consumers crossing the diagonal, one consumer
  // of packed heads, and dims padded to 80 and 96.
  add("CausalPrimeLengthHeadDim96", 1031, 2053, 4, 2, 96, true);
  add("PackedGroup4OneConsumerHeadDim96", 13, 3001, 8, 2, 96, true);
  add("DenseHeadDim72", 300, 1999, 2, 2, 72, false);
  add("DenseHeadDim88", 300, 1999, 2, 2, 88, false);
  // One consumer at the kernels compiled for D=80 and 96: dims padded to
  // them (72, 88, packed heads), and a square causal block whose every step
  // crosses the diagonal.
  add("OneConsumerHeadDim72", 5, 1999, 4, 4, 72, false);
  add("OneConsumerPackedHeadDim88", 7, 2053, 8, 2, 88, true);
  add("OneConsumerCausalSquareHeadDim96", 61, 61, 2, 2, 96, true);
  // Heads that share a K/V head packed into one tile: a full tile of 16 rows
  // x 8 heads and a last one of 3 rows whose second warpgroup has none; one
  // row of 32 heads on a single consumer warpgroup.
  add("PackedGroup8Causal", 19, 2053, 8, 1, 128, true);
  add("PackedGroup4DenseManyTiles", 300, 1000, 8, 2, 64, false);
  add("PackedGroup32OneRowHeadDim80", 1, 997, 32, 1, 80, true);
  add("PackedGroup64ThreeRows", 3, 300, 64, 1, 64, true);
  // Groups that are not a power of two, packed whole: tiles whose last rows
  // hold no query row (2 of 128 rows at a group of 7 and two consumers, 4 of
  // 64 at a group of 5 and one), over two tiles, crossing the causal
  // diagonal, at D=80.
  add("GroupOfThreePackedTwoTiles", 70, 513, 6, 2, 128, true);
  add("GroupOfSevenPackedCausal", 18, 2053, 28, 4, 128, true);
  add("GroupOfSevenPackedTwoTilesHeadDim80", 19, 1999, 7, 1, 80, true);
  add("GroupOfFivePackedOneConsumer", 12, 3001, 10, 2, 128, false);
  add("GroupOfFivePackedOneConsumerCausalHeadDim96", 9, 61, 5, 1, 96, true);
  // Groups with too many rows for one tile: tiles of the most heads of the
  // group that fit (32 of 128 heads at 3 rows, 8 of 32 at 16 rows, 4 of 16 at
  // 30 rows; one head of a group of 7 at 40 rows).
  add("Group128PartlyPacked", 3, 300, 128, 1, 64, true);
  add("MqaSixteenRowsPartlyPackedHeadDim80", 16, 2053, 32, 1, 80, true);
  add("GroupOfSixPackedOneRow", 1, 997, 12, 2, 128, false);
  add("Group16ThirtyRowsPartlyPacked", 30, 1031, 32, 2, 96, true);
  add("GroupOfSevenFortyRowsUnpacked", 40, 1031, 7, 1, 128, true);
  // Three consumer warpgroups (head dims up to 64, above 256 rows): 192-row
  // tiles, the last part-filled, crossing the causal diagonal; a dim padded
  // to 64; and the tallest block of packed heads, which keeps two.
  add("WideTilesCausalPrimeLengthHeadDim64", 2053, 2053, 4, 2, 64, true);
  add("WideTilesHeadDim40MoreKeys", 401, 3001, 2, 1, 40, true);
  add("PackedGroup8TwoTilesHeadDim64", 32, 2053, 8, 1, 64, true);
  // Causal query tiles of several head tiles start together, longest first,
  // in runs that cross batches: 3 x 6 head tiles in runs of 8, 8 and 2.
  for (DeviceDType dtype : {DeviceDType::kBFloat16, DeviceDType::kFloat16}) {
    cases.push_back(Case("CausalHeadRunsAcrossBatches", 3, 300, 301, 6, 3, 128,
                         true, dtype));
  }
  // Scores of standard deviation about 45: a row's running maximum keeps
  // rising over its 24 key steps, by less than the kernel's slack on some
  // (P above 1, O left unscaled) and by more on others (O rescaled).
  for (DeviceDType dtype : {DeviceDType::kBFloat16, DeviceDType::kFloat16}) {
    AttentionCase c = Case("SharpScoresGrowingMaximum", 1, 257, 4099, 2, 1, 128,
                           false, dtype);
    c.scale = 4.0f;
    cases.push_back(c);
  }
  return cases;
}

class HopperAttentionTest : public ::testing::TestWithParam<AttentionCase> {};

TEST_P(HopperAttentionTest, MatchesFloat64Reference) {
  SkipWithoutHopper();
  if (IsSkipped()) return;
  const uint32_t seed = std::random_device()();
  absl::StatusOr<AttentionProblem> problem =
      AttentionProblem::Create(GetParam(), seed);
  ASSERT_TRUE(problem.ok()) << problem.status();
  ASSERT_TRUE(HopperAttentionTakes(problem->args()));
  ASSERT_TRUE(problem->PoisonOutputs().ok());
  ASSERT_EQ(LaunchHopperAttention(problem->args(), nullptr), cudaSuccess);
  EXPECT_TRUE(problem->OutputsMatchReference()) << "seed " << seed;
}

INSTANTIATE_TEST_SUITE_P(Shapes, HopperAttentionTest,
                         ::testing::ValuesIn(HopperCases()), AttentionCaseName);

// A work list in device memory.
struct UploadedList {
  DeviceBuffer tiles;
  DeviceBuffer spans;
  DeviceWorkList list;
};

template <typename T>
absl::StatusOr<DeviceBuffer> Upload(const std::vector<T>& host) {
  absl::StatusOr<DeviceBuffer> buffer =
      DeviceBuffer::Allocate(std::max<size_t>(1, host.size()) * sizeof(T));
  if (!buffer.ok()) return buffer.status();
  if (absl::Status s = CudaStatus(
          cudaMemcpy(buffer->as<void>(), host.data(), host.size() * sizeof(T),
                     cudaMemcpyHostToDevice),
          "uploading a work list");
      !s.ok()) {
    return s;
  }
  return buffer;
}

// A list equivalent to the whole block of `c`: query tiles of random sizes up
// to kWorkListTileRows, each attending to the keys cut at random points into
// spans (causal with the block's diagonal if c.causal), in shuffled order.
absl::StatusOr<UploadedList> SplitBlock(const AttentionCase& c,
                                        std::mt19937& rng) {
  std::vector<QueryTile> tiles;
  std::vector<KeySpan> spans;
  const int32_t q_len = static_cast<int32_t>(c.q_len);
  const int32_t kv_len = static_cast<int32_t>(c.kv_len);
  for (int32_t begin = 0; begin < q_len;) {
    const int32_t rows =
        std::uniform_int_distribution<int32_t>(1, kWorkListTileRows)(rng);
    QueryTile tile;
    tile.begin = begin;
    tile.end = std::min(q_len, begin + rows);
    tile.first_span = static_cast<int32_t>(spans.size());
    std::vector<KeySpan> own;
    for (int32_t key = 0; key < kv_len;) {
      const int32_t keys = std::uniform_int_distribution<int32_t>(1, 700)(rng);
      KeySpan span;
      span.begin = key;
      span.end = std::min(kv_len, key + keys);
      span.causal = c.causal ? 1 : 0;
      span.shift = kv_len - q_len;
      own.push_back(span);
      key = span.end;
    }
    std::shuffle(own.begin(), own.end(), rng);
    spans.insert(spans.end(), own.begin(), own.end());
    tile.span_count = static_cast<int32_t>(own.size());
    tiles.push_back(tile);
    begin = tile.end;
  }
  std::shuffle(tiles.begin(), tiles.end(), rng);
  UploadedList uploaded;
  absl::StatusOr<DeviceBuffer> device_tiles = Upload(tiles);
  if (!device_tiles.ok()) return device_tiles.status();
  absl::StatusOr<DeviceBuffer> device_spans = Upload(spans);
  if (!device_spans.ok()) return device_spans.status();
  uploaded.tiles = *std::move(device_tiles);
  uploaded.spans = *std::move(device_spans);
  uploaded.list.tiles = uploaded.tiles.as<const QueryTile>();
  uploaded.list.tile_count = static_cast<int64_t>(tiles.size());
  uploaded.list.spans = uploaded.spans.as<const KeySpan>();
  uploaded.list.span_count = static_cast<int64_t>(spans.size());
  return uploaded;
}

TEST_P(HopperAttentionTest, WorkListCuttingTheBlockMatchesTheWholeBlock) {
  SkipWithoutHopper();
  if (IsSkipped()) return;
  if (GetParam().q_len == 0 || GetParam().batch == 0) return;
  const uint32_t seed = std::random_device()();
  std::mt19937 rng(seed);
  absl::StatusOr<AttentionProblem> problem =
      AttentionProblem::Create(GetParam(), seed);
  ASSERT_TRUE(problem.ok()) << problem.status();
  absl::StatusOr<UploadedList> list = SplitBlock(GetParam(), rng);
  ASSERT_TRUE(list.ok()) << list.status();
  DeviceAttentionArgs args = problem->args();
  args.work = list->list;
  ASSERT_TRUE(problem->PoisonOutputs().ok());
  ASSERT_EQ(LaunchHopperAttention(args, nullptr), cudaSuccess);
  EXPECT_TRUE(problem->OutputsMatchReference()) << "seed " << seed;
}

// Folds the case's two key parts with the kernel into the accumulators
// `start` says and compares with the whole block's reference.
void ExpectFoldedKeyPartsMatchWholeBlock(const AttentionCase& c,
                                         AttentionProblem::Start start) {
  const uint32_t seed = std::random_device()();
  absl::StatusOr<AttentionProblem> problem = AttentionProblem::Create(c, seed);
  ASSERT_TRUE(problem.ok()) << problem.status();
  const absl::Status folded = problem->FoldKeyParts(
      [](const DeviceAttentionArgs& args, const AccumulatorRows& into) {
        if (!HopperAttentionFoldsInto(args, into)) {
          return absl::FailedPreconditionError(
              "HopperAttentionFoldsInto refuses a key part");
        }
        return CudaStatus(LaunchHopperAttentionInto(args, into, nullptr),
                          "LaunchHopperAttentionInto");
      },
      start);
  ASSERT_TRUE(folded.ok()) << folded;
  EXPECT_TRUE(problem->OutputsMatchReference()) << "seed " << seed;
}

// The block's keys in two parts, each folded by the kernel into the same
// accumulators as it stores its rows, give the whole block's result; the
// second fold meets rows the first already filled, the first meets empty ones.
TEST_P(HopperAttentionTest, FoldingKeyPartsIntoAccumulatorsMatchesWholeBlock) {
  SkipWithoutHopper();
  if (IsSkipped()) return;
  ExpectFoldedKeyPartsMatchWholeBlock(GetParam(),
                                      AttentionProblem::Start::kCleared);
}

// The first key part stored into accumulators that hold NaN (never cleared)
// and the second folded in give the whole block's result: the store reads
// nothing of the rows.
TEST_P(HopperAttentionTest,
       StoringFirstKeyPartIntoUnclearedAccumulatorsMatchesWholeBlock) {
  SkipWithoutHopper();
  if (IsSkipped()) return;
  ExpectFoldedKeyPartsMatchWholeBlock(GetParam(),
                                      AttentionProblem::Start::kFresh);
}

TEST(HopperFoldArgsTest, RefusesWorkListsAndOverlappingOrOddAccumulators) {
  SkipWithoutHopper();
  if (IsSkipped()) return;
  absl::StatusOr<AttentionProblem> problem = AttentionProblem::Create(
      Case("Small", 1, 7, 300, 4, 2, 64, false, DeviceDType::kBFloat16), 1);
  ASSERT_TRUE(problem.ok()) << problem.status();
  absl::StatusOr<CaseAccumulators> acc = problem->EmptyAccumulators();
  ASSERT_TRUE(acc.ok()) << acc.status();
  EXPECT_TRUE(HopperAttentionFoldsInto(problem->args(), acc->rows));
  AccumulatorRows overlapping = acc->rows;
  overlapping.o_seq_stride = 64;  // below q_heads * head_dim
  AccumulatorRows odd = acc->rows;
  odd.o = acc->rows.o + 1;  // not float2-aligned
  AccumulatorRows no_lse = acc->rows;
  no_lse.lse = nullptr;
  for (const AccumulatorRows& rows : {overlapping, odd, no_lse}) {
    EXPECT_FALSE(HopperAttentionFoldsInto(problem->args(), rows));
    EXPECT_EQ(LaunchHopperAttentionInto(problem->args(), rows, nullptr),
              cudaErrorInvalidValue);
  }
  DeviceAttentionArgs listed = problem->args();
  listed.work.tile_count = 1;
  EXPECT_FALSE(HopperAttentionFoldsInto(listed, acc->rows));
}

// Few query rows against many keys, the blocks HopperKeySplits splits.
std::vector<AttentionCase> SplitCases() {
  return {
      Case("GroupedCausal", 1, 150, 12007, 4, 2, 128, true,
           DeviceDType::kBFloat16),
      Case("GroupedDense", 1, 150, 12007, 4, 2, 128, false,
           DeviceDType::kFloat16),
      Case("OneRowHeadDim64", 1, 1, 9001, 2, 1, 64, true,
           DeviceDType::kBFloat16),
      Case("Batch2HeadDim80", 2, 131, 5003, 2, 2, 80, true,
           DeviceDType::kFloat16),
      Case("PackedEightRowsHeadDim96", 1, 8, 12007, 8, 2, 96, false,
           DeviceDType::kBFloat16),
      Case("MoreQueriesThanSomeSplitsSee", 1, 300, 4099, 2, 1, 64, true,
           DeviceDType::kBFloat16),
      Case("PackedDecodeStep", 1, 1, 9001, 8, 2, 128, true,
           DeviceDType::kBFloat16),
      Case("PackedSixteenRows", 1, 16, 12007, 32, 8, 128, false,
           DeviceDType::kFloat16),
      Case("MqaSixteenRowsPartlyPacked", 1, 16, 12007, 32, 1, 128, true,
           DeviceDType::kBFloat16),
      Case("GroupOfSevenTenRowsPacked", 1, 10, 12007, 28, 4, 128, true,
           DeviceDType::kBFloat16),
      Case("GroupOfFiveThirteenRowsPackedHeadDim80", 1, 13, 9001, 10, 2, 80,
           false, DeviceDType::kFloat16),
  };
}

class HopperKeySplitTest : public ::testing::TestWithParam<AttentionCase> {};

// Runs `problem` (from `seed`) with its keys in `splits` splits, outputs
// poisoned first, and compares it with the float64 reference.
void ExpectSplitRunMatchesReference(AttentionProblem& problem, int splits,
                                    uint32_t seed) {
  const size_t bytes = HopperSplitWorkspaceBytes(problem.args(), splits);
  absl::StatusOr<DeviceBuffer> workspace = DeviceBuffer::Allocate(bytes);
  ASSERT_TRUE(workspace.ok()) << workspace.status();
  ASSERT_TRUE(problem.PoisonOutputs().ok());
  ASSERT_EQ(LaunchHopperAttentionSplit(problem.args(), splits,
                                       workspace->as<void>(), bytes, nullptr),
            cudaSuccess);
  EXPECT_TRUE(problem.OutputsMatchReference())
      << splits << " splits, seed " << seed;
}

TEST_P(HopperKeySplitTest, SplitKeysMatchFloat64Reference) {
  SkipWithoutHopper();
  if (IsSkipped()) return;
  for (const int splits : {2, 3, 7}) {
    const uint32_t seed = std::random_device()();
    absl::StatusOr<AttentionProblem> problem =
        AttentionProblem::Create(GetParam(), seed);
    ASSERT_TRUE(problem.ok()) << problem.status();
    ExpectSplitRunMatchesReference(*problem, splits, seed);
  }
}

TEST_P(HopperKeySplitTest, SplitsFillTheGpuOnlyWhereTheTilesDoNot) {
  SkipWithoutHopper();
  if (IsSkipped()) return;
  absl::StatusOr<AttentionProblem> problem =
      AttentionProblem::Create(GetParam(), 1);
  ASSERT_TRUE(problem.ok()) << problem.status();
  const int splits = HopperKeySplits(problem->args());
  EXPECT_GE(splits, 1);
  EXPECT_LE(splits, std::max(32, 2 * SmCount()));
  EXPECT_LE(splits, std::max<int64_t>(1, GetParam().kv_len / 4096));
  DeviceAttentionArgs wide = problem->args();
  wide.q_heads = 4096;  // thousands of thread blocks without splitting
  wide.kv_heads = 4096;
  EXPECT_EQ(HopperKeySplits(wide), 1);
}

// One query row of an MQA block is one thread block: its keys split up to one
// thread block per slot (32 splits filled a quarter of an H200 and ran at
// half cuDNN's rate), and the many partial results still fold exactly.
TEST(HopperKeySplitManyTest, OneRowOfOneKvHeadSplitsOverEverySm) {
  SkipWithoutHopper();
  if (IsSkipped()) return;
  const uint32_t seed = std::random_device()();
  absl::StatusOr<AttentionProblem> problem = AttentionProblem::Create(
      Case("MqaOneRow", 1, 1, 600011, 4, 1, 128, true, DeviceDType::kBFloat16),
      seed);
  ASSERT_TRUE(problem.ok()) << problem.status();
  const int splits = HopperKeySplits(problem->args());
  EXPECT_GE(splits, SmCount() * 9 / 10);
  EXPECT_LE(splits, 2 * SmCount());  // two thread blocks an SM at most
  ExpectSplitRunMatchesReference(*problem, splits, seed);
}

TEST(HopperKeySplitArgsTest, RejectsBadSplitsAndShortWorkspaces) {
  SkipWithoutHopper();
  if (IsSkipped()) return;
  absl::StatusOr<AttentionProblem> problem = AttentionProblem::Create(
      Case("Small", 1, 7, 300, 2, 2, 64, false, DeviceDType::kBFloat16), 1);
  ASSERT_TRUE(problem.ok()) << problem.status();
  const size_t bytes = HopperSplitWorkspaceBytes(problem->args(), 2);
  absl::StatusOr<DeviceBuffer> workspace = DeviceBuffer::Allocate(bytes);
  ASSERT_TRUE(workspace.ok());
  EXPECT_EQ(LaunchHopperAttentionSplit(problem->args(), 0,
                                       workspace->as<void>(), bytes, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(LaunchHopperAttentionSplit(problem->args(), 257,
                                       workspace->as<void>(), bytes, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(LaunchHopperAttentionSplit(
                problem->args(), 2, workspace->as<void>(), bytes - 4, nullptr),
            cudaErrorInvalidValue);
}

INSTANTIATE_TEST_SUITE_P(FewRowsManyKeys, HopperKeySplitTest,
                         ::testing::ValuesIn(SplitCases()), AttentionCaseName);

}  // namespace
}  // namespace ringattn
