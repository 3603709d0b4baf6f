#include "client/cli_request.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace ringattn {
namespace {

absl::StatusOr<v1::AttentionSpec> SpecFrom(
    const std::vector<std::string>& args) {
  absl::StatusOr<Flags> flags =
      Flags::Parse(args, SpecFlagNames(), SpecSwitchNames());
  if (!flags.ok()) return flags.status();
  v1::AttentionSpec spec;
  absl::Status status = ApplySpecFlags(*flags, &spec);
  if (!status.ok()) return status;
  return spec;
}

TEST(AttentionShapeTest, TakesRank3AsBatch1) {
  EXPECT_EQ(*AttentionShape({{5, 4, 8}, {}}, "q.npy"), (Shape{1, 5, 4, 8}));
  EXPECT_EQ(*AttentionShape({{2, 5, 4, 8}, {}}, "q.npy"), (Shape{2, 5, 4, 8}));
  const absl::Status status = AttentionShape({{5, 4}, {}}, "q.npy").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "q.npy: expected an array [N, H, D] or [B, N, H, D], got shape "
            "(5, 4)");
}

TEST(LseFileShapeTest, PutsHeadsBeforeTokens) {
  EXPECT_EQ(LseFileShape({5, 4, 8}), (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(LseFileShape({2, 5, 4, 8}), (std::vector<int64_t>{2, 4, 5}));
}

TEST(ParseTest, DilatedHilbertAndWireDtype) {
  absl::StatusOr<std::vector<v1::DilatedBranch>> branches =
      ParseDilated("2048:1,4096:2");
  ASSERT_TRUE(branches.ok());
  ASSERT_EQ(branches->size(), 2u);
  EXPECT_EQ((*branches)[1].segment_length(), 4096);
  EXPECT_EQ((*branches)[1].dilation(), 2);
  for (const char* bad : {"", "8", "8:0", "8:2,", "a:b", "8:2:1", "-8:2"}) {
    EXPECT_EQ(ParseDilated(bad).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
  }
  EXPECT_EQ(ParseHilbert("3x5")->height(), 3);
  EXPECT_EQ(ParseHilbert("3x5")->width(), 5);
  for (const char* bad : {"3", "3x", "x5", "3x5x1", "0x5", "3*5"}) {
    EXPECT_EQ(ParseHilbert(bad).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
  }
  EXPECT_EQ(*ParseWireDType("bf16"), v1::BF16);
  EXPECT_EQ(ParseWireDType("fp64").status().message(),
            "flag --wire_dtype takes fp32|fp16|bf16, got 'fp64'");
}

TEST(ApplySpecFlagsTest, SetsEveryOption) {
  absl::StatusOr<v1::AttentionSpec> spec = SpecFrom(
      {"--causal",    "--scale",         "0.125",     "--wire_dtype",
       "fp16",        "--dilated",       "16:1,32:4", "--dilated_combine",
       "head_groups", "--block_size",    "64",        "--local_blocks",
       "0",           "--global_blocks", "1",         "--dilated_blocks",
       "3",           "--random_blocks", "2",         "--seed",
       "7",           "--hilbert",       "4x8",       "--strategy",
       "pass_q",      "--merge",         "workers"});
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->causal());
  EXPECT_TRUE(spec->has_scale());
  EXPECT_FLOAT_EQ(spec->scale(), 0.125f);
  EXPECT_EQ(spec->wire_dtype(), v1::FP16);
  ASSERT_EQ(spec->dilated_size(), 2);
  EXPECT_EQ(spec->dilated(1).dilation(), 4);
  EXPECT_EQ(spec->dilated_combine(), v1::COMBINE_HEAD_GROUPS);
  const v1::BlockSparse& sparse = spec->block_sparse();
  EXPECT_EQ(sparse.block_size(), 64);
  EXPECT_TRUE(sparse.has_local_blocks());
  EXPECT_EQ(sparse.local_blocks(), 0);
  EXPECT_EQ(sparse.global_blocks(), 1);
  EXPECT_EQ(sparse.dilated_blocks(), 3);
  EXPECT_EQ(sparse.random_blocks(), 2);
  EXPECT_EQ(sparse.seed(), 7u);
  EXPECT_EQ(spec->hilbert().width(), 8);
  EXPECT_EQ(spec->strategy(), v1::PASS_Q);
  EXPECT_EQ(spec->partial_merge(), v1::MERGE_ON_WORKERS);
}

TEST(ApplySpecFlagsTest, LeavesDefaultsAlone) {
  absl::StatusOr<v1::AttentionSpec> spec = SpecFrom({});
  ASSERT_TRUE(spec.ok());
  EXPECT_FALSE(spec->causal());
  EXPECT_FALSE(spec->has_scale());
  EXPECT_FALSE(spec->has_block_sparse());
  EXPECT_FALSE(spec->has_hilbert());
  EXPECT_EQ(spec->wire_dtype(), v1::DTYPE_UNSPECIFIED);
  EXPECT_FALSE(
      SpecFrom({"--block_size", "8"})->block_sparse().has_local_blocks());
}

TEST(ApplySpecFlagsTest, RejectsBadCombinations) {
  const auto message = [](const std::vector<std::string>& args) {
    return std::string(SpecFrom(args).status().message());
  };
  EXPECT_EQ(message({"--local_blocks", "1"}),
            "flag --local_blocks needs --block_size");
  EXPECT_EQ(message({"--block_size", "8", "--seed", "1"}),
            "flag --seed needs --random_blocks");
  EXPECT_EQ(message({"--block_size", "0"}),
            "flag --block_size must be >= 1, got 0");
  EXPECT_EQ(message({"--block_size", "8", "--global_blocks", "-1"}),
            "flag --global_blocks must be >= 0, got -1");
  EXPECT_EQ(message({"--dilated_combine", "max"}),
            "flag --dilated_combine takes lse|head_groups, got 'max'");
  EXPECT_EQ(message({"--scale", "big"}),
            "flag --scale takes a number, got 'big'");
}

}  // namespace
}  // namespace ringattn
