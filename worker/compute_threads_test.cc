#include "worker/compute_threads.h"

#include <atomic>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace ringattn {
namespace {

// Runs ten pieces of work one after another: all run, on one thread.
void ExpectSequentialWorkReusesOneThread(ComputeThreads& threads) {
  std::atomic<int> ran{0};
  for (int i = 0; i < 10; ++i) {
    threads.Run([&ran] { ++ran; });
    threads.WaitForIdle();
  }
  EXPECT_EQ(ran.load(), 10);
  EXPECT_EQ(threads.threads_started(), 1);
}

TEST(ComputeThreads, SequentialWorkReusesOneThread) {
  ComputeThreads threads;
  ExpectSequentialWorkReusesOneThread(threads);
}

TEST(ComputeThreads, WorkNeverWaitsBehindBusyThreads) {
  ComputeThreads threads;
  // Each piece of work finishes only once the other started: both must run
  // at the same time.
  absl::Notification first_started, second_started;
  threads.Run([&] {
    first_started.Notify();
    second_started.WaitForNotification();
  });
  threads.Run([&] {
    second_started.Notify();
    first_started.WaitForNotification();
  });
  threads.WaitForIdle();
  EXPECT_TRUE(first_started.HasBeenNotified());
  EXPECT_TRUE(second_started.HasBeenNotified());
  EXPECT_EQ(threads.threads_started(), 2);
}

TEST(ComputeThreads, DestructionWaitsForWorkGiven) {
  std::atomic<int> ran{0};
  {
    ComputeThreads threads;
    for (int i = 0; i < 5; ++i) threads.Run([&ran] { ++ran; });
  }
  EXPECT_EQ(ran.load(), 5);
}

TEST(ComputeThreads, LingeringThreadTakesTheNextWork) {
  ComputeThreads threads(absl::Seconds(30));
  ExpectSequentialWorkReusesOneThread(threads);
}

TEST(ComputeThreads, DestructionEndsALingeringThreadAtOnce) {
  const absl::Time start = absl::Now();
  {
    ComputeThreads threads(absl::Hours(1));
    threads.Run([] {});
    threads.WaitForIdle();
  }
  // The thread would linger for an hour; the destructor's stop ends it.
  EXPECT_LT(absl::Now() - start, absl::Minutes(1));
}

}  // namespace
}  // namespace ringattn
