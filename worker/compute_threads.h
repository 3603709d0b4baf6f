#ifndef RINGATTN_WORKER_COMPUTE_THREADS_H_
#define RINGATTN_WORKER_COMPUTE_THREADS_H_

// ComputeThreads: runs each request's computation on a thread of its own,
// reusing threads whose earlier work ended, so that a decode step does not pay
// for starting one. Work never waits behind other work: with every thread
// busy, Run starts another. A thread whose work ended may linger, polling for
// the next piece before it sleeps, so that work arriving soon after starts
// without waiting for a thread to wake. Thread-safe.

#include <atomic>
#include <cstdint>
#include <deque>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ringattn {

class ComputeThreads {
 public:
  // `linger`: how long a thread whose work ended keeps polling for more
  // before it sleeps (one core busy for that long; zero: it sleeps at once).
  explicit ComputeThreads(absl::Duration linger = absl::ZeroDuration());
  // Waits for the work already given, then ends the threads.
  ~ComputeThreads();

  ComputeThreads(const ComputeThreads&) = delete;
  ComputeThreads& operator=(const ComputeThreads&) = delete;

  // Runs `work` on an idle thread, or on a new one when none is idle.
  void Run(absl::AnyInvocable<void() &&> work);

  // Blocks until no work is queued or running.
  void WaitForIdle();

  // Threads started so far.
  int64_t threads_started() const;

 private:
  void Serve();
  // Polls for up to linger_ for work given or the end, with the mutex
  // released.
  void Linger() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  const absl::Duration linger_;
  // Counts the calls of Run and the destructor's stop: what a lingering
  // thread polls for, without the mutex.
  std::atomic<int64_t> arrivals_{0};
  mutable absl::Mutex mutex_;
  std::deque<absl::AnyInvocable<void() &&>> queue_ ABSL_GUARDED_BY(mutex_);
  int64_t idle_ ABSL_GUARDED_BY(mutex_) = 0;
  int64_t busy_ ABSL_GUARDED_BY(mutex_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mutex_) = false;
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace ringattn

#endif  // RINGATTN_WORKER_COMPUTE_THREADS_H_
