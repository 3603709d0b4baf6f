#ifndef RINGATTN_SERVER_SHARED_UPLOAD_H_
#define RINGATTN_SERVER_SHARED_UPLOAD_H_

// SharedUpload: the intake of one Attend request whose chunks arrive over
// several streams, its own and the AttachUpload streams that present its
// ticket, so that parsing them runs on several threads. Every chunk, from
// whichever stream, goes through the request's one routing function under one
// lock, so the request's row-coverage check sees all of them in turn. The first
// failure, from any stream, is kept: it cancels the attached streams still
// open, and the request's own stream ends with it at its next chunk or once it
// has half-closed. Thread-safe.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "ringattn/v1/attention.pb.h"

namespace ringattn {

// Most streams one request's chunks may arrive over (its own included).
inline constexpr int kMostUploadStreams = 64;
// Initial metadata keys of the ticket for attached upload streams.
inline constexpr char kRequestIdKey[] = "ringattn-request-id";
inline constexpr char kUploadTokenKey[] = "ringattn-upload-token";

// 128 random bits as hex: an upload token no other client can guess.
std::string NewUploadToken();

// OK if a header's `field` (upload_streams or download_streams) asks for
// `streams` in [0, kMostUploadStreams]; INVALID_ARGUMENT naming it otherwise.
absl::Status CheckStreamCount(absl::string_view field, int streams);

class SharedUpload {
 public:
  // Routes one chunk, message `index` of its stream (its data may be moved
  // away); called under the lock, never after Close.
  using Route =
      std::function<absl::Status(v1::TensorChunk& chunk, int64_t index)>;

  // The upload of the request `request_id` served on `main`, which `token`
  // lets `attached_streams` more streams join until `attach_deadline`.
  SharedUpload(std::string request_id, std::string token, int attached_streams,
               absl::Time attach_deadline, grpc::ServerContext* main,
               Route route);

  SharedUpload(const SharedUpload&) = delete;
  SharedUpload& operator=(const SharedUpload&) = delete;

  const std::string& request_id() const { return request_id_; }
  const std::string& token() const { return token_; }

  // Admits one attached stream served on `context`; returns its number, from
  // 1. PERMISSION_DENIED for a wrong token; FAILED_PRECONDITION once every
  // announced stream has attached or the upload is over.
  absl::StatusOr<int> Attach(absl::string_view token,
                             grpc::ServerContext* context);

  // Routes `chunk`, message `index` of stream `stream` (0: the request's own,
  // else an attached stream's number): the route's status (StreamError's for
  // an attached stream), or the failure that already ended the upload.
  absl::Status Take(int stream, v1::TensorChunk& chunk, int64_t index);

  // Attached stream `stream` ended: with OK when its client half-closed,
  // otherwise with the status that fails the upload (unless one already
  // did).
  void Detach(int stream, const absl::Status& status);

  // Waits until every announced stream has attached and detached. Returns the
  // failure that ended the upload, CANCELLED when the request's call is
  // cancelled, or DEADLINE_EXCEEDED when not every stream has attached by the
  // attach deadline.
  absl::Status AwaitAttachedStreams();

  // Ends the upload: once it returns no chunk is routed, nothing touches the
  // request's call, and the attached streams still open are cancelled.
  void Close();

  // `status` with the attached stream `stream` and the request named, as
  // an attached stream's errors read.
  absl::Status StreamError(int stream, const absl::Status& status) const;

 private:
  // Keeps `status`, from stream `stream`, as the upload's failure if it is the
  // first, and cancels the other attached streams.
  void Fail(int stream, const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  const std::string request_id_;
  const std::string token_;
  const int attached_streams_;
  const absl::Time attach_deadline_;
  const Route route_;

  absl::Mutex mutex_;
  grpc::ServerContext* main_ ABSL_GUARDED_BY(mutex_);  // null once closed
  // By stream number - 1: the stream's call while it is open, else null.
  std::vector<grpc::ServerContext*> open_ ABSL_GUARDED_BY(mutex_);
  int detached_ ABSL_GUARDED_BY(mutex_) = 0;
  absl::Status failure_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace ringattn

#endif  // RINGATTN_SERVER_SHARED_UPLOAD_H_
