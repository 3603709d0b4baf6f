#ifndef RINGATTN_SERVER_ROW_STREAM_H_
#define RINGATTN_SERVER_ROW_STREAM_H_

// RowStream: an AttachRows stream to one worker (worker.proto) that carries
// more rows of a large upload, of an Execute stream's shard or of a
// StoreContext stream's context piece, on a connection of its own
// (Cluster::Member::row_stubs), written on a thread of its own. Once its rows
// are stored it brings part of the Execute stream's output back, or ends as
// the StoreContext stream does.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "grpcpp/grpcpp.h"
#include "ringattn/v1/worker.grpc.pb.h"
#include "server/worker_writer.h"

namespace ringattn {

// The initial metadata that names an AttachRows stream's Execute or
// StoreContext stream by its header's rows_key.
inline constexpr char kRowsKeyMetadata[] = "ringattn-rows-key";

// Rows waiting to be written to one worker, at most, shared among the streams
// that carry them.
inline constexpr int64_t kMaxQueuedBytesPerWorker = int64_t{64} << 20;

struct RowStream {
  // Opens the stream to `stub` for the stream whose header names `key`; the
  // worker holds it until that header arrives.
  RowStream(v1::Worker::Stub& stub, const std::string& key,
            std::chrono::system_clock::time_point deadline,
            int64_t max_queued_bytes);

  // Writes what is queued and closes the writing side; false if the stream
  // broke (its Finish says why). The worker then answers rows_stored.
  bool EndRows();

  grpc::ClientContext context;
  std::unique_ptr<
      grpc::ClientReaderWriter<v1::ExecuteRequest, v1::ExecuteResponse>>
      stream;
  std::unique_ptr<WorkerWriter> writer;  // destroyed before the stream
};

// A RowStream to each of `stubs` (one worker's row channels) for the stream
// whose header names `key`, each queueing at most `max_queued_bytes`.
std::vector<std::unique_ptr<RowStream>> OpenRowStreams(
    const std::vector<std::shared_ptr<v1::Worker::Stub>>& stubs,
    const std::string& key, std::chrono::system_clock::time_point deadline,
    int64_t max_queued_bytes);

}  // namespace ringattn

#endif  // RINGATTN_SERVER_ROW_STREAM_H_
