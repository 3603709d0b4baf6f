#ifndef RINGATTN_CORE_SHARD_LAYOUT_H_
#define RINGATTN_CORE_SHARD_LAYOUT_H_

// ShardLayout: which sequence positions each of p workers holds. Contiguous
// layouts give worker i one run of about N/p positions; zigzag layouts cut the
// sequence into 2p chunks and give worker i chunks i and 2p-1-i, so causal work
// is the same on every worker (one run where p = 1). Chunk sizes differ by at
// most one; any N >= 1 and p >= 1 work (workers may be empty). Immutable; safe
// to share between threads.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "core/range.h"

namespace ringattn {

enum class ShardKind {
  kContiguous,
  kZigzag,
  kExplicit,  // chunks given by the caller (a resident context's appended
              // pieces)
};

class ShardLayout {
 public:
  // kContiguous or kZigzag over `workers` workers.
  static ShardLayout Make(ShardKind kind, int64_t seq_len, int64_t workers);
  // Worker i holds chunks[i], in that row order. The chunks must partition
  // [0, seq_len) (see Validate).
  static ShardLayout FromChunks(int64_t seq_len,
                                std::vector<std::vector<Range>> chunks);
  // OK if the chunks partition [0, seq_len); INVALID_ARGUMENT naming the first
  // position held twice or not at all otherwise.
  absl::Status Validate() const;

  ShardKind kind() const { return kind_; }
  int64_t seq_len() const { return seq_len_; }
  int64_t num_workers() const { return static_cast<int64_t>(chunks_.size()); }

  // The position ranges worker `worker` holds, in the order its local rows
  // store them.
  const std::vector<Range>& Chunks(int64_t worker) const {
    return chunks_[worker];
  }
  // How many positions worker `worker` holds.
  int64_t ShardLength(int64_t worker) const;
  // The most positions any worker holds.
  int64_t LargestShard() const;
  // The local row of `position` on the worker that holds it, and that worker.
  struct Location {
    int64_t worker;
    int64_t row;
  };
  Location Locate(int64_t position) const;

 private:
  ShardKind kind_ = ShardKind::kContiguous;
  int64_t seq_len_ = 0;
  std::vector<std::vector<Range>> chunks_;
};

// [0, n) cut into `parts` runs whose sizes differ by at most one (larger ones
// first).
std::vector<Range> SplitEvenly(int64_t n, int64_t parts);

}  // namespace ringattn

#endif  // RINGATTN_CORE_SHARD_LAYOUT_H_
