#include "worker/attention_tiles.h"

#include <algorithm>

#include "core/range.h"

namespace ringattn {
namespace {

// Sizes that differ by at most one, summing to `length`, none above `most`.
std::vector<Range> Tiles(int64_t length, int64_t most) {
  std::vector<Range> tiles;
  if (length <= 0) return tiles;
  const int64_t parts = (length + most - 1) / most;
  const int64_t base = length / parts;
  const int64_t extra = length % parts;
  int64_t at = 0;
  for (int64_t i = 0; i < parts; ++i) {
    const int64_t size = base + (i < extra ? 1 : 0);
    tiles.push_back(Range{at, at + size});
    at += size;
  }
  return tiles;
}

// Appends the tiles of rows [q_row, q_row + q_len) against keys [k_row, k_row
// + kv_len), where local query i sees local key j iff j <= i + shift.
void AddCausalTiles(int64_t q_row, int64_t q_len, int64_t k_row, int64_t kv_len,
                    int64_t shift, std::vector<AttentionTile>& tiles) {
  if (shift >= kv_len - 1) {  // even the first row sees every key
    tiles.push_back({q_row, q_len, k_row, kv_len, false});
    return;
  }
  if (shift + q_len - 1 < 0) return;  // even the last row sees no key
  // Rows below kv_len - shift see part of the keys: a tile whose own
  // bottom-right diagonal is the mask's (rows that see nothing left out);
  // the rows after them see every key.
  const int64_t limited_rows = std::min(q_len, kv_len - shift);
  const int64_t blind_rows = std::max<int64_t>(0, -shift);
  tiles.push_back({q_row + blind_rows, limited_rows - blind_rows, k_row,
                   limited_rows + shift, true});
  if (limited_rows < q_len) {
    tiles.push_back(
        {q_row + limited_rows, q_len - limited_rows, k_row, kv_len, false});
  }
}

}  // namespace

void AddRectangleTiles(int64_t q_row, int64_t q_len, int64_t k_row,
                       int64_t kv_len, bool causal, int64_t shift,
                       int64_t tile_q_rows, int64_t tile_kv_rows,
                       std::vector<AttentionTile>& tiles) {
  for (const Range& qt : Tiles(q_len, tile_q_rows)) {
    for (const Range& kt : Tiles(kv_len, tile_kv_rows)) {
      if (!causal) {
        tiles.push_back(
            {q_row + qt.begin, qt.size(), k_row + kt.begin, kt.size(), false});
        continue;
      }
      AddCausalTiles(q_row + qt.begin, qt.size(), k_row + kt.begin, kt.size(),
                     shift + qt.begin - kt.begin, tiles);
    }
  }
}

}  // namespace ringattn
