#include "kernels/cpu/merge_with_lse.h"

#include <cmath>

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

}  // namespace
}  // namespace ringattn
