#ifndef RINGATTN_KERNELS_CUDA_ATTENTION_WORK_LIST_H_
#define RINGATTN_KERNELS_CUDA_ATTENTION_WORK_LIST_H_

// A work list for our attention kernels: which query tiles to compute and,
// for each, the stretches of keys it attends to and under which mask. One
// launch then runs a whole block-sparse pattern (or any set of rectangles of a
// block) with one online softmax per query tile, never touching the pairs the
// list leaves out and needing no LSE merge between the rectangles. Plain
// values; kept free of abseil so that .cu files can include it.

#include <cstdint>

namespace ringattn {

// The most query rows one QueryTile may hold: the rows one thread block of
// our kernels takes.
inline constexpr int32_t kWorkListTileRows = 128;

// Key rows [begin, end) of the block, all visible, or with `causal` only key
// j <= i + shift to query row i (rows of the block, not of the tile).
struct KeySpan {
  int32_t begin = 0;
  int32_t end = 0;
  int32_t causal = 0;
  int32_t shift = 0;
};

// Query rows [begin, end) of the block (at most kWorkListTileRows) attending
// to spans[first_span, first_span + span_count) of the list, which must not
// overlap. A row no span shows a key gets o = 0 and lse = -inf.
struct QueryTile {
  int32_t begin = 0;
  int32_t end = 0;
  int32_t first_span = 0;
  int32_t span_count = 0;
};

// Query tiles and their key spans, both arrays in device memory. Tiles must
// not share rows; rows no tile holds are left untouched (o and lse). Empty
// (tile_count == 0): the whole block, dense or causal as the args say.
struct DeviceWorkList {
  const QueryTile* tiles = nullptr;
  int64_t tile_count = 0;
  const KeySpan* spans = nullptr;
  int64_t span_count = 0;
};

}  // namespace ringattn

#endif  // RINGATTN_KERNELS_CUDA_ATTENTION_WORK_LIST_H_
