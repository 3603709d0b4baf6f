#include "kernels/cpu/reference_attention.h"

#include <cmath>
#include <random>

#include "gtest/gtest.h"

namespace ringattn {
namespace {

AttentionSpec Tiny(int64_t n, int64_t heads, int64_t dim) {
  AttentionSpec spec;
  spec.q_len = spec.kv_len = n;
  spec.q_heads = spec.kv_heads = heads;
  spec.head_dim = dim;
  spec.scale = 1.0f;
  return spec;
}

// DilatedAttention of dilated-attention-pytorch, written out by hand for N=4,
// two heads, D=1, branches (w=2, r=1) and (w=4, r=2): head 0 (group 0) attends
// inside segments {0,1} and {2,3}; head 1 (group 1) keeps offset 1 % 2 = 1,
// i.e. positions 1 and 3 of the one segment; the result is divided by G = 2.
TEST(ReferenceAttention, HeadGroupsMatchesHandComputedCase) {
  AttentionSpec spec = Tiny(4, 2, 1);
  spec.dilated = {{2, 1}, {4, 2}};
  spec.combine = DilatedCombine::kHeadGroups;
  ASSERT_TRUE(spec.Validate().ok());
  // [position][head]
  const float q[4][2] = {{1, 0}, {1, 0}, {0, 0}, {0, 0}};
  const float k[4][2] = {{0, 0}, {std::log(3.0f), 0}, {0, 0}, {0, 0}};
  const float v[4][2] = {{1, 2}, {3, 4}, {5, 6}, {7, 8}};
  Tensor<double> o({1, 4, 2, 1}), lse({1, 4, 2, 1});
  ReferenceAttention(spec, View<const float>(&q[0][0], {1, 4, 2, 1}),
                     View<const float>(&k[0][0], {1, 4, 2, 1}),
                     View<const float>(&v[0][0], {1, 4, 2, 1}), o.view(),
                     lse.view());
  // Head 0: rows 0, 1 weigh v0, v1 by 1:3 -> 2.5; rows 2, 3 average 5, 7 -> 6;
  // / 2.
  EXPECT_NEAR(o.view().At(0, 0, 0, 0), 1.25, 1e-6);
  EXPECT_NEAR(o.view().At(0, 1, 0, 0), 1.25, 1e-6);
  EXPECT_NEAR(o.view().At(0, 2, 0, 0), 3.0, 1e-12);
  EXPECT_NEAR(o.view().At(0, 3, 0, 0), 3.0, 1e-12);
  EXPECT_NEAR(lse.view().At(0, 0, 0, 0), std::log(4.0), 1e-6);
  // Head 1: positions 1 and 3 average 4 and 8 -> 6, / 2; positions 0, 2 are not
  // kept.
  EXPECT_EQ(o.view().At(0, 0, 1, 0), 0.0);
  EXPECT_NEAR(o.view().At(0, 1, 1, 0), 3.0, 1e-12);
  EXPECT_EQ(o.view().At(0, 2, 1, 0), 0.0);
  EXPECT_NEAR(o.view().At(0, 3, 1, 0), 3.0, 1e-12);
  EXPECT_EQ(lse.view().At(0, 0, 1, 0), -INFINITY);
  EXPECT_NEAR(lse.view().At(0, 1, 1, 0), std::log(2.0), 1e-12);
}

// Under the LSE combine, two branches weigh their outputs by their softmax
// denominators: with every score 0, a row that branch A gives 2 keys (mean a)
// and branch B gives 3 keys (mean b) returns (2a + 3b) / 5 and LSE log 5.
TEST(ReferenceAttention, LseCombineWeighsBranchesByDenominators) {
  AttentionSpec spec = Tiny(3, 1, 1);
  spec.dilated = {{2, 1}, {3, 1}};
  const float q[3] = {0, 0, 0};
  const float v[3] = {1, 2, 4};
  Tensor<double> o({1, 3, 1, 1}), lse({1, 3, 1, 1});
  ReferenceAttention(spec, View<const float>(q, {1, 3, 1, 1}),
                     View<const float>(q, {1, 3, 1, 1}),
                     View<const float>(v, {1, 3, 1, 1}), o.view(), lse.view());
  // Row 0: branch A sees {0, 1} (mean 1.5), branch B sees {0, 1, 2} (mean 7/3).
  EXPECT_NEAR(o.view().At(0, 0, 0, 0), (2 * 1.5 + 3 * 7.0 / 3) / 5, 1e-12);
  EXPECT_NEAR(lse.view().At(0, 0, 0, 0), std::log(5.0), 1e-12);
  // Row 2: branch A's last segment is {2} alone.
  EXPECT_NEAR(o.view().At(0, 2, 0, 0), (1 * 4 + 3 * 7.0 / 3) / 4, 1e-12);
}

TEST(ReferenceAttention, CausalRowThatSeesNoKeyIsZeroWithNegativeInfinityLse) {
  AttentionSpec spec = Tiny(2, 1, 2);
  spec.kv_len = 1;
  spec.q_len = 2;  // query 0 sits before the only key
  spec.causal = true;
  const float q[4] = {1, 2, 3, 4};
  const float kv[2] = {5, 6};
  Tensor<double> o({1, 2, 1, 2}), lse({1, 2, 1, 1});
  ReferenceAttention(spec, View<const float>(q, {1, 2, 1, 2}),
                     View<const float>(kv, {1, 1, 1, 2}),
                     View<const float>(kv, {1, 1, 1, 2}), o.view(), lse.view());
  EXPECT_EQ(o.view().At(0, 0, 0, 0), 0.0);
  EXPECT_EQ(lse.view().At(0, 0, 0, 0), -INFINITY);
  EXPECT_EQ(o.view().At(0, 1, 0, 1), 6.0);
  EXPECT_NEAR(lse.view().At(0, 1, 0, 0), 3 * 5 + 4 * 6, 1e-12);
}

}  // namespace
}  // namespace ringattn
