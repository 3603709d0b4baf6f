#include "core/attention_spec.h"

#include <limits>
#include <string>

#include "gtest/gtest.h"

namespace ringattn {
namespace {

AttentionSpec Valid() {
  AttentionSpec spec;
  spec.batch = 2;
  spec.q_len = spec.kv_len = 100;
  spec.q_heads = 8;
  spec.kv_heads = 2;
  spec.head_dim = 64;
  return spec;
}

// Validate() fails with INVALID_ARGUMENT and a message containing each of
// `words`.
void ExpectRejected(const AttentionSpec& spec,
                    std::initializer_list<std::string> words) {
  const absl::Status status = spec.Validate();
  ASSERT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  for (const std::string& word : words) {
    EXPECT_NE(status.message().find(word), std::string::npos)
        << "'" << word << "' missing from: " << status.message();
  }
}

TEST(AttentionSpec, AcceptsWellFormedSpecs) {
  EXPECT_TRUE(Valid().Validate().ok());
  AttentionSpec spec = Valid();
  spec.causal = true;
  spec.q_len = 7;  // causal continuation of a longer context
  EXPECT_TRUE(spec.Validate().ok());
  spec = Valid();
  spec.dilated = {{10, 2}, {33, 3}};
  spec.hilbert = HilbertGrid{10, 10};
  EXPECT_TRUE(spec.Validate().ok()) << spec.Validate();
}

TEST(AttentionSpec, DefaultScaleIsInverseSqrtHeadDim) {
  EXPECT_FLOAT_EQ(Valid().EffectiveScale(), 0.125f);
  AttentionSpec spec = Valid();
  spec.scale = 0.5f;
  EXPECT_FLOAT_EQ(spec.EffectiveScale(), 0.5f);
}

TEST(AttentionSpec, RejectsZeroBatch) {
  AttentionSpec spec = Valid();
  spec.batch = 0;
  ExpectRejected(spec, {"'batch'", ">= 1", "got 0"});
}

TEST(AttentionSpec, RejectsEmptySequences) {
  AttentionSpec spec = Valid();
  spec.q_len = 0;
  ExpectRejected(spec, {"'q_len'", "got 0"});
  spec = Valid();
  spec.kv_len = -3;
  ExpectRejected(spec, {"'kv_len'", "got -3"});
}

TEST(AttentionSpec, RejectsQueryHeadsNotMultipleOfKvHeads) {
  AttentionSpec spec = Valid();
  spec.kv_heads = 3;
  ExpectRejected(spec, {"'q_heads'", "multiple of kv_heads (3)", "got 8"});
  spec.kv_heads = 0;
  ExpectRejected(spec, {"'kv_heads'"});
}

TEST(AttentionSpec, RejectsHeadDimOutOfRange) {
  AttentionSpec spec = Valid();
  spec.head_dim = 257;
  ExpectRejected(spec, {"'head_dim'", "[1, 256]", "got 257"});
  spec.head_dim = 0;
  ExpectRejected(spec, {"'head_dim'", "got 0"});
}

TEST(AttentionSpec, RejectsNonPositiveOrNanScale) {
  AttentionSpec spec = Valid();
  spec.scale = -1.0f;
  ExpectRejected(spec, {"'scale'", "got -1"});
  spec.scale = std::nanf("");
  ExpectRejected(spec, {"'scale'", "nan"});
}

TEST(AttentionSpec, RejectsPatternsWithUnequalLengths) {
  AttentionSpec spec = Valid();
  spec.q_len = 50;
  spec.dilated = {{10, 1}};
  ExpectRejected(spec, {"'q_len'", "kv_len (100)", "got 50"});
}

TEST(AttentionSpec, RejectsDilatedTogetherWithBlockSparse) {
  AttentionSpec spec = Valid();
  spec.dilated = {{10, 1}};
  spec.block_sparse = BlockSparseRules{.block_size = 10, .local = 1};
  ExpectRejected(spec, {"'block_sparse'", "dilated"});
}

TEST(AttentionSpec, RejectsZeroSegmentLength) {
  AttentionSpec spec = Valid();
  spec.dilated = {{10, 1}, {0, 1}};
  ExpectRejected(spec, {"'dilated[1].segment_length'", "got 0"});
}

TEST(AttentionSpec, RejectsZeroDilation) {
  AttentionSpec spec = Valid();
  spec.dilated = {{10, 0}};
  ExpectRejected(spec, {"'dilated[0].dilation'", "got 0"});
}

TEST(AttentionSpec, RejectsDilationLongerThanSegment) {
  AttentionSpec spec = Valid();
  spec.dilated = {{4, 8}};
  ExpectRejected(spec,
                 {"'dilated[0].dilation'", "segment_length (4)", "got 8"});
}

TEST(AttentionSpec, RejectsMoreHeadGroupsThanHeads) {
  AttentionSpec spec = Valid();
  spec.q_heads = spec.kv_heads = 2;
  spec.dilated = {{4, 1}, {8, 2}, {16, 4}};
  spec.combine = DilatedCombine::kHeadGroups;
  ExpectRejected(spec, {"'dilated'", "HEAD_GROUPS", "3 branches"});
}

TEST(AttentionSpec, RejectsZeroBlockSize) {
  AttentionSpec spec = Valid();
  spec.block_sparse = BlockSparseRules{.block_size = 0, .local = 1};
  ExpectRejected(spec, {"'block_sparse.block_size'", "got 0"});
}

TEST(AttentionSpec, RejectsBlockSparseWithNoRule) {
  AttentionSpec spec = Valid();
  spec.block_sparse = BlockSparseRules{.block_size = 16};
  ExpectRejected(spec, {"'block_sparse'", "at least one rule"});
}

TEST(AttentionSpec, RejectsNegativeBlockRuleCounts) {
  AttentionSpec spec = Valid();
  spec.block_sparse =
      BlockSparseRules{.block_size = 16, .local = 1, .global = -1};
  ExpectRejected(spec, {"'block_sparse.global'", "got -1"});
  spec.block_sparse =
      BlockSparseRules{.block_size = 16, .local = 1, .dilated = -2};
  ExpectRejected(spec, {"'block_sparse.dilated'", "got -2"});
  spec.block_sparse =
      BlockSparseRules{.block_size = 16, .local = 1, .random = -1};
  ExpectRejected(spec, {"'block_sparse.random'", "got -1"});
}

TEST(AttentionSpec, RejectsBlockPairOutsideSequence) {
  AttentionSpec spec = Valid();
  BlockSparseRules rules;
  rules.block_size = 16;  // 100 positions: blocks 0..6
  rules.pairs = {{0, 0}, {7, 1}};
  spec.block_sparse = rules;
  ExpectRejected(spec, {"'block_sparse.pairs[1]'", "[0, 7)", "(7, 1)"});
}

// Found by fuzz/request_stream_fuzzer: a batch of 3.5e17 passed validation,
// and the coordinator's byte count of the request (batch x q_len x q_heads x
// head_dim x 2) overflowed int64.
TEST(AttentionSpec, RejectsTensorsTooLargeToCountInBytes) {
  AttentionSpec spec = Valid();
  spec.batch = 351270050394504101;
  spec.q_len = spec.kv_len = 9;
  spec.q_heads = spec.kv_heads = 1;
  spec.head_dim = 4;
  ExpectRejected(spec, {"'q_len'", "351270050394504101 x 9 x 1 x 4"});
  spec = Valid();
  spec.kv_len = int64_t{1} << 62;
  ExpectRejected(spec, {"'kv_len'", "K and V"});
  spec = Valid();
  spec.batch = 1;
  spec.q_len = kMaxTensorElements / (8 * 64);
  EXPECT_TRUE(spec.Validate().ok()) << spec.Validate();
  ++spec.q_len;
  ExpectRejected(spec, {"'q_len'", "72057594037927936 elements"});
}

// Found by fuzz/request_stream_fuzzer: a block size of INT64_MAX overflowed
// the count of blocks, which came out -1.
TEST(AttentionSpec, BlockSizeLongerThanTheSequenceIsOneBlock) {
  AttentionSpec spec = Valid();
  spec.block_sparse = BlockSparseRules{};
  spec.block_sparse->block_size = std::numeric_limits<int64_t>::max();
  spec.block_sparse->pairs = {{0, 0}};
  EXPECT_TRUE(spec.Validate().ok()) << spec.Validate();
  spec.block_sparse->pairs = {{0, 1}};
  ExpectRejected(spec, {"'block_sparse.pairs[0]'", "[0, 1)"});
}

TEST(AttentionSpec, RejectsHilbertGridOfWrongArea) {
  AttentionSpec spec = Valid();
  spec.hilbert = HilbertGrid{9, 11};
  ExpectRejected(spec, {"'hilbert'", "(100)", "9 x 11"});
  spec.hilbert = HilbertGrid{0, 100};
  ExpectRejected(spec, {"'hilbert.height'", "got 0"});
}

// Found by fuzz/request_stream_fuzzer: height x width overflowed, and a grid
// of 2^64 + 100 tokens wrapped around to the 100 of the sequence.
TEST(AttentionSpec, RejectsHilbertGridWhoseAreaOverflows) {
  AttentionSpec spec = Valid();
  spec.hilbert = HilbertGrid{(int64_t{1} << 62) + 25, 4};
  ExpectRejected(spec, {"'hilbert'", "4611686018427387929 x 4"});
  spec.hilbert = HilbertGrid{3, std::numeric_limits<int64_t>::max()};
  ExpectRejected(spec, {"'hilbert'"});
}

}  // namespace
}  // namespace ringattn
