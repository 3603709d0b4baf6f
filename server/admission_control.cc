#include "server/admission_control.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace ringattn {

AdmissionControl::Ticket::Ticket(Ticket&& other) noexcept
    : owner_(std::exchange(other.owner_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)) {}

AdmissionControl::Ticket& AdmissionControl::Ticket::operator=(
    Ticket&& other) noexcept {
  std::swap(owner_, other.owner_);
  std::swap(bytes_, other.bytes_);
  return *this;
}

AdmissionControl::Ticket::~Ticket() {
  if (owner_ != nullptr) owner_->Release(bytes_);
}

absl::StatusOr<AdmissionControl::Ticket> AdmissionControl::Admit(
    int64_t bytes, absl::Time deadline) {
  if (bytes > budget_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the request needs ", bytes,
                     " bytes in flight but the coordinator's "
                     "budget is ",
                     budget_,
                     " bytes (--max_inflight_bytes); send a smaller "
                     "request or raise the limit"));
  }
  absl::MutexLock lock(&mutex_);
  const uint64_t number = next_number_++;
  line_.push_back(number);
  auto turn = [&]() {
    return line_.front() == number && in_use_ + bytes <= budget_ &&
           running_ < max_requests_;
  };
  const bool admitted =
      mutex_.AwaitWithDeadline(absl::Condition(&turn), deadline);
  line_.remove(number);
  if (!admitted) {
    return absl::DeadlineExceededError(
        "the request's deadline passed while it waited for earlier requests to "
        "finish (the cluster is busy)");
  }
  in_use_ += bytes;
  ++running_;
  return Ticket(this, bytes);
}

void AdmissionControl::Release(int64_t bytes) {
  absl::MutexLock lock(&mutex_);
  in_use_ -= bytes;
  --running_;
}

int64_t AdmissionControl::in_use() {
  absl::MutexLock lock(&mutex_);
  return in_use_;
}

int64_t AdmissionControl::waiting() {
  absl::MutexLock lock(&mutex_);
  return static_cast<int64_t>(line_.size());
}

}  // namespace ringattn
