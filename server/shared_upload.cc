#include "server/shared_upload.h"

#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ringattn {
namespace {

// Whether `a` equals `b`, in time that does not depend on where they differ.
bool SameToken(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char difference = 0;
  for (size_t i = 0; i < a.size(); ++i) difference |= a[i] ^ b[i];
  return difference == 0;
}

// How often a wait for attached streams looks at whether the request's call
// was cancelled (gRPC signals cancellation only to those who ask).
constexpr absl::Duration kCancellationCheckInterval = absl::Milliseconds(200);

}  // namespace

std::string NewUploadToken() {
  std::random_device random;
  std::string token;
  for (int i = 0; i < 4; ++i) absl::StrAppendFormat(&token, "%08x", random());
  return token;
}

absl::Status CheckStreamCount(absl::string_view field, int streams) {
  if (streams >= 0 && streams <= kMostUploadStreams) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("field '", field, "' must be in [0, ", kMostUploadStreams,
                   "], got ", streams));
}

SharedUpload::SharedUpload(std::string request_id, std::string token,
                           int attached_streams, absl::Time attach_deadline,
                           grpc::ServerContext* main, Route route)
    : request_id_(std::move(request_id)),
      token_(std::move(token)),
      attached_streams_(attached_streams),
      attach_deadline_(attach_deadline),
      route_(std::move(route)),
      main_(main) {}

absl::StatusOr<int> SharedUpload::Attach(absl::string_view token,
                                         grpc::ServerContext* context) {
  if (!SameToken(token, token_)) {
    return absl::PermissionDeniedError(
        absl::StrCat("the upload token for request '", request_id_,
                     "' is wrong: present the token from that call's initial "
                     "metadata (ringattn-upload-token)"));
  }
  absl::MutexLock lock(&mutex_);
  if (main_ == nullptr || !failure_.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("request '", request_id_,
                     "' no longer takes chunks: its upload has ended"));
  }
  if (static_cast<int>(open_.size()) == attached_streams_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "request '", request_id_, "' announced ", attached_streams_ + 1,
        " upload streams (its own and ", attached_streams_,
        " attached) and all have attached; raise upload_streams in its "
        "header to attach more"));
  }
  open_.push_back(context);
  return static_cast<int>(open_.size());
}

absl::Status SharedUpload::Take(int stream, v1::TensorChunk& chunk,
                                int64_t index) {
  absl::MutexLock lock(&mutex_);
  if (!failure_.ok()) return failure_;
  if (main_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("request '", request_id_,
                     "' no longer takes chunks: its upload has ended"));
  }
  absl::Status routed = route_(chunk, index);
  if (routed.ok()) return routed;
  if (stream != 0) routed = StreamError(stream, routed);
  Fail(stream, routed);
  return routed;
}

void SharedUpload::Detach(int stream, const absl::Status& status) {
  absl::MutexLock lock(&mutex_);
  open_[stream - 1] = nullptr;
  ++detached_;
  if (!status.ok()) Fail(stream, status);
}

absl::Status SharedUpload::AwaitAttachedStreams() {
  absl::MutexLock lock(&mutex_);
  auto all_detached = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return detached_ == attached_streams_ || !failure_.ok();
  };
  while (!mutex_.AwaitWithTimeout(absl::Condition(&all_detached),
                                  kCancellationCheckInterval)) {
    if (main_->IsCancelled()) {
      return absl::CancelledError(
          "the client cancelled or went away during upload");
    }
    const int attached = static_cast<int>(open_.size());
    if (attached < attached_streams_ && absl::Now() >= attach_deadline_) {
      const absl::Status late = absl::DeadlineExceededError(absl::StrCat(
          "only ", attached, " of the ", attached_streams_,
          " attached upload streams the header announced (upload_streams = ",
          attached_streams_ + 1,
          ") arrived in time (--ring_timeout); attach them with the ticket "
          "from the call's initial metadata"));
      Fail(0, late);
      return late;
    }
  }
  return failure_;
}

void SharedUpload::Close() {
  absl::MutexLock lock(&mutex_);
  main_ = nullptr;
  for (grpc::ServerContext* context : open_) {
    if (context != nullptr) context->TryCancel();
  }
}

void SharedUpload::Fail(int stream, const absl::Status& status) {
  if (!failure_.ok()) return;
  failure_ = status;
  for (size_t i = 0; i < open_.size(); ++i) {
    if (open_[i] != nullptr && static_cast<int>(i) + 1 != stream) {
      open_[i]->TryCancel();
    }
  }
}

absl::Status SharedUpload::StreamError(int stream,
                                       const absl::Status& status) const {
  return absl::Status(
      status.code(),
      absl::StrCat("attached upload stream ", stream, " of request '",
                   request_id_, "': ", status.message()));
}

}  // namespace ringattn
