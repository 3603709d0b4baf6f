#ifndef RINGATTN_WORKER_OUTPUT_DEALER_H_
#define RINGATTN_WORKER_OUTPUT_DEALER_H_

// OutputDealer: a computed shard's output rows, handed out one message's worth
// at a time to the streams that carry them back to the coordinator (the
// Execute stream and its attached ones, worker.proto). Each message's rows
// are claimed under a lock and copied outside it, so several streams fill
// messages in parallel. Messages are small at both ends of the output: the
// first is the smallest and each next one at most twice the last, none more
// than half of what is left. The coordinator forwards a message once it has
// all of it, so its hop to the client overlaps the worker's sending of the
// next, and the output's first and last bytes wait on small messages only.
// Thread-safe.

#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "core/range.h"
#include "core/tensor.h"
#include "core/typed_tensor.h"
#include "ringattn/v1/worker.pb.h"

namespace ringattn {

class OutputDealer {
 public:
  // `o` [B, n, Hq, D] and `lse` [B, n, Hq, 1] hold, for each batch entry, the
  // rows of `chunks` (positions in masking order) in that order. The first
  // message holds at most `first_message_bytes` of rows, each next one at
  // most twice the last and at most half of what is left (though
  // `first_message_bytes` of it), none more than `max_message_bytes`; each at
  // least one row, and none leaves less than half of `first_message_bytes` of
  // its chunk behind (it takes those rows too).
  // With `list_positions` (a Hilbert-ordered request) messages list each
  // row's position instead of the first.
  OutputDealer(TypedTensor o, Tensor<float> lse, std::vector<Range> chunks,
               bool list_positions, int64_t first_message_bytes,
               int64_t max_message_bytes);

  OutputDealer(const OutputDealer&) = delete;
  OutputDealer& operator=(const OutputDealer&) = delete;

  // Fills `out` with the next rows; false once every row was handed out.
  bool Next(v1::ShardOutput* out);

  // Whether rows remain to be handed out.
  bool HasMore();

  // Messages handed out so far.
  int64_t messages() const;

 private:
  // The rows of one message: batch entry, local row, first position, count.
  struct Claim {
    int64_t batch = 0;
    int64_t row = 0;
    int64_t position = 0;
    int64_t count = 0;
  };
  // Moves the cursor past chunks and batch entries whose rows were all
  // handed out; false once every row was.
  bool SkipDealt() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  const TypedTensor o_;
  const Tensor<float> lse_;
  const std::vector<Range> chunks_;
  const bool list_positions_;
  const int64_t row_bytes_;  // O's and the LSE's bytes of one row
  const int64_t first_message_bytes_;
  const int64_t max_message_bytes_;

  mutable absl::Mutex mutex_;
  int64_t batch_ ABSL_GUARDED_BY(mutex_) = 0;
  size_t chunk_ ABSL_GUARDED_BY(mutex_) = 0;
  int64_t chunk_row_ ABSL_GUARDED_BY(mutex_) = 0;  // local row of its begin
  int64_t offset_ ABSL_GUARDED_BY(mutex_) = 0;     // rows of it handed out
  int64_t messages_ ABSL_GUARDED_BY(mutex_) = 0;
  // The next message's most bytes before the half-of-what-is-left limit
  // (doubling from the first), and the rows not yet handed out.
  int64_t growth_bytes_ ABSL_GUARDED_BY(mutex_) = 0;
  int64_t rows_left_ ABSL_GUARDED_BY(mutex_) = 0;
};

}  // namespace ringattn

#endif  // RINGATTN_WORKER_OUTPUT_DEALER_H_
