#include "worker/compute_threads.h"

#include <utility>

namespace ringattn {

ComputeThreads::~ComputeThreads() {
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mutex_);
    stopping_ = true;
    threads.swap(threads_);
  }
  for (std::thread& thread : threads) thread.join();
}

void ComputeThreads::Run(absl::AnyInvocable<void() &&> work) {
  absl::MutexLock lock(&mutex_);
  queue_.push_back(std::move(work));
  // Every queued piece of work has an idle thread of its own to take it.
  if (idle_ >= static_cast<int64_t>(queue_.size())) return;
  ++idle_;
  threads_.emplace_back(&ComputeThreads::Serve, this);
}

void ComputeThreads::WaitForIdle() {
  absl::MutexLock lock(&mutex_);
  auto idle = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return queue_.empty() && busy_ == 0;
  };
  mutex_.Await(absl::Condition(&idle));
}

int64_t ComputeThreads::threads_started() const {
  absl::MutexLock lock(&mutex_);
  return static_cast<int64_t>(threads_.size());
}

void ComputeThreads::Serve() {
  auto has_work = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return !queue_.empty() || stopping_;
  };
  absl::MutexLock lock(&mutex_);
  for (;;) {
    mutex_.Await(absl::Condition(&has_work));
    if (queue_.empty()) return;  // stopping, with nothing left to run
    absl::AnyInvocable<void()&&> work = std::move(queue_.front());
    queue_.pop_front();
    --idle_;
    ++busy_;
    mutex_.Unlock();
    std::move(work)();
    mutex_.Lock();
    --busy_;
    ++idle_;
  }
}

}  // namespace ringattn
