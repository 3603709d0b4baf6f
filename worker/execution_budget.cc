#include "worker/execution_budget.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace ringattn {

ExecutionBudget::Ticket::Ticket(Ticket&& other) noexcept
    : budget_(std::exchange(other.budget_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)) {}

ExecutionBudget::Ticket& ExecutionBudget::Ticket::operator=(
    Ticket&& other) noexcept {
  if (this != &other) {
    Return();
    budget_ = std::exchange(other.budget_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

ExecutionBudget::Ticket::~Ticket() { Return(); }

void ExecutionBudget::Ticket::Return() {
  if (budget_ == nullptr) return;
  absl::MutexLock lock(&budget_->mutex_);
  --budget_->executions_;
  budget_->reserved_bytes_ -= bytes_;
  budget_ = nullptr;
  bytes_ = 0;
}

absl::Status ExecutionBudget::Ticket::Reserve(int64_t bytes) {
  if (budget_ == nullptr) {
    return absl::FailedPreconditionError("the ticket was not admitted");
  }
  absl::MutexLock lock(&budget_->mutex_);
  const int64_t free = budget_->memory_bytes_ - budget_->reserved_bytes_;
  if (bytes > free) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the request needs ", bytes, " bytes on this worker but only ", free,
        " of its ", budget_->memory_bytes_,
        " are free; use more workers or retry later"));
  }
  budget_->reserved_bytes_ += bytes;
  bytes_ += bytes;
  return absl::OkStatus();
}

ExecutionBudget::ExecutionBudget(int max_executions, int64_t memory_bytes)
    : max_executions_(max_executions), memory_bytes_(memory_bytes) {}

absl::StatusOr<ExecutionBudget::Ticket> ExecutionBudget::Admit() {
  absl::MutexLock lock(&mutex_);
  if (executions_ >= max_executions_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("this worker already runs ", executions_,
                     " executions, its limit; retry later"));
  }
  ++executions_;
  return Ticket(this);
}

int ExecutionBudget::executions() const {
  absl::MutexLock lock(&mutex_);
  return executions_;
}

int64_t ExecutionBudget::reserved_bytes() const {
  absl::MutexLock lock(&mutex_);
  return reserved_bytes_;
}

}  // namespace ringattn
