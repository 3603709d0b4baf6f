#include "kernels/cpu/merge_with_lse.h"

#include <cmath>
#include <random>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/random_tensor.h"
#include "gtest/gtest.h"

namespace ringattn {
namespace {

// Merging the attention over keys {a} and over keys {b} must give the attention
// over {a, b}: weights e^lse_a : e^lse_b.
TEST(MergeWithLse, MergesTwoPartialsByTheirDenominators) {
  float o[2] = {1, 10};
  float lse[1] = {std::log(1.0f)};
  const float part_o[2] = {3, 30};
  const float part_lse[1] = {std::log(3.0f)};
  MergeWithLse(View<float>(o, {1, 1, 1, 2}), View<float>(lse, {1, 1, 1, 1}),
               View<const float>(part_o, {1, 1, 1, 2}),
               View<const float>(part_lse, {1, 1, 1, 1}));
  EXPECT_NEAR(o[0], (1 * 1 + 3 * 3) / 4.0, 1e-6);
  EXPECT_NEAR(o[1], (1 * 10 + 3 * 30) / 4.0, 1e-5);
  EXPECT_NEAR(lse[0], std::log(4.0), 1e-6);
}

TEST(MergeWithLse, EmptyRowsMergeWithoutNan) {
  // Row 0: both empty. Row 1: accumulator empty. Row 2: partial empty.
  float o[3] = {0, 0, 7};
  float lse[3] = {-INFINITY, -INFINITY, 2};
  const float part_o[3] = {0, 5, 0};
  const float part_lse[3] = {-INFINITY, 1, -INFINITY};
  MergeWithLse(View<float>(o, {1, 3, 1, 1}), View<float>(lse, {1, 3, 1, 1}),
               View<const float>(part_o, {1, 3, 1, 1}),
               View<const float>(part_lse, {1, 3, 1, 1}));
  EXPECT_EQ(o[0], 0.0f);
  EXPECT_EQ(lse[0], -INFINITY);
  EXPECT_EQ(o[1], 5.0f);
  EXPECT_EQ(lse[1], 1.0f);
  EXPECT_EQ(o[2], 7.0f);
  EXPECT_EQ(lse[2], 2.0f);
}

TEST(MergeWithLse, StaysFiniteForFarApartLse) {
  float o[1] = {1};
  float lse[1] = {-1000};
  const float part_o[1] = {2};
  const float part_lse[1] = {1000};
  MergeWithLse(View<float>(o, {1, 1, 1, 1}), View<float>(lse, {1, 1, 1, 1}),
               View<const float>(part_o, {1, 1, 1, 1}),
               View<const float>(part_lse, {1, 1, 1, 1}));
  EXPECT_EQ(o[0], 2.0f);
  EXPECT_EQ(lse[0], 1000.0f);
}

// A 16-bit partial merges exactly as its values widened to fp32 first would:
// odd shapes, some rows empty on either side.
TEST(MergeWithLse, SixteenBitPartialMergesAsItsWidenedValues) {
  const Shape shape{2, 7, 3, 80};
  const Shape lse_shape{2, 7, 3, 1};
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    SCOPED_TRACE(DTypeName(dtype));
    std::mt19937 rng(5);
    const Tensor<float> acc_o = RandomTensor(shape, rng);
    Tensor<float> acc_lse = RandomTensor(lse_shape, rng);
    Tensor<float> part_lse = RandomTensor(lse_shape, rng);
    acc_lse.values()[4] = -INFINITY;
    part_lse.values()[9] = -INFINITY;
    const Tensor<float> part = RandomTensor(shape, rng);
    const int64_t count = shape.NumElements();
    std::vector<char> narrow(static_cast<size_t>(count * DTypeSize(dtype)));
    ConvertFromFloat(dtype, part.data(), narrow.data(), count);
    Tensor<float> widened(shape);
    ConvertToFloat(dtype, narrow.data(), widened.data(), count);

    Tensor<float> want_o = acc_o, want_lse = acc_lse;
    MergeWithLse(want_o.view(), want_lse.view(), std::as_const(widened).view(),
                 std::as_const(part_lse).view());
    Tensor<float> got_o = acc_o, got_lse = acc_lse;
    MergeWithLse(got_o.view(), got_lse.view(), dtype, narrow.data(),
                 std::as_const(part_lse).view());
    EXPECT_EQ(got_o.values(), want_o.values());
    EXPECT_EQ(got_lse.values(), want_lse.values());
  }
}

}  // namespace
}  // namespace ringattn
