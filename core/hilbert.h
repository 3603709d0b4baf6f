#ifndef RINGATTN_CORE_HILBERT_H_
#define RINGATTN_CORE_HILBERT_H_

// A space-filling curve over an arbitrary H x W grid, used to lay out 2-D
// blocks (e.g. image patches) along a sequence so that positions close in the
// sequence are close in the grid. This is the generalized Hilbert curve
// ("gilbert"): the classic Hilbert curve on power-of-two squares, extended to
// any rectangle by recursive splitting.

#include <cstdint>
#include <vector>

namespace ringattn {

// The cells of a `height` x `width` grid in generalized Hilbert curve order:
// order[t] = row * width + col of the t-th cell visited. The result is a
// permutation of 0 .. height * width - 1 that starts at cell (0, 0);
// consecutive cells are grid neighbours, except for a single diagonal step when
// the shorter side is even and at least 4 and the longer side is odd. On
// power-of-two squares this is the classic Hilbert curve. Deterministic;
// O(height * width) time. Requires height >= 0 and width >= 0; an empty grid
// gives an empty order.
std::vector<int64_t> HilbertOrder(int64_t height, int64_t width);

// The inverse of `permutation`: result[permutation[i]] = i.
// Requires `permutation` to be a permutation of 0 .. permutation.size() - 1.
std::vector<int64_t> InversePermutation(
    const std::vector<int64_t>& permutation);

}  // namespace ringattn

#endif  // RINGATTN_CORE_HILBERT_H_
