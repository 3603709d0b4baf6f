#include "worker/compute_threads.h"

#include <thread>
#include <utility>

#include "absl/time/clock.h"

namespace ringattn {

ComputeThreads::ComputeThreads(absl::Duration linger) : linger_(linger) {}

ComputeThreads::~ComputeThreads() {
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mutex_);
    stopping_ = true;
    arrivals_.fetch_add(1, std::memory_order_release);
    threads.swap(threads_);
  }
  for (std::thread& thread : threads) thread.join();
}

void ComputeThreads::Run(absl::AnyInvocable<void() &&> work) {
  absl::MutexLock lock(&mutex_);
  queue_.push_back(std::move(work));
  arrivals_.fetch_add(1, std::memory_order_release);
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
    if (!has_work()) Linger();
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

void ComputeThreads::Linger() {
  if (linger_ <= absl::ZeroDuration()) return;
  const int64_t seen = arrivals_.load(std::memory_order_acquire);
  mutex_.Unlock();
  const absl::Time until = absl::Now() + linger_;
  while (arrivals_.load(std::memory_order_acquire) == seen &&
         absl::Now() < until) {
    std::this_thread::yield();
  }
  mutex_.Lock();
}

}  // namespace ringattn
