// GlooCommunicator over TCP on 127.0.0.1, ranks as threads meeting in a
// HashStore: transfers arrive intact in both directions, bad calls are
// rejected, and Abort() ends a wait that would otherwise block.

#include "worker/gloo_communicator.h"

#include <signal.h>

#include <atomic>
#include <functional>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gloo/rendezvous/hash_store.h"
#include "gtest/gtest.h"

namespace ringattn {
namespace {

constexpr absl::Duration kTimeout = absl::Seconds(10);

std::shared_ptr<gloo::transport::Device> Device() {
  absl::StatusOr<std::shared_ptr<gloo::transport::Device>> device =
      CreateGlooTcpDevice("127.0.0.1");
  EXPECT_TRUE(device.ok()) << device.status();
  return device.ok() ? *device : nullptr;
}

// Connects `world_size` ranks (one thread each) and, once all are connected,
// runs `body` on each.
void RunGroup(int world_size,
              const std::function<void(GlooCommunicator&)>& body) {
  static std::atomic<int> groups{0};
  const std::string prefix = absl::StrCat("group-", groups++);
  gloo::rendezvous::HashStore store;
  absl::Mutex mutex;
  int attempts = 0;
  std::vector<std::thread> threads;
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] {
      absl::StatusOr<std::unique_ptr<GlooCommunicator>> communicator =
          GlooCommunicator::Connect(store, prefix, r, world_size, Device(),
                                    kTimeout);
      {
        absl::MutexLock lock(&mutex);
        ++attempts;
        auto all_tried = [&] { return attempts == world_size; };
        mutex.Await(absl::Condition(&all_tried));
      }
      ASSERT_TRUE(communicator.ok()) << communicator.status();
      body(**communicator);
    });
  }
  for (std::thread& t : threads) t.join();
}

TEST(GlooCommunicator, RingOfThreeMovesBlocksBothWays) {
  RunGroup(3, [](GlooCommunicator& c) {
    const int next = (c.rank() + 1) % 3;
    const int previous = (c.rank() + 2) % 3;
    std::vector<int> outgoing(1000), incoming(1000);
    std::iota(outgoing.begin(), outgoing.end(), 1000 * c.rank());
    // Several rounds, so slots advance; each round passes the block on.
    for (int round = 0; round < 3; ++round) {
      ASSERT_TRUE(c.StartReceive(incoming.data(), 4000, previous).ok());
      ASSERT_TRUE(c.StartSend(outgoing.data(), 4000, next).ok());
      ASSERT_TRUE(c.Wait(absl::Now() + kTimeout).ok());
      const int origin = (c.rank() + 3 * 3 - round - 1) % 3;
      EXPECT_EQ(incoming[0], 1000 * origin) << "round " << round;
      EXPECT_EQ(incoming[999], 1000 * origin + 999);
      outgoing.swap(incoming);
    }
  });
}

TEST(GlooCommunicator, SingleRankConnects) {
  gloo::rendezvous::HashStore store;
  absl::StatusOr<std::unique_ptr<GlooCommunicator>> communicator =
      GlooCommunicator::Connect(store, "single", 0, 1, Device(), kTimeout);
  ASSERT_TRUE(communicator.ok()) << communicator.status();
  EXPECT_EQ((*communicator)->world_size(), 1);
  EXPECT_TRUE((*communicator)->Wait(absl::Now()).ok());
}

// A rank whose request is cancelled while it waits for a peer that never
// comes stops waiting (CANCELLED) instead of waiting out its timeout.
TEST(GlooCommunicator, CancelWhileWaitingForAPeerEndsTheConnect) {
  gloo::rendezvous::HashStore store;
  std::atomic<bool> cancelled{true};
  absl::StatusOr<std::unique_ptr<GlooCommunicator>> communicator =
      GlooCommunicator::Connect(store, "alone", 1, 2, Device(), absl::Hours(1),
                                &cancelled);
  EXPECT_EQ(communicator.status().code(), absl::StatusCode::kCancelled)
      << communicator.status();
}

TEST(GlooCommunicator, RejectsBadArguments) {
  gloo::rendezvous::HashStore store;
  EXPECT_EQ(GlooCommunicator::Connect(store, "bad", 3, 2, Device(), kTimeout)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GlooCommunicator::Connect(store, "bad", 0, 1, Device(),
                                      absl::ZeroDuration())
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  RunGroup(2, [](GlooCommunicator& c) {
    char byte = 0;
    EXPECT_EQ(c.StartSend(&byte, 1, c.rank()).code(),
              absl::StatusCode::kInvalidArgument);
    // Broken after a failure.
    EXPECT_EQ(c.StartSend(&byte, 1, 1 - c.rank()).code(),
              absl::StatusCode::kFailedPrecondition);
  });
}

TEST(GlooCommunicator, AbortEndsAWaitThatWouldBlock) {
  absl::Notification done;
  RunGroup(2, [&](GlooCommunicator& c) {
    if (c.rank() == 1) {
      // Never sends; stays connected until rank 0 is done.
      done.WaitForNotification();
      return;
    }
    std::vector<char> incoming(64);
    ASSERT_TRUE(c.StartReceive(incoming.data(), 64, 1).ok());
    std::thread aborter([&c] { c.Abort(); });
    const absl::Time start = absl::Now();
    const absl::Status status = c.Wait(absl::Now() + absl::Seconds(60));
    aborter.join();
    EXPECT_EQ(status.code(), absl::StatusCode::kCancelled) << status;
    EXPECT_LT(absl::Now() - start, absl::Seconds(5));
    EXPECT_EQ(c.StartReceive(incoming.data(), 64, 1).code(),
              absl::StatusCode::kFailedPrecondition);
    done.Notify();
  });
}

TEST(GlooCommunicator, WaitPastDeadlineIsDeadlineExceeded) {
  absl::Notification done;
  RunGroup(2, [&](GlooCommunicator& c) {
    if (c.rank() == 1) {
      done.WaitForNotification();
      return;
    }
    std::vector<char> incoming(64);
    ASSERT_TRUE(c.StartReceive(incoming.data(), 64, 1).ok());
    const absl::Status status = c.Wait(absl::Now() + absl::Milliseconds(200));
    EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
    EXPECT_NE(status.message().find("from rank 1"), std::string::npos)
        << status;
    done.Notify();
  });
}

// Gloo writes to its sockets with writev(2): unless SIGPIPE is ignored, a rank
// writing to a peer that just crashed is killed by it (the pass-Q fault test
// died that way about one run in six on a loaded machine).
TEST(GlooCommunicator, CreatingADeviceIgnoresSigpipe) {
  ASSERT_NE(Device(), nullptr);
  struct sigaction current = {};
  ASSERT_EQ(sigaction(SIGPIPE, nullptr, &current), 0);
  EXPECT_EQ(current.sa_handler, SIG_IGN);
}

}  // namespace
}  // namespace ringattn
