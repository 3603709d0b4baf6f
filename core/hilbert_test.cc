#include "core/hilbert.h"

#include <algorithm>
#include <cstdlib>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace ringattn {
namespace {

struct Cell {
  int64_t row;
  int64_t col;
};

Cell CellOf(int64_t index, int64_t width) {
  return {index / width, index % width};
}

// How the steps of a curve over a height x width grid move.
struct StepCounts {
  int64_t neighbour = 0;  // |dr| + |dc| == 1
  int64_t diagonal = 0;   // |dr| == |dc| == 1
  int64_t other = 0;      // anything else: a jump
};

StepCounts CountSteps(const std::vector<int64_t>& order, int64_t width) {
  StepCounts counts;
  for (size_t t = 1; t < order.size(); ++t) {
    const Cell from = CellOf(order[t - 1], width);
    const Cell to = CellOf(order[t], width);
    const int64_t dr = std::abs(to.row - from.row);
    const int64_t dc = std::abs(to.col - from.col);
    if (dr + dc == 1) {
      ++counts.neighbour;
    } else if (dr == 1 && dc == 1) {
      ++counts.diagonal;
    } else {
      ++counts.other;
    }
  }
  return counts;
}

bool IsPermutation(const std::vector<int64_t>& order, int64_t size) {
  if (static_cast<int64_t>(order.size()) != size) return false;
  std::vector<bool> seen(static_cast<size_t>(size), false);
  for (int64_t index : order) {
    if (index < 0 || index >= size || seen[static_cast<size_t>(index)]) {
      return false;
    }
    seen[static_cast<size_t>(index)] = true;
  }
  return true;
}

// Checks everything HilbertOrder promises for any grid: a bijection starting at
// (0, 0) whose steps go to grid neighbours, with diagonal steps only where a
// side is odd.
void ExpectValidCurve(int64_t height, int64_t width) {
  SCOPED_TRACE(testing::Message() << height << "x" << width);
  const std::vector<int64_t> order = HilbertOrder(height, width);
  ASSERT_TRUE(IsPermutation(order, height * width));
  EXPECT_EQ(order.front(), 0);
  const StepCounts steps = CountSteps(order, width);
  EXPECT_EQ(steps.other, 0);
  if (height % 2 == 0 && width % 2 == 0) {
    EXPECT_EQ(steps.diagonal, 0);
  }
}

// The area of the smallest box holding cells order[begin .. begin + length).
int64_t BoundingBoxArea(const std::vector<int64_t>& order, int64_t width,
                        size_t begin, size_t length) {
  int64_t min_row = order[begin] / width, max_row = min_row;
  int64_t min_col = order[begin] % width, max_col = min_col;
  for (size_t t = begin; t < begin + length; ++t) {
    const Cell cell = CellOf(order[t], width);
    min_row = std::min(min_row, cell.row);
    max_row = std::max(max_row, cell.row);
    min_col = std::min(min_col, cell.col);
    max_col = std::max(max_col, cell.col);
  }
  return (max_row - min_row + 1) * (max_col - min_col + 1);
}

// The largest bounding-box area over all runs of `length` consecutive cells.
int64_t WorstRunArea(const std::vector<int64_t>& order, int64_t width,
                     size_t length) {
  int64_t worst = 0;
  for (size_t begin = 0; begin + length <= order.size(); ++begin) {
    worst = std::max(worst, BoundingBoxArea(order, width, begin, length));
  }
  return worst;
}

TEST(HilbertOrderTest, EmptyGridHasEmptyOrder) {
  EXPECT_TRUE(HilbertOrder(0, 0).empty());
  EXPECT_TRUE(HilbertOrder(0, 5).empty());
  EXPECT_TRUE(HilbertOrder(5, 0).empty());
}

TEST(HilbertOrderTest, SingleCell) {
  EXPECT_EQ(HilbertOrder(1, 1), std::vector<int64_t>{0});
}

// Layouts pin the exact curve, since every party laying out a grid must agree
// on it. Expected values come from a direct transcription of the published
// gilbert2d algorithm (Python, with floor division).
TEST(HilbertOrderTest, MatchesReferenceLayouts) {
  // Taller than wide: the major axis runs down the rows.
  EXPECT_EQ(HilbertOrder(6, 5),
            (std::vector<int64_t>{0,  5,  10, 11, 6,  1,  2,  7,  8,  3,
                                  4,  9,  14, 19, 18, 13, 12, 17, 22, 23,
                                  24, 29, 28, 27, 26, 21, 16, 15, 20, 25}));
  EXPECT_EQ(HilbertOrder(5, 6),
            (std::vector<int64_t>{0,  1,  2,  8,  7,  6,  12, 13, 19, 18,
                                  24, 25, 26, 27, 21, 20, 14, 15, 16, 22,
                                  28, 29, 23, 17, 11, 10, 9,  3,  4,  5}));
  // The smallest grid whose layout depends on halving odd negative extents with
  // floor (not truncating) division.
  EXPECT_EQ(
      HilbertOrder(10, 10),
      (std::vector<int64_t>{
          0,  10, 20, 21, 11, 1,  2,  12, 13, 3,  4,  14, 24, 34, 33, 23, 22,
          32, 42, 43, 44, 54, 53, 52, 51, 41, 31, 30, 40, 50, 60, 61, 62, 72,
          71, 70, 80, 90, 91, 81, 82, 92, 93, 83, 84, 94, 95, 85, 75, 74, 73,
          63, 64, 65, 66, 67, 77, 76, 86, 96, 97, 87, 88, 98, 99, 89, 79, 78,
          68, 69, 59, 58, 48, 49, 39, 38, 37, 36, 46, 47, 57, 56, 55, 45, 35,
          25, 15, 5,  6,  7,  17, 16, 26, 27, 28, 29, 19, 18, 8,  9}));
  // Short side even, long side odd: one diagonal step, from cell 13 (row 2,
  // column 3) to cell 9 (row 1, column 4).
  EXPECT_EQ(HilbertOrder(4, 5),
            (std::vector<int64_t>{0,  1,  6,  5,  10, 15, 16, 11, 12, 17,
                                  18, 19, 14, 13, 9,  8,  7,  2,  3,  4}));
}

TEST(HilbertOrderTest, EverySmallGridIsAConnectedBijection) {
  for (int64_t height = 1; height <= 33; ++height) {
    for (int64_t width = 1; width <= 33; ++width) {
      ExpectValidCurve(height, width);
    }
  }
}

TEST(HilbertOrderTest, DiagonalStepOnlyWhenShortSideEvenAndLongSideOdd) {
  for (int64_t height = 1; height <= 33; ++height) {
    for (int64_t width = 1; width <= 33; ++width) {
      const int64_t shorter = std::min(height, width);
      const int64_t longer = std::max(height, width);
      const int64_t expected =
          (shorter % 2 == 0 && shorter >= 4 && longer % 2 == 1) ? 1 : 0;
      EXPECT_EQ(CountSteps(HilbertOrder(height, width), width).diagonal,
                expected)
          << height << "x" << width;
    }
  }
}

TEST(HilbertOrderTest, StripsAreWalkedStraight) {
  for (int64_t length = 1; length <= 1000; ++length) {
    std::vector<int64_t> straight(static_cast<size_t>(length));
    for (int64_t i = 0; i < length; ++i) straight[static_cast<size_t>(i)] = i;
    EXPECT_EQ(HilbertOrder(1, length), straight) << "1x" << length;
    EXPECT_EQ(HilbertOrder(length, 1), straight) << length << "x1";
  }
}

TEST(HilbertOrderTest, AssortedSizesAreConnectedBijections) {
  const std::pair<int64_t, int64_t> sizes[] = {
      {3, 5},   {5, 3},    {7, 13},   {13, 7},   {31, 37},
      {37, 31}, {64, 64},  {100, 37}, {37, 100}, {2, 999},
      {999, 2}, {128, 96}, {97, 211}, {250, 250}};
  for (const auto& [height, width] : sizes) ExpectValidCurve(height, width);
}

TEST(HilbertOrderTest, PowerOfTwoSquaresStepOnlyToNeighbours) {
  for (int64_t side = 1; side <= 256; side *= 2) {
    const std::vector<int64_t> order = HilbertOrder(side, side);
    ASSERT_TRUE(IsPermutation(order, side * side)) << side;
    EXPECT_EQ(order.front(), 0) << side;
    const StepCounts steps = CountSteps(order, side);
    EXPECT_EQ(steps.neighbour, side * side - 1) << side;
  }
}

// The defining property of the Hilbert curve: on a 2^n square, the cells t with
// t / 4^k equal fill one aligned 2^k x 2^k square.
TEST(HilbertOrderTest, PowerOfTwoSquareFillsAlignedBlocksInTurn) {
  constexpr int64_t kSide = 64;
  const std::vector<int64_t> order = HilbertOrder(kSide, kSide);
  for (int64_t block = 2; block < kSide; block *= 2) {
    const size_t run = static_cast<size_t>(block * block);
    for (size_t begin = 0; begin < order.size(); begin += run) {
      const Cell first = CellOf(order[begin], kSide);
      for (size_t t = begin; t < begin + run; ++t) {
        const Cell cell = CellOf(order[t], kSide);
        ASSERT_EQ(cell.row / block, first.row / block) << block << " " << t;
        ASSERT_EQ(cell.col / block, first.col / block) << block << " " << t;
      }
    }
  }
}

// Any run of L consecutive cells, aligned or not, fits in a box of area at most
// 2L on a power-of-two square (measured: 1.5L, 1.75L, 1.88L and 1.94L for the
// runs checked), and stays within 3L on other rectangles (measured up to 2.2L).
TEST(HilbertOrderTest, ConsecutiveRunsStayCompact) {
  const std::vector<int64_t> square = HilbertOrder(64, 64);
  for (size_t length : {4, 16, 64, 256}) {
    EXPECT_LE(WorstRunArea(square, 64, length),
              2 * static_cast<int64_t>(length))
        << length;
  }
  EXPECT_LE(WorstRunArea(square, 64, 16), 28);

  const std::pair<int64_t, int64_t> sizes[] = {{100, 37}, {31, 37}, {63, 65}};
  for (const auto& [height, width] : sizes) {
    const std::vector<int64_t> order = HilbertOrder(height, width);
    for (size_t length : {4, 16, 64, 256}) {
      EXPECT_LE(WorstRunArea(order, width, length),
                3 * static_cast<int64_t>(length))
          << height << "x" << width << " " << length;
    }
  }
}

TEST(HilbertOrderTest, IsDeterministic) {
  EXPECT_EQ(HilbertOrder(37, 100), HilbertOrder(37, 100));
}

TEST(InversePermutationTest, InvertsSmallPermutation) {
  EXPECT_EQ(InversePermutation({2, 0, 1}), (std::vector<int64_t>{1, 2, 0}));
  EXPECT_TRUE(InversePermutation({}).empty());
}

TEST(InversePermutationTest, InvertsCurveOrder) {
  const std::vector<int64_t> order = HilbertOrder(31, 37);
  const std::vector<int64_t> inverse = InversePermutation(order);
  ASSERT_EQ(inverse.size(), order.size());
  for (size_t t = 0; t < order.size(); ++t) {
    EXPECT_EQ(inverse[static_cast<size_t>(order[t])], static_cast<int64_t>(t));
    EXPECT_EQ(order[static_cast<size_t>(inverse[t])], static_cast<int64_t>(t));
  }
  EXPECT_EQ(InversePermutation(inverse), order);
}

}  // namespace
}  // namespace ringattn
