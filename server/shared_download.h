#ifndef RINGATTN_SERVER_SHARED_DOWNLOAD_H_
#define RINGATTN_SERVER_SHARED_DOWNLOAD_H_

// SharedDownload: the output of one Attend request whose header set
// download_streams > 1, dealt over the request's own stream and the
// AttachDownload streams that present its ticket, so that serializing and
// sending it run on several threads and connections. Chunks go round the
// streams whole, in turn; each attached stream writes its own queue on its
// handler's thread. The first failure, from any side, ends every attached
// stream and fails the request. Thread-safe.

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/support/sync_stream.h"
#include "ringattn/v1/attention.pb.h"

namespace ringattn {

class SharedDownload {
 public:
  // The output of request `request_id` served on `main`, which `token` lets
  // `attached_streams` more streams join until `attach_deadline`.
  SharedDownload(std::string request_id, std::string token,
                 int attached_streams, absl::Time attach_deadline,
                 grpc::ServerContext* main);

  SharedDownload(const SharedDownload&) = delete;
  SharedDownload& operator=(const SharedDownload&) = delete;

  const std::string& request_id() const { return request_id_; }

  // An AttachDownload call on `context`: joins as the next attached stream
  // and writes what is dealt to it until the output is all out (OK) or the
  // request fails (its failure). PERMISSION_DENIED for a wrong token,
  // FAILED_PRECONDITION beyond the announced streams.
  absl::Status Serve(absl::string_view token, grpc::ServerContext* context,
                     grpc::ServerWriterInterface<v1::AttendResponse>* writer);

  // Deals `response` to the next stream in turn: false if that is the
  // request's own stream (the caller writes it), true if it was queued for
  // an attached one (then it is moved away). Waits while that stream's queue
  // is full. The failure that ended the download, DEADLINE_EXCEEDED if the
  // stream never attached in time, CANCELLED if the client went away.
  absl::StatusOr<bool> Deal(v1::AttendResponse& response);

  // No more output: waits until every attached stream has written its queue
  // and ended. OK, or the failure that ended the download.
  absl::Status Finish();

  // Ends the download with `status` (the request failed): attached streams
  // stop and end with it.
  void Fail(absl::Status status);

 private:
  struct Queued {
    v1::AttendResponse response;
    int64_t bytes = 0;
  };
  struct Lane {
    std::deque<Queued> queue;
    int64_t queued_bytes = 0;
    bool attached = false;
    bool ended = false;  // its Serve returned
  };

  // Waits for `ready` (under the lock) until `deadline`, waking now and then
  // to notice the request's client going away: false if the deadline passed
  // or the client went; `failure_` is set then.
  bool AwaitOrFail(const absl::Condition& ready, absl::Time deadline,
                   absl::string_view waiting_for)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void FailLocked(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  const std::string request_id_;
  const std::string token_;
  const absl::Time attach_deadline_;
  grpc::ServerContext* const main_;
  absl::Mutex mutex_;
  std::vector<Lane> lanes_ ABSL_GUARDED_BY(mutex_);  // by attached stream - 1
  int attached_ ABSL_GUARDED_BY(mutex_) = 0;
  size_t next_turn_ ABSL_GUARDED_BY(mutex_) = 0;   // 0: the request's own
  bool finished_ ABSL_GUARDED_BY(mutex_) = false;  // no more output
  absl::Status failure_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace ringattn

#endif  // RINGATTN_SERVER_SHARED_DOWNLOAD_H_
