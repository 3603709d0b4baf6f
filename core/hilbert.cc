#include "core/hilbert.h"

#include <cstdlib>

namespace ringattn {
namespace {

int64_t Sign(int64_t value) { return (value > 0) - (value < 0); }

// `value / 2` rounded toward negative infinity.
int64_t FloorHalf(int64_t value) {
  return value >= 0 ? value / 2 : -((1 - value) / 2);
}

// Appends the cells of one rectangle to `order`. The rectangle has its start
// corner at column x, row y and spans the vector a = (ax, ay) along its major
// axis and b = (bx, by) along its minor axis; exactly one component of each
// vector is nonzero, and |a| >= 1, |b| >= 1. The walk starts at the start
// corner and ends in the corner reached by going along a only, so the
// rectangles of a split can be chained end to start.
void FillRectangle(int64_t x, int64_t y, int64_t ax, int64_t ay, int64_t bx,
                   int64_t by, int64_t width, std::vector<int64_t>* order) {
  const int64_t major_length = std::abs(ax + ay);
  const int64_t minor_length = std::abs(bx + by);
  const int64_t dax = Sign(ax), day = Sign(ay);  // unit step along a
  const int64_t dbx = Sign(bx), dby = Sign(by);  // unit step along b

  if (minor_length == 1) {  // a single line along a
    for (int64_t i = 0; i < major_length; ++i) {
      order->push_back((y + i * day) * width + (x + i * dax));
    }
    return;
  }
  if (major_length == 1) {  // a single line along b
    for (int64_t i = 0; i < minor_length; ++i) {
      order->push_back((y + i * dby) * width + (x + i * dbx));
    }
    return;
  }

  int64_t ax2 = FloorHalf(ax), ay2 = FloorHalf(ay);
  int64_t bx2 = FloorHalf(bx), by2 = FloorHalf(by);

  if (2 * major_length > 3 * minor_length) {
    // Long and thin: cut across a into two halves walked one after the other,
    // making the first half even in length where possible so that its walk ends
    // on the side where the second begins.
    if (std::abs(ax2 + ay2) % 2 != 0 && major_length > 2) {
      ax2 += dax;
      ay2 += day;
    }
    FillRectangle(x, y, ax2, ay2, bx, by, width, order);
    FillRectangle(x + ax2, y + ay2, ax - ax2, ay - ay2, bx, by, width, order);
    return;
  }

  // Otherwise, as in the Hilbert curve: go up the near half of b (transposed),
  // along the whole far part, and back down the near half at the far end of a
  // (transposed and reversed). The near half of b is made even where possible,
  // for the same reason as above.
  if (std::abs(bx2 + by2) % 2 != 0 && minor_length > 2) {
    bx2 += dbx;
    by2 += dby;
  }
  FillRectangle(x, y, bx2, by2, ax2, ay2, width, order);
  FillRectangle(x + bx2, y + by2, ax, ay, bx - bx2, by - by2, width, order);
  FillRectangle(x + (ax - dax) + (bx2 - dbx), y + (ay - day) + (by2 - dby),
                -bx2, -by2, -(ax - ax2), -(ay - ay2), width, order);
}

}  // namespace

std::vector<int64_t> HilbertOrder(int64_t height, int64_t width) {
  std::vector<int64_t> order;
  if (height <= 0 || width <= 0) return order;
  order.reserve(static_cast<size_t>(height * width));
  // The major axis is the longer side: columns (x) if the grid is at least as
  // wide as it is tall, rows (y) otherwise.
  if (width >= height) {
    FillRectangle(0, 0, width, 0, 0, height, width, &order);
  } else {
    FillRectangle(0, 0, 0, height, width, 0, width, &order);
  }
  return order;
}

std::vector<int64_t> InversePermutation(
    const std::vector<int64_t>& permutation) {
  std::vector<int64_t> inverse(permutation.size());
  for (size_t i = 0; i < permutation.size(); ++i) {
    inverse[static_cast<size_t>(permutation[i])] = static_cast<int64_t>(i);
  }
  return inverse;
}

}  // namespace ringattn
