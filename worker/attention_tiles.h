#ifndef RINGATTN_WORKER_ATTENTION_TILES_H_
#define RINGATTN_WORKER_ATTENTION_TILES_H_

// AttentionTile: one dense block of attention a GPU executor launches, and
// the cutting of a rectangle of (query, key) pairs under a shifted causal mask
// into such tiles. Shared by the ring's tasks and the dilated launches.

#include <cstdint>
#include <vector>

namespace ringattn {

// Query rows [q_row, q_row + q_len) against key rows [k_row, k_row + kv_len),
// with the bottom-right aligned causal mask if `causal`.
struct AttentionTile {
  int64_t q_row = 0;
  int64_t q_len = 0;
  int64_t k_row = 0;
  int64_t kv_len = 0;
  bool causal = false;

  friend bool operator==(const AttentionTile& a, const AttentionTile& b) {
    return a.q_row == b.q_row && a.q_len == b.q_len && a.k_row == b.k_row &&
           a.kv_len == b.kv_len && a.causal == b.causal;
  }
};

// Appends the tiles of query rows [q_row, q_row + q_len) against key rows
// [k_row, k_row + kv_len), each at most tile_q_rows x tile_kv_rows (split
// evenly). Every pair is visible unless `causal`; then local query i sees
// local key j iff j <= i + shift, and the tiles are unmasked ones, ones whose
// own bottom-right diagonal is the mask's, and none for pairs it hides. Every
// visible pair lands in exactly one tile. Requires positive tile sizes.
void AddRectangleTiles(int64_t q_row, int64_t q_len, int64_t k_row,
                       int64_t kv_len, bool causal, int64_t shift,
                       int64_t tile_q_rows, int64_t tile_kv_rows,
                       std::vector<AttentionTile>& tiles);

// Joins tiles of `tiles` (one step's: the same query rows and key block)
// into fewer, larger ones where that keeps every pair's visibility: two tiles
// become the smallest rectangle around them when that rectangle, as one dense
// tile or one causal tile (bottom-right aligned), shows exactly the pairs the
// two showed and hides every pair neither held, is at most tile_q_rows x
// tile_kv_rows, and gives each of its rows a key. So a rank's zigzag chunks
// (its first and last chunk of the sequence, attended to each other and to
// themselves) become one causal tile instead of three, and its two dense
// chunk pairs of a later step one dense tile: fewer, fuller kernel launches.
void JoinTiles(int64_t tile_q_rows, int64_t tile_kv_rows,
               std::vector<AttentionTile>& tiles);

}  // namespace ringattn

#endif  // RINGATTN_WORKER_ATTENTION_TILES_H_
