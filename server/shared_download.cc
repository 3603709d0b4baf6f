#include "server/shared_download.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace ringattn {
namespace {

// Bytes of output waiting for one attached stream, at most.
constexpr int64_t kMostQueuedBytes = int64_t{16} << 20;
// How often waits look at whether the client went away.
constexpr absl::Duration kCancellationCheckInterval = absl::Milliseconds(200);

}  // namespace

SharedDownload::SharedDownload(std::string request_id, std::string token,
                               int attached_streams, absl::Time attach_deadline,
                               grpc::ServerContext* main)
    : request_id_(std::move(request_id)),
      token_(std::move(token)),
      attach_deadline_(attach_deadline),
      main_(main),
      lanes_(static_cast<size_t>(attached_streams)) {}

bool SharedDownload::AwaitOrFail(const absl::Condition& ready,
                                 absl::Time deadline,
                                 absl::string_view waiting_for) {
  for (;;) {
    const absl::Time wake =
        std::min(deadline, absl::Now() + kCancellationCheckInterval);
    if (mutex_.AwaitWithDeadline(ready, wake)) return failure_.ok();
    if (!failure_.ok()) return false;
    if (main_->IsCancelled()) {
      FailLocked(absl::CancelledError(
          "the client went away while the output streamed"));
      return false;
    }
    if (absl::Now() >= deadline) {
      FailLocked(absl::DeadlineExceededError(absl::StrCat(
          "only ", attached_, " of the ", lanes_.size(),
          " attached download streams the header announced (download_streams "
          "= ",
          lanes_.size() + 1, ") arrived in time (--ring_timeout) while ",
          waiting_for,
          "; attach them with the ticket from the call's initial "
          "metadata")));
      return false;
    }
  }
}

void SharedDownload::FailLocked(absl::Status status) {
  if (failure_.ok()) failure_ = std::move(status);
  for (Lane& lane : lanes_) {
    lane.queue.clear();
    lane.queued_bytes = 0;
  }
}

absl::Status SharedDownload::Serve(
    absl::string_view token, grpc::ServerContext* context,
    grpc::ServerWriterInterface<v1::AttendResponse>* writer) {
  Lane* lane = nullptr;
  {
    absl::MutexLock lock(&mutex_);
    if (token != token_) {
      return absl::PermissionDeniedError(
          absl::StrCat("wrong token for request '", request_id_,
                       "': present the one from its call's "
                       "initial metadata"));
    }
    if (attached_ == static_cast<int>(lanes_.size())) {
      return absl::FailedPreconditionError(absl::StrCat(
          "request '", request_id_, "' takes no more download streams: all ",
          lanes_.size(), " its header announced have attached"));
    }
    if (!failure_.ok()) return failure_;
    lane = &lanes_[static_cast<size_t>(attached_++)];
    lane->attached = true;
  }
  absl::Status ended;
  for (;;) {
    v1::AttendResponse response;
    {
      absl::MutexLock lock(&mutex_);
      auto ready = [this, lane]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
        return !lane->queue.empty() || finished_ || !failure_.ok();
      };
      while (!mutex_.AwaitWithTimeout(absl::Condition(&ready),
                                      kCancellationCheckInterval)) {
        if (context->IsCancelled()) {
          FailLocked(absl::CancelledError(
              "an attached download stream was cancelled or broke"));
        }
      }
      if (!failure_.ok() || lane->queue.empty()) {
        ended = failure_;
        lane->ended = true;
        break;
      }
      Queued& next = lane->queue.front();
      response = std::move(next.response);
      lane->queued_bytes -= next.bytes;
      lane->queue.pop_front();
    }
    if (!writer->Write(response)) {
      absl::MutexLock lock(&mutex_);
      FailLocked(absl::UnavailableError(
          "an attached download stream broke while the output streamed"));
      ended = failure_;
      lane->ended = true;
      break;
    }
  }
  return ended;
}

absl::StatusOr<bool> SharedDownload::Deal(v1::AttendResponse& response) {
  absl::MutexLock lock(&mutex_);
  if (!failure_.ok()) return failure_;
  const size_t turn = next_turn_;
  next_turn_ = (next_turn_ + 1) % (lanes_.size() + 1);
  if (turn == 0) return false;
  Lane& lane = lanes_[turn - 1];
  const int64_t bytes = static_cast<int64_t>(response.ByteSizeLong());
  // One response always fits an empty queue, so that nothing waits forever.
  auto room = [this, &lane, bytes]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    return !failure_.ok() || lane.queued_bytes == 0 ||
           lane.queued_bytes + bytes <= kMostQueuedBytes;
  };
  if (!AwaitOrFail(absl::Condition(&room),
                   lane.attached ? absl::InfiniteFuture() : attach_deadline_,
                   "output waited for them")) {
    return failure_;
  }
  lane.queue.push_back(Queued{std::move(response), bytes});
  lane.queued_bytes += bytes;
  return true;
}

absl::Status SharedDownload::Finish() {
  absl::MutexLock lock(&mutex_);
  finished_ = true;
  auto all_ended = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    if (!failure_.ok()) return true;
    for (const Lane& lane : lanes_) {
      if (!lane.ended) return false;
    }
    return true;
  };
  const bool all_attached = attached_ == static_cast<int>(lanes_.size());
  AwaitOrFail(absl::Condition(&all_ended),
              all_attached ? absl::InfiniteFuture() : attach_deadline_,
              "the output ended");
  return failure_;
}

void SharedDownload::Fail(absl::Status status) {
  absl::MutexLock lock(&mutex_);
  FailLocked(std::move(status));
}

}  // namespace ringattn
