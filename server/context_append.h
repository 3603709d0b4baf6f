#ifndef RINGATTN_SERVER_CONTEXT_APPEND_H_
#define RINGATTN_SERVER_CONTEXT_APPEND_H_

// ContextAppend: stores new K/V tokens of a resident context on its workers.
// A few new tokens extend the run of the worker holding the context's end,
// while it stays within kAppendSlackPositions of an even share; otherwise they
// are cut into one run per worker so every worker stays within one token of
// an even share. Each chunk's rows stream straight to the worker
// that keeps them (a small append's rows travel with the header, in one
// message per worker sent by EndWrites; a large part of a worker goes round
// that worker's row channels, RowStream, each on a connection of its own),
// and a worker keeps its part only once all of it arrived.
// Used by CreateContext and AppendContext, and by a Query that appends the rows
// it attends to (a decode step); a small Query's rows skip the StoreContext
// streams and ride in the query's own Execute messages instead
// (AppendDelivery::kWithQuery). Not thread-safe.

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "core/dtype.h"
#include "ringattn/v1/worker.pb.h"
#include "server/cluster.h"
#include "server/context_registry.h"
#include "server/row_coverage.h"
#include "server/row_stream.h"

namespace ringattn {

// How far above an even share appends may fill one worker before they move
// on to the others (BalancedRuns' slack).
inline constexpr int64_t kAppendSlackPositions = 4096;

// How the new rows reach the workers that keep them.
enum class AppendDelivery {
  kOwnStreams,  // a StoreContext stream per worker
  kWithQuery,   // in the Execute header of the query that appends them
};

class ContextAppend {
 public:
  // Opens a StoreContext stream for `count` tokens after `before` to every
  // member (a new context when `create`), or for an append only to those
  // that get some of them, and AttachRows streams on the row channels of
  // each worker that gets at least `row_streams_min_bytes`; with
  // kWithQuery (an append only) it opens none and collects each worker's
  // rows for TakeRowsFor. `before` must have one entry per member in chunks,
  // addresses, worker_bytes and worker_dtypes.
  static absl::StatusOr<std::unique_ptr<ContextAppend>> Start(
      const std::vector<Cluster::Member>& members,
      const ResidentContext& before, bool create, int64_t count,
      DType wire_dtype, std::chrono::system_clock::time_point deadline,
      int64_t row_streams_min_bytes,
      AppendDelivery delivery = AppendDelivery::kOwnStreams);
  // Cancels streams that did not finish.
  ~ContextAppend();

  ContextAppend(const ContextAppend&) = delete;
  ContextAppend& operator=(const ContextAppend&) = delete;

  // Routes one K or V chunk; its offsets count from the first new token. Its
  // data may be moved away (to the one worker that takes all of it).
  // INVALID_ARGUMENT naming the problem; a worker's failure as WorkerError
  // says.
  absl::Status Route(v1::TensorChunk& chunk, int64_t index);
  // INVALID_ARGUMENT naming the first missing rows, if any.
  absl::Status CheckComplete() const;
  // Tells the workers every row was sent; they store their parts meanwhile.
  void EndWrites();
  // Closes the streams (EndWrites first if not done); OK once every worker
  // stored its part.
  absl::Status Finish();

  // kWithQuery, once every row was routed: the header carrying the new rows
  // of worker `rank` (for its ExecuteHeader.append), or none if it gets none.
  std::optional<v1::StoreContextHeader> TakeRowsFor(int rank);
  // kWithQuery, once the query succeeded: OK when every worker given rows
  // reported storing them (`done` by rank: ExecuteDone.context_bytes).
  absl::Status FinishWithQuery(const std::vector<v1::ExecuteDone>& done);
  bool with_query() const { return delivery_ == AppendDelivery::kWithQuery; }
  // How many AttachRows streams Start opened, over all workers.
  int row_streams() const;

  // The context as it will stand: its length and layout from Start on, its
  // bytes once Finish succeeded.
  const ResidentContext& after() const { return after_; }

 private:
  struct Link;
  ContextAppend(ResidentContext before, int64_t count, DType wire_dtype,
                AppendDelivery delivery);
  absl::Status WorkerError(const Link& link, const grpc::Status& status);
  // The error of `link`'s row stream `row`, which broke: the StoreContext
  // stream's if the worker refused the stream because that one had ended.
  absl::Status RowStreamError(Link& link, RowStream& row);
  // Sends `link`'s row streams' last rows and waits until the worker says it
  // stored them.
  absl::Status EndRowStreams(Link& link);
  // The context's bytes from what each worker given rows now holds, in
  // `dtypes` (by link, as `held`).
  void CountHoldings(const std::vector<int64_t>& held,
                     const std::vector<v1::DType>& dtypes);

  const ResidentContext before_;
  const int64_t count_;
  const DType dtype_;
  const AppendDelivery delivery_;
  std::vector<Range> runs_;  // new positions per rank
  std::vector<std::unique_ptr<Link>> links_;
  std::vector<RowCoverage> coverage_;  // K batches, then V batches
  ResidentContext after_;
  bool writes_ended_ = false;
  bool finished_ = false;
};

}  // namespace ringattn

#endif  // RINGATTN_SERVER_CONTEXT_APPEND_H_
