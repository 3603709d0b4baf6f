#include "worker/work_list.h"

#include <algorithm>
#include <utility>

#include "core/range.h"

namespace ringattn {
namespace {

// Query positions that allow the same runs of key positions.
struct QueryGroup {
  Range q;
  std::vector<Range> runs;
};

// The task's query positions, grouped: per query block, the runs of
// consecutive allowed key blocks (clipped to the task), consecutive blocks
// with equal runs in one group.
std::vector<QueryGroup> GroupQueryBlocks(const BlockMask& blocks,
                                         const AttentionTask& task) {
  const int64_t size = blocks.block_size();
  std::vector<QueryGroup> groups;
  std::vector<Range> runs;
  for (int64_t qb = task.q.begin / size; qb <= (task.q.end - 1) / size; ++qb) {
    const Range q{std::max(task.q.begin, qb * size),
                  std::min(task.q.end, (qb + 1) * size)};
    runs.clear();
    for (int64_t kb = task.k.begin / size; kb <= (task.k.end - 1) / size;
         ++kb) {
      if (!blocks.Allowed(qb, kb)) continue;
      const Range k{std::max(task.k.begin, kb * size),
                    std::min(task.k.end, (kb + 1) * size)};
      if (!runs.empty() && runs.back().end == k.begin) {
        runs.back().end = k.end;
      } else {
        runs.push_back(k);
      }
    }
    if (!groups.empty() && groups.back().runs == runs) {
      groups.back().q.end = q.end;
    } else {
      groups.push_back(QueryGroup{q, runs});
    }
  }
  return groups;
}

// Appends the spans of tile rows [a, b) (launch rows) for key runs `runs`
// (global positions; keys relative to `k_begin`); with `causal`, launch row i
// sees key j iff j <= i + shift. Returns whether any span was added.
bool AddSpans(const std::vector<Range>& runs, int64_t k_begin, int64_t a,
              int64_t b, bool causal, int64_t shift,
              std::vector<KeySpan>& spans) {
  bool any = false;
  for (const Range& run : runs) {
    int64_t begin = run.begin - k_begin;
    int64_t end = run.end - k_begin;
    bool masked = false;
    if (causal) {
      end = std::min(end, b - 1 + shift + 1);  // keys the last row sees
      if (end <= begin) continue;
      masked = end - 1 > a + shift;  // the first row does not see them all
    }
    spans.push_back(KeySpan{static_cast<int32_t>(begin),
                            static_cast<int32_t>(end), masked ? 1 : 0,
                            static_cast<int32_t>(masked ? shift : 0)});
    any = true;
  }
  return any;
}

}  // namespace

void AddBlockSparseLaunches(const AttentionSpec& spec, const BlockMask& blocks,
                            const AttentionTask& task, int64_t most_launch_rows,
                            WorkList& list) {
  if (task.q.empty() || task.k.empty()) return;
  const std::vector<QueryGroup> groups = GroupQueryBlocks(blocks, task);
  for (int64_t c0 = task.q.begin; c0 < task.q.end; c0 += most_launch_rows) {
    const Range launch_q{c0, std::min(task.q.end, c0 + most_launch_rows)};
    // Launch row i (position c0 + i) sees launch key j (position
    // task.k.begin + j) iff j <= i + shift, as in AddPositionTiles.
    const int64_t shift = c0 - task.k.begin + spec.kv_len - spec.q_len;
    WorkListLaunch launch;
    launch.q_row = task.q_row + (c0 - task.q.begin);
    launch.q_len = launch_q.size();
    launch.k_row = task.k_row;
    launch.kv_len = task.k.size();
    launch.first_tile = static_cast<int64_t>(list.tiles.size());
    const size_t first_span = list.spans.size();
    bool any = false;
    for (const QueryGroup& group : groups) {
      const Range rows = group.q.Intersect(launch_q);
      if (rows.empty()) continue;
      // Tiles of sizes that differ by at most one.
      const int64_t parts =
          (rows.size() + kWorkListTileRows - 1) / kWorkListTileRows;
      int64_t at = rows.begin - c0;
      for (int64_t p = 0; p < parts; ++p) {
        const int64_t tile_rows =
            rows.size() / parts + (p < rows.size() % parts ? 1 : 0);
        QueryTile tile;
        tile.begin = static_cast<int32_t>(at);
        tile.end = static_cast<int32_t>(at + tile_rows);
        tile.first_span = static_cast<int32_t>(list.spans.size());
        any |= AddSpans(group.runs, task.k.begin, at, at + tile_rows,
                        spec.causal, shift, list.spans);
        tile.span_count =
            static_cast<int32_t>(list.spans.size()) - tile.first_span;
        list.tiles.push_back(tile);
        at += tile_rows;
      }
    }
    if (!any) {
      list.tiles.resize(static_cast<size_t>(launch.first_tile));
      list.spans.resize(first_span);
      continue;
    }
    launch.tile_count =
        static_cast<int64_t>(list.tiles.size()) - launch.first_tile;
    list.launches.push_back(launch);
  }
}

}  // namespace ringattn
