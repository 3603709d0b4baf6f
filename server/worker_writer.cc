#include "server/worker_writer.h"

#include <utility>

namespace ringattn {

WorkerWriter::WorkerWriter(Write write, int64_t max_queued_bytes)
    : write_(std::move(write)),
      max_queued_bytes_(max_queued_bytes),
      thread_([this] { Run(); }) {}

WorkerWriter::~WorkerWriter() {
  {
    absl::MutexLock lock(&mutex_);
    stopping_ = true;
  }
  thread_.join();
}

bool WorkerWriter::Push(v1::ExecuteRequest request) {
  const int64_t bytes = static_cast<int64_t>(request.ByteSizeLong());
  absl::MutexLock lock(&mutex_);
  // One request always fits, however large, so that nothing waits forever.
  auto room = [this, bytes]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    return failed_ || queued_bytes_ == 0 ||
           queued_bytes_ + bytes <= max_queued_bytes_;
  };
  mutex_.Await(absl::Condition(&room));
  if (failed_) return false;
  queue_.push_back(Queued{std::move(request), bytes});
  queued_bytes_ += bytes;
  return true;
}

bool WorkerWriter::Flush() {
  absl::MutexLock lock(&mutex_);
  auto drained = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    return failed_ || (queue_.empty() && !writing_);
  };
  mutex_.Await(absl::Condition(&drained));
  return !failed_;
}

void WorkerWriter::Run() {
  for (;;) {
    Queued next;
    {
      absl::MutexLock lock(&mutex_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
        return stopping_ || !queue_.empty();
      };
      mutex_.Await(absl::Condition(&ready));
      if (stopping_ || failed_) return;
      next = std::move(queue_.front());
      queue_.pop_front();
      writing_ = true;
    }
    const bool ok = write_(next.request);
    absl::MutexLock lock(&mutex_);
    writing_ = false;
    queued_bytes_ -= next.bytes;
    if (!ok) {
      failed_ = true;
      queue_.clear();
      queued_bytes_ = 0;
    }
  }
}

}  // namespace ringattn
