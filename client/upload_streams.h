#ifndef RINGATTN_CLIENT_UPLOAD_STREAMS_H_
#define RINGATTN_CLIENT_UPLOAD_STREAMS_H_

// The upload of one Attend call over several streams (ClientOptions.
// upload_streams > 1): the chunks of one source shared out to whichever stream
// is ready for its next one (SharedChunks), and the AttachUpload streams, each
// on a thread of its own, that join the call with the ticket its initial
// metadata carries (AttachedUploads). The Attend stream itself sends chunks
// from the same SharedChunks as stream 0.

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
// Thread-safe.
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
  const Report report_;
  const int64_t total_bytes_;
  absl::Mutex mutex_;
  ChunkSource* const source_ ABSL_PT_GUARDED_BY(mutex_);
  int64_t bytes_done_ ABSL_GUARDED_BY(mutex_) = 0;
  // By stream: data bytes of the chunk it was handed last.
  std::vector<int64_t> in_flight_ ABSL_GUARDED_BY(mutex_);
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

// The AttachUpload streams of one Attend call, streams 1 to `streams` of a
// SharedChunks. Each runs on its own thread: it waits for the ticket, sends
// it and then chunks until none are left, and half-closes. Thread-safe.
class AttachedUploads {
 public:
  // Readies `context` for a call (deadline, credentials metadata).
  using Prepare = std::function<void(grpc::ClientContext*)>;

  // Starts the threads. `on_failure` runs (on one of them) when a stream
  // fails other than by the request's upload ending first (the coordinator
  // then ends the Attend call itself); it should cancel the Attend call,
  // which cannot finish without the stream.
  // Stream i (from 1) calls AttachUpload on stubs[i - 1]; `stubs` must
  // outlive this object.
  AttachedUploads(
      const std::vector<std::unique_ptr<v1::Attention::Stub>>& stubs,
      SharedChunks* chunks, const Prepare& prepare,
      std::function<void()> on_failure);
  // Cancels the streams still open and waits for the threads.
  ~AttachedUploads();

  AttachedUploads(const AttachedUploads&) = delete;
  AttachedUploads& operator=(const AttachedUploads&) = delete;

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
  // The status stream `stream` ends with, once it has a ticket.
  absl::Status Upload(int stream, const v1::UploadTicket& ticket);
  void CancelAll();

  const std::vector<std::unique_ptr<v1::Attention::Stub>>& stubs_;
  SharedChunks* const chunks_;
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

#endif  // RINGATTN_CLIENT_UPLOAD_STREAMS_H_
