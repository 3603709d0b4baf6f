#include "worker/shard_intake.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace ringattn {

ShardIntake::ShardIntake(std::array<ShardRowsTarget, 3> targets,
                         DType wire_dtype)
    : wire_dtype_(wire_dtype), targets_(std::move(targets)) {}

absl::StatusOr<int64_t> ShardIntake::Place(const v1::ShardRows& rows) {
  static constexpr const char* kNames[] = {"Q", "K", "V"};
  int index = -1;
  switch (rows.tensor()) {
    case v1::Q:
      index = 0;
      break;
    case v1::K:
      index = 1;
      break;
    case v1::V:
      index = 2;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("ShardRows.tensor must be Q, K or V, got ",
                       static_cast<int>(rows.tensor())));
  }
  const ShardRowsTarget* target = nullptr;
  std::vector<int64_t> slots;
  {
    absl::MutexLock lock(&mutex_);
    if (closed_) {
      return absl::FailedPreconditionError(
          "rows arrived after 'run' or after the request ended");
    }
    if (!targets_[index].takes_rows()) {
      return absl::InvalidArgumentError(
          absl::StrCat("this upload takes no ", kNames[index],
                       " rows (a context holds K and V only)"));
    }
    absl::StatusOr<std::vector<int64_t>> claimed =
        targets_[index].Claim(rows, wire_dtype_);
    if (!claimed.ok()) return claimed.status();
    slots = *std::move(claimed);
    target = &targets_[index];
    ++storing_;
  }
  // The claimed rows are this call's alone, and the target's views do not
  // change while open.
  target->Store(rows, wire_dtype_, slots);
  absl::MutexLock lock(&mutex_);
  --storing_;
  return static_cast<int64_t>(slots.size());
}

void ShardIntake::Close() {
  absl::MutexLock lock(&mutex_);
  closed_ = true;
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    return storing_ == 0;
  };
  mutex_.Await(absl::Condition(&idle));
}

absl::Status ShardIntake::CheckComplete() const {
  absl::MutexLock lock(&mutex_);
  for (const ShardRowsTarget& target : targets_) {
    if (absl::Status status = target.CheckComplete(); !status.ok()) {
      return status;
    }
  }
  return absl::OkStatus();
}

}  // namespace ringattn
