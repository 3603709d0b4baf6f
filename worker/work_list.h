#ifndef RINGATTN_WORKER_WORK_LIST_H_
#define RINGATTN_WORKER_WORK_LIST_H_

// The work lists (kernels/cuda/attention_work_list.h) that run a ring task of
// a block-sparse spec as few launches of our flash kernel: per launch, query
// tiles of at most kWorkListTileRows rows and the key spans the mask's allowed
// block pairs give them, instead of one attention call and one LSE merge per
// allowed rectangle. Built on the host once per executor; plain values.

#include <cstdint>
#include <vector>

#include "core/attention_spec.h"
#include "core/block_mask.h"
#include "core/ring_plan.h"
#include "kernels/cuda/attention_work_list.h"

namespace ringattn {

// One launch over part of a WorkList: query rows [q_row, q_row + q_len) of the
// query block against key rows [k_row, k_row + kv_len) of the K/V block, with
// the tiles [first_tile, first_tile + tile_count) of the list, whose rows are
// relative to q_row and whose spans' keys are relative to k_row.
struct WorkListLaunch {
  int64_t q_row = 0;
  int64_t q_len = 0;
  int64_t k_row = 0;
  int64_t kv_len = 0;
  int64_t first_tile = 0;
  int64_t tile_count = 0;
};

// Tiles and spans of any number of launches (QueryTile::first_span indexes
// `spans` from its start), in host memory.
struct WorkList {
  std::vector<QueryTile> tiles;
  std::vector<KeySpan> spans;
  std::vector<WorkListLaunch> launches;
};

// Appends the launches of `task` (kBlockSparse, of `spec`, whose mask is
// `blocks`) to `list`: its query rows cut into launches of at most
// `most_launch_rows` rows, each launch's rows cut into tiles that never mix
// query blocks with different allowed key blocks (consecutive query blocks
// allowing the same ones share tiles), every row of a launch in exactly one
// tile (tiles of rows that see no key have no span, so that the launch's
// output rows are all defined), and each tile's spans the runs of consecutive
// allowed key blocks; with spec.causal, spans get the bottom-right aligned
// mask's shift, lose the keys no row of the tile sees, and are marked causal
// only where the diagonal crosses them. Every visible (query, key) pair lies
// in exactly one span of one tile; launches without one are left out.
// Requires most_launch_rows >= 1.
void AddBlockSparseLaunches(const AttentionSpec& spec, const BlockMask& blocks,
                            const AttentionTask& task, int64_t most_launch_rows,
                            WorkList& list);

}  // namespace ringattn

#endif  // RINGATTN_WORKER_WORK_LIST_H_
