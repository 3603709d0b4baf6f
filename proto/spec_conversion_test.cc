#include "proto/spec_conversion.h"

#include "gtest/gtest.h"

namespace ringattn {
namespace {

TEST(SpecConversion, RoundTripsEveryField) {
  AttentionSpec spec;
  spec.batch = 2;
  spec.q_len = spec.kv_len = 12;
  spec.q_heads = 8;
  spec.kv_heads = 2;
  spec.head_dim = 80;
  spec.scale = 0.25f;
  spec.causal = true;
  spec.block_sparse = BlockSparseRules{4, 0, 1, 2, 1, 9, {{0, 2}}};
  spec.hilbert = HilbertGrid{3, 4};
  absl::StatusOr<AttentionSpec> back = SpecFromProto(SpecToProto(spec));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(SpecToProto(*back).SerializeAsString(),
            SpecToProto(spec).SerializeAsString());
  EXPECT_EQ(back->block_sparse->local, 0);
  EXPECT_EQ(back->block_sparse->pairs.size(), 1u);

  spec.block_sparse.reset();
  spec.dilated = {{4, 2}, {12, 3}};
  spec.combine = DilatedCombine::kHeadGroups;
  back = SpecFromProto(SpecToProto(spec));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->combine, DilatedCombine::kHeadGroups);
  EXPECT_EQ(back->dilated[1].dilation, 3);
}

TEST(SpecConversion, UnsetLocalBlocksTurnsTheRuleOff) {
  v1::AttentionSpec proto;
  proto.set_batch(1);
  proto.set_q_len(8);
  proto.set_kv_len(8);
  proto.set_q_heads(1);
  proto.set_kv_heads(1);
  proto.set_head_dim(4);
  proto.mutable_block_sparse()->set_block_size(2);
  proto.mutable_block_sparse()->set_global_blocks(1);
  absl::StatusOr<AttentionSpec> spec = SpecFromProto(proto);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_LT(spec->block_sparse->local, 0);
}

TEST(SpecConversion, RejectsInvalidSpecWithFieldName) {
  v1::AttentionSpec proto;
  proto.set_batch(1);
  proto.set_q_len(8);
  proto.set_kv_len(8);
  proto.set_q_heads(3);
  proto.set_kv_heads(2);
  proto.set_head_dim(4);
  absl::StatusOr<AttentionSpec> spec = SpecFromProto(proto);
  ASSERT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(spec.status().message().find("q_heads"), std::string::npos);
}

TEST(SpecConversion, RejectsUnknownDType) {
  EXPECT_EQ(DTypeFromProto(v1::DTYPE_UNSPECIFIED).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<DType> odd = DTypeFromProto(static_cast<v1::DType>(42));
  ASSERT_FALSE(odd.ok());
  EXPECT_NE(odd.status().message().find("42"), std::string::npos);
  EXPECT_EQ(*DTypeFromProto(v1::BF16), DType::kBFloat16);
}

}  // namespace
}  // namespace ringattn
