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
// `fresh`: the first tile of its run to write its query rows, which it
// stores into the accumulators instead of folding into them
// (MarkFreshTiles).
struct AttentionTile {
  int64_t q_row = 0;
  int64_t q_len = 0;
  int64_t k_row = 0;
  int64_t kv_len = 0;
  bool causal = false;
  bool fresh = false;

  friend bool operator==(const AttentionTile& a, const AttentionTile& b) {
    return a.q_row == b.q_row && a.q_len == b.q_len && a.k_row == b.k_row &&
           a.kv_len == b.kv_len && a.causal == b.causal && a.fresh == b.fresh;
  }
};

// Appends the tiles of query rows [q_row, q_row + q_len) against key rows
// [k_row, k_row + kv_len), each at most tile_q_rows x tile_kv_rows (split
// evenly). Every pair is visible unless `causal`; then local query i sees
// local key j iff j <= i + shift, and the tiles are unmasked ones, ones whose
// own bottom-right diagonal is the mask's, and none for pairs it hides. Every
// visible pair lands in exactly one tile. Requires positive tile sizes.
//
// With wave_rows in (0, tile_q_rows], query rows that need more than two
// tiles are cut instead into tiles of the most whole multiples of wave_rows
// that fit tile_q_rows, the rest in a last, shorter tile: where wave_rows
// query rows make thread blocks for every SM once, each launch but the last
// then ends without a part-filled wave.
void AddRectangleTiles(int64_t q_row, int64_t q_len, int64_t k_row,
                       int64_t kv_len, bool causal, int64_t shift,
                       int64_t tile_q_rows, int64_t tile_kv_rows,
                       std::vector<AttentionTile>& tiles,
                       int64_t wave_rows = 0);

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

// Marks `fresh` each tile of `steps` (in the order a run launches them: step
// by step, each step's tiles in turn) that is the first to write its query
// rows, where that lets the run skip clearing its accumulators: the marked
// tiles together write every row of [0, rows), and each later tile's rows lie
// within those of tiles before it. Returns whether it marked them; marks
// nothing and returns false otherwise (a tile that covers rows both written
// and unwritten before it, or rows no tile writes).
bool MarkFreshTiles(int64_t rows,
                    std::vector<std::vector<AttentionTile>>& steps);

}  // namespace ringattn

#endif  // RINGATTN_WORKER_ATTENTION_TILES_H_
