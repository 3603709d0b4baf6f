#include "worker/attention_tiles.h"

#include <algorithm>
#include <cstddef>
#include <map>
#include <optional>
#include <utility>
#include <vector>

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

// The query rows of AddRectangleTiles: Tiles(length, most), or pieces of
// whole multiples of `wave_rows` where that is in (0, most] and `length`
// needs more than two pieces. (With two, the causal diagonal cut in three
// cost more than the waves saved: one H200, causal 64K, 617-618 TFLOP/s
// against 624-625.)
std::vector<Range> QueryTiles(int64_t length, int64_t most, int64_t wave_rows) {
  if (wave_rows <= 0 || wave_rows > most || length <= 2 * most) {
    return Tiles(length, most);
  }
  const int64_t piece = most / wave_rows * wave_rows;
  std::vector<Range> tiles;
  for (int64_t at = 0; at < length; at += piece) {
    tiles.push_back(Range{at, std::min(length, at + piece)});
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

// A cell of query rows [q.begin, q.end) against keys [k.begin, k.end).
struct Cell {
  Range q;
  Range k;
};

// A mask rule in local rows: query i sees key j iff j - i <= diagonal, or
// every key where there is no diagonal (dense).
using Rule = std::optional<int64_t>;

// The pairs of `cell` that `rule` shows, named by the diagonal clamped to the
// range of j - i over the cell: two rules show the same pairs of the cell iff
// their values are equal.
int64_t Shown(const Cell& cell, Rule rule) {
  const int64_t least = cell.k.begin - (cell.q.end - 1);
  const int64_t most = (cell.k.end - 1) - cell.q.begin;
  return rule.has_value() ? std::clamp(*rule, least - 1, most) : most;
}

bool ShowsAll(const Cell& cell, Rule rule) {
  return Shown(cell, rule) == (cell.k.end - 1) - cell.q.begin;
}

bool ShowsNone(const Cell& cell, Rule rule) {
  return Shown(cell, rule) < cell.k.begin - (cell.q.end - 1);
}

// The rule of `tile`: dense, or its own bottom-right diagonal.
Rule RuleOf(const AttentionTile& tile) {
  if (!tile.causal) return std::nullopt;
  return tile.k_row + tile.kv_len - (tile.q_row + tile.q_len);
}

bool Holds(const AttentionTile& tile, const Cell& cell) {
  return tile.q_row <= cell.q.begin && cell.q.end <= tile.q_row + tile.q_len &&
         tile.k_row <= cell.k.begin && cell.k.end <= tile.k_row + tile.kv_len;
}

// The sorted, distinct values of `cuts`.
std::vector<int64_t> Distinct(std::vector<int64_t> cuts) {
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  return cuts;
}

// The tile around `a` and `b` that JoinTiles may put in their place.
std::optional<AttentionTile> Joined(const AttentionTile& a,
                                    const AttentionTile& b, int64_t tile_q_rows,
                                    int64_t tile_kv_rows) {
  const Cell around{{std::min(a.q_row, b.q_row),
                     std::max(a.q_row + a.q_len, b.q_row + b.q_len)},
                    {std::min(a.k_row, b.k_row),
                     std::max(a.k_row + a.kv_len, b.k_row + b.kv_len)}};
  if (around.q.size() > tile_q_rows || around.k.size() > tile_kv_rows) {
    return std::nullopt;
  }
  // Dense where both are, else causal on the rectangle's own diagonal.
  Rule rule;
  if (a.causal || b.causal) rule = around.k.end - around.q.end;
  // Every row must see a key: the first one sees keys up to q.begin + rule.
  if (rule.has_value() && around.k.begin > around.q.begin + *rule) {
    return std::nullopt;
  }
  // Cut the rectangle at every edge of a and b: each cell lies in a, in b or
  // in neither, and must show what a or b showed there, or nothing.
  const std::vector<int64_t> q_cuts =
      Distinct({around.q.begin, around.q.end, a.q_row, a.q_row + a.q_len,
                b.q_row, b.q_row + b.q_len});
  const std::vector<int64_t> k_cuts =
      Distinct({around.k.begin, around.k.end, a.k_row, a.k_row + a.kv_len,
                b.k_row, b.k_row + b.kv_len});
  for (size_t i = 0; i + 1 < q_cuts.size(); ++i) {
    for (size_t j = 0; j + 1 < k_cuts.size(); ++j) {
      const Cell cell{{q_cuts[i], q_cuts[i + 1]}, {k_cuts[j], k_cuts[j + 1]}};
      const bool in_a = Holds(a, cell);
      const bool in_b = Holds(b, cell);
      if (in_a && in_b) return std::nullopt;  // overlapping tiles
      const bool same =
          in_a || in_b ? Shown(cell, RuleOf(in_a ? a : b)) == Shown(cell, rule)
                       : ShowsNone(cell, rule);
      if (!same) return std::nullopt;
    }
  }
  return AttentionTile{around.q.begin, around.q.size(), around.k.begin,
                       around.k.size(), !ShowsAll(around, rule)};
}

// The cells of a grid of `size`-long sides that starts in [begin, end) touch.
Range CellsOf(int64_t begin, int64_t end, int64_t size) {
  return Range{std::max<int64_t>(0, begin) / size, (end - 1) / size + 1};
}

}  // namespace

void JoinTiles(int64_t tile_q_rows, int64_t tile_kv_rows,
               std::vector<AttentionTile>& tiles) {
  // Passes of: each live tile in turn takes every later one it joins. A
  // tile can only join one whose start lies within a tile size of its own,
  // so the candidates come from the cells of a grid of tile-sized squares
  // around it (not from every later tile: a 4M-token causal step has ~33K
  // tiles). A tile changes only while it takes others, and takes only later
  // ones, so the grid of the pass's start holds every candidate.
  bool joined = true;
  while (joined) {
    joined = false;
    std::map<std::pair<int64_t, int64_t>, std::vector<size_t>> grid;
    for (size_t i = 0; i < tiles.size(); ++i) {
      grid[{tiles[i].q_row / tile_q_rows, tiles[i].k_row / tile_kv_rows}]
          .push_back(i);
    }
    std::vector<bool> taken(tiles.size(), false);
    std::vector<size_t> candidates;
    for (size_t i = 0; i < tiles.size(); ++i) {
      if (taken[i]) continue;
      // A later tile's start q lies in [q_end - tile_q_rows, q_row +
      // tile_q_rows), and its k likewise, or the two exceed the tile size.
      const AttentionTile& tile = tiles[i];
      const Range q_cells = CellsOf(tile.q_row + tile.q_len - tile_q_rows,
                                    tile.q_row + tile_q_rows, tile_q_rows);
      const Range k_cells = CellsOf(tile.k_row + tile.kv_len - tile_kv_rows,
                                    tile.k_row + tile_kv_rows, tile_kv_rows);
      candidates.clear();
      for (int64_t q = q_cells.begin; q < q_cells.end; ++q) {
        for (int64_t k = k_cells.begin; k < k_cells.end; ++k) {
          const auto cell = grid.find({q, k});
          if (cell == grid.end()) continue;
          for (size_t j : cell->second) {
            if (j > i) candidates.push_back(j);
          }
        }
      }
      std::sort(candidates.begin(), candidates.end());
      for (size_t j : candidates) {
        if (taken[j]) continue;
        const std::optional<AttentionTile> both =
            Joined(tiles[i], tiles[j], tile_q_rows, tile_kv_rows);
        if (!both.has_value()) continue;
        tiles[i] = *both;
        taken[j] = true;
        joined = true;
      }
    }
    size_t kept = 0;
    for (size_t i = 0; i < tiles.size(); ++i) {
      if (!taken[i]) tiles[kept++] = tiles[i];
    }
    tiles.resize(kept);
  }
}

void AddRectangleTiles(int64_t q_row, int64_t q_len, int64_t k_row,
                       int64_t kv_len, bool causal, int64_t shift,
                       int64_t tile_q_rows, int64_t tile_kv_rows,
                       std::vector<AttentionTile>& tiles, int64_t wave_rows) {
  for (const Range& qt : QueryTiles(q_len, tile_q_rows, wave_rows)) {
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

bool MarkFreshTiles(int64_t rows,
                    std::vector<std::vector<AttentionTile>>& steps) {
  // The rows written so far, as disjoint ranges: begin -> end.
  std::map<int64_t, int64_t> written;
  // How many rows of `range` those cover.
  const auto covered = [&written](const Range& range) {
    int64_t count = 0;
    auto it = written.upper_bound(range.begin);
    if (it != written.begin()) --it;
    for (; it != written.end() && it->first < range.end; ++it) {
      count += std::max<int64_t>(
          0, range.Intersect(Range{it->first, it->second}).size());
    }
    return count;
  };
  // The marked tiles are disjoint: they cover [0, rows) exactly iff their
  // rows add up to `rows` and lie within it.
  std::vector<AttentionTile*> fresh;
  int64_t fresh_rows = 0;
  for (std::vector<AttentionTile>& step : steps) {
    for (AttentionTile& tile : step) {
      if (tile.q_len <= 0) continue;
      const Range tile_rows{tile.q_row, tile.q_row + tile.q_len};
      const int64_t seen = covered(tile_rows);
      if (seen == tile.q_len) continue;
      if (seen > 0) return false;
      fresh.push_back(&tile);
      fresh_rows += tile.q_len;
      written[tile_rows.begin] = tile_rows.end;
    }
  }
  if (rows <= 0 || fresh_rows != rows || covered(Range{0, rows}) != rows) {
    return false;
  }
  for (AttentionTile* tile : fresh) tile->fresh = true;
  return true;
}

}  // namespace ringattn
