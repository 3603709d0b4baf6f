#ifndef RINGATTN_CLIENT_ATTACHED_STREAMS_H_
#define RINGATTN_CLIENT_ATTACHED_STREAMS_H_

// One Attend call over several streams: the streams, each on a thread of its
// own, that join the call with the ticket its initial metadata carries
// (AttachedStreams), uploading (ClientOptions.upload_streams > 1: the chunks
// of one source shared out to whichever stream is ready for its next one,
// SharedChunks, of which the Attend stream itself sends as stream 0) or
// downloading (ClientOptions.download_streams > 1: the output chunks the
// coordinator deals to each, into the call's own intake).

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "client/chunking.h"
#include "grpcpp/grpcpp.h"
#include "ringattn/v1/attention.grpc.pb.h"

namespace ringattn {

// Hands out the chunks of one source to `streams` streams, one chunk at a
// time, and reports the upload's progress over all of them: bytes of the
// chunks whose stream has since asked for another (so they were written).
// A source that makes chunks on demand (ChunkSource::chunk_count) is cut into
// one run of chunks per stream, each stream filling its own outside the lock
// and taking over the rest of the longest other run once its own is out;
// other sources hand out their chunks in order under the lock. Thread-safe.
class SharedChunks {
 public:
  // Called with (bytes done, bytes in all); may be empty.
  using Report = std::function<void(int64_t, int64_t)>;

  SharedChunks(ChunkSource* source, int streams, Report report);

  SharedChunks(const SharedChunks&) = delete;
  SharedChunks& operator=(const SharedChunks&) = delete;

  // Fills `chunk` with the next chunk for stream `stream` (in [0, streams));
  // false once every chunk has been handed out.
  bool Next(int stream, v1::TensorChunk* chunk);
  int64_t total_bytes() const { return total_bytes_; }

 private:
  // Chunks [next, end) of the source, not yet handed out.
  struct Run {
    int64_t next = 0;
    int64_t end = 0;
  };
  // The chunk stream `stream` fills next: its run's next, else the last of
  // the longest other run; -1 once none is left.
  int64_t TakeIndex(int stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Counts the chunk stream `stream` was handed last as written.
  void Written(int stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  const Report report_;
  const int64_t total_bytes_;
  ChunkSource* const source_;
  const bool indexed_;  // the source makes chunks on demand
  absl::Mutex mutex_;
  int64_t bytes_done_ ABSL_GUARDED_BY(mutex_) = 0;
  // By stream: data bytes of the chunk it was handed last.
  std::vector<int64_t> in_flight_ ABSL_GUARDED_BY(mutex_);
  std::vector<Run> runs_ ABSL_GUARDED_BY(mutex_);  // by stream, if indexed_
};

// The chunks one stream of a SharedChunks sends, as a ChunkSource.
class SharedChunkStream : public ChunkSource {
 public:
  SharedChunkStream(SharedChunks* chunks, int stream)
      : chunks_(chunks), stream_(stream) {}
  bool Next(v1::TensorChunk* chunk) override {
    return chunks_->Next(stream_, chunk);
  }
  int64_t total_bytes() const override { return chunks_->total_bytes(); }

 private:
  SharedChunks* const chunks_;
  const int stream_;
};

// The attached streams of one Attend call, numbered from 1. Each runs on its
// own thread: it waits for the ticket, then does its Work. Thread-safe.
class AttachedStreams {
 public:
  // Readies `context` for a call (deadline, credentials metadata).
  using Prepare = std::function<void(grpc::ClientContext*)>;
  // What stream `stream` does with the ticket, calling `stub` on `context`;
  // the status it ends with.
  using Work = std::function<absl::Status(int stream, v1::Attention::Stub& stub,
                                          grpc::ClientContext* context,
                                          const v1::UploadTicket& ticket)>;

  // Starts `streams` threads; stream i (from 1) works on stubs[i - 1], and
  // `stubs` must outlive this object. `kind` names them in errors ("upload",
  // "download"). `on_failure` runs (on one of them) when a stream fails
  // other than by the request ending first (the coordinator then ends the
  // Attend call itself); it should cancel the Attend call, which cannot
  // finish without the stream.
  AttachedStreams(
      const std::vector<std::unique_ptr<v1::Attention::Stub>>& stubs,
      int streams, const char* kind, const Prepare& prepare, Work work,
      std::function<void()> on_failure);
  // Cancels the streams still open and waits for the threads.
  ~AttachedStreams();

  AttachedStreams(const AttachedStreams&) = delete;
  AttachedStreams& operator=(const AttachedStreams&) = delete;

  // Stream `stream`'s Work for an upload: sends the ticket, then chunks of
  // `chunks` (as its stream `stream`) until none are left, and half-closes.
  static Work Upload(SharedChunks* chunks);
  // Stream `stream`'s Work for a download: passes every response it reads
  // to `take`, whose error ends the stream.
  static Work Download(
      std::function<absl::Status(const v1::AttendResponse&)> take);

  // The Attend call's initial metadata arrived; the ticket in it sets the
  // streams going (they fail if it holds none).
  void TakeTicket(
      const std::multimap<grpc::string_ref, grpc::string_ref>& metadata);

  // Once the Attend call has ended with `status`: cancels the streams still
  // open unless it succeeded, waits for them, and returns the status the
  // request ends with. A stream's own error explains a call that ended as
  // CANCELLED (a failed stream cancels it), so it comes first then, unless
  // it only ended with the upload (which the call's own status explains); a
  // missing ticket comes before everything.
  absl::Status Finish(const absl::Status& status);

 private:
  // Stream `stream`'s thread.
  void Run(int stream);
  void CancelAll();

  const std::vector<std::unique_ptr<v1::Attention::Stub>>& stubs_;
  const char* const kind_;
  const Work work_;
  const std::function<void()> on_failure_;
  // By stream - 1; made up front so that cancelling never races a start.
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts_;
  absl::Mutex mutex_;
  // Set once the metadata arrived or the call ended.
  std::optional<absl::StatusOr<v1::UploadTicket>> ticket_
      ABSL_GUARDED_BY(mutex_);
  std::vector<absl::Status> statuses_ ABSL_GUARDED_BY(mutex_);  // by stream-1
  std::vector<std::thread> threads_;
};

}  // namespace ringattn

#endif  // RINGATTN_CLIENT_ATTACHED_STREAMS_H_
