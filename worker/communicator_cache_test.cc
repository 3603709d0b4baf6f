// CommunicatorCache over a fake connector: a healthy loan is kept for the
// key's next request and only that; a loan that failed, was aborted or left a
// transfer started is destroyed aborted and its key refused; a new key aborts
// the older key's communicator of its slot, at once if kept, on return if lent
// out, and leaves the other slots' alone.

#include "worker/communicator_cache.h"

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace ringattn {
namespace {

constexpr absl::Duration kTimeout = absl::Seconds(1);

// What happened to one fake communicator.
struct Events {
  bool aborted = false;
  bool destroyed = false;
};

// Transfers that complete at once, or fail at Wait if told to.
class FakeCommunicator final : public RingCommunicator {
 public:
  FakeCommunicator(int rank, int world_size, std::shared_ptr<Events> events)
      : rank_(rank), world_size_(world_size), events_(std::move(events)) {}
  ~FakeCommunicator() override { events_->destroyed = true; }

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  absl::Status StartSend(const void*, int64_t, int) override {
    return absl::OkStatus();
  }
  absl::Status StartReceive(void*, int64_t, int) override {
    return absl::OkStatus();
  }
  absl::Status Wait(absl::Time) override {
    if (fail_waits) return absl::UnavailableError("peer went away");
    return events_->aborted ? absl::CancelledError("aborted")
                            : absl::OkStatus();
  }
  void Abort() override { events_->aborted = true; }

  bool fail_waits = false;

 private:
  const int rank_;
  const int world_size_;
  std::shared_ptr<Events> events_;
};

// Makes FakeCommunicators and remembers the groups asked for and the events
// of each communicator made.
class FakeConnector final : public RingConnector {
 public:
  absl::StatusOr<std::unique_ptr<RingCommunicator>> Connect(
      const std::string& group, int rank, int world_size, absl::Duration,
      const std::atomic<bool>*) override {
    groups.push_back(group);
    if (!fail.ok()) return fail;
    made.push_back(std::make_shared<Events>());
    auto communicator =
        std::make_unique<FakeCommunicator>(rank, world_size, made.back());
    last = communicator.get();
    return std::unique_ptr<RingCommunicator>(std::move(communicator));
  }

  std::vector<std::string> groups;
  std::vector<std::shared_ptr<Events>> made;
  FakeCommunicator* last = nullptr;
  absl::Status fail;
};

// One send and one receive, completed.
absl::Status Exchange(RingCommunicator& communicator) {
  char out = 1, in = 0;
  if (absl::Status s = communicator.StartReceive(&in, 1, 1); !s.ok()) return s;
  if (absl::Status s = communicator.StartSend(&out, 1, 1); !s.ok()) return s;
  return communicator.Wait(absl::InfiniteFuture());
}

class CommunicatorCacheTest : public ::testing::Test {
 protected:
  absl::StatusOr<std::unique_ptr<RingCommunicator>> Lend(const std::string& key,
                                                         bool* reused,
                                                         int slot = 0) {
    return cache_.Lend(key, slot, 0, 2, kTimeout, reused);
  }

  FakeConnector connector_;
  CommunicatorCache cache_{connector_};
};

TEST_F(CommunicatorCacheTest, HealthyLoanIsReusedBySameKey) {
  bool reused = true;
  {
    absl::StatusOr<std::unique_ptr<RingCommunicator>> first =
        Lend("epoch-1/gen-1", &reused);
    ASSERT_TRUE(first.ok()) << first.status();
    EXPECT_FALSE(reused);
    ASSERT_TRUE(Exchange(**first).ok());
  }
  absl::StatusOr<std::unique_ptr<RingCommunicator>> second =
      Lend("epoch-1/gen-1", &reused);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_TRUE(reused);
  EXPECT_EQ((*second)->rank(), 0);
  EXPECT_EQ((*second)->world_size(), 2);
  ASSERT_TRUE(Exchange(**second).ok());
  EXPECT_EQ(cache_.creations(), 1);
  EXPECT_EQ(connector_.groups, std::vector<std::string>{"epoch-1/gen-1"})
      << "the key is the rendezvous group";
  EXPECT_FALSE(connector_.made[0]->aborted);
  EXPECT_FALSE(connector_.made[0]->destroyed);
}

TEST_F(CommunicatorCacheTest, KeyIsLentToOneRequestAtATime) {
  bool reused = false;
  absl::StatusOr<std::unique_ptr<RingCommunicator>> held = Lend("k", &reused);
  ASSERT_TRUE(held.ok());
  EXPECT_EQ(Lend("k", &reused).status().code(),
            absl::StatusCode::kFailedPrecondition);
  held->reset();
  EXPECT_TRUE(Lend("k", &reused).ok());
  EXPECT_TRUE(reused);
  EXPECT_EQ(cache_.creations(), 1);
}

TEST_F(CommunicatorCacheTest, AbortedLoanIsDestroyedAndKeyRefused) {
  bool reused = false;
  {
    absl::StatusOr<std::unique_ptr<RingCommunicator>> loan = Lend("k", &reused);
    ASSERT_TRUE(loan.ok());
    (*loan)->Abort();
  }
  EXPECT_TRUE(connector_.made[0]->aborted);
  EXPECT_TRUE(connector_.made[0]->destroyed);
  const absl::Status refused = Lend("k", &reused).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.message().find("new communicator key"), std::string::npos)
      << refused;
  EXPECT_EQ(connector_.groups.size(), 1u) << "no second rendezvous on a key";
  EXPECT_TRUE(Lend("k2", &reused).ok()) << "a new key makes a new one";
  EXPECT_EQ(cache_.creations(), 2);
}

TEST_F(CommunicatorCacheTest, FailedTransferBreaksTheKey) {
  bool reused = false;
  {
    absl::StatusOr<std::unique_ptr<RingCommunicator>> loan = Lend("k", &reused);
    ASSERT_TRUE(loan.ok());
    connector_.last->fail_waits = true;
    EXPECT_EQ(Exchange(**loan).code(), absl::StatusCode::kUnavailable);
  }
  EXPECT_TRUE(connector_.made[0]->aborted);
  EXPECT_TRUE(connector_.made[0]->destroyed);
  EXPECT_EQ(Lend("k", &reused).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(CommunicatorCacheTest, TransferLeftStartedIsNotKept) {
  bool reused = false;
  {
    absl::StatusOr<std::unique_ptr<RingCommunicator>> loan = Lend("k", &reused);
    ASSERT_TRUE(loan.ok());
    char out = 1;
    ASSERT_TRUE((*loan)->StartSend(&out, 1, 1).ok());
    // The run ends (some other failure) without waiting for the send.
  }
  EXPECT_TRUE(connector_.made[0]->aborted);
  EXPECT_TRUE(connector_.made[0]->destroyed);
  EXPECT_EQ(Lend("k", &reused).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(CommunicatorCacheTest, NewKeyAbortsTheKeptCommunicatorOfTheOldOne) {
  bool reused = false;
  ASSERT_TRUE(Lend("old", &reused).ok());  // given back healthy at once
  ASSERT_FALSE(connector_.made[0]->destroyed);
  absl::StatusOr<std::unique_ptr<RingCommunicator>> fresh =
      Lend("new", &reused);
  ASSERT_TRUE(fresh.ok());
  EXPECT_FALSE(reused);
  EXPECT_TRUE(connector_.made[0]->aborted) << "its peers may be gone";
  EXPECT_TRUE(connector_.made[0]->destroyed);
  EXPECT_FALSE(connector_.made[1]->destroyed);
}

// Two requests at once, each holding a slot's key, then each slot's next
// request: both reuse their own, and a slot's new key retires its old one
// only.
TEST_F(CommunicatorCacheTest, EachSlotKeepsACommunicatorOfItsOwn) {
  bool reused = true;
  {
    absl::StatusOr<std::unique_ptr<RingCommunicator>> a = Lend("a", &reused, 0);
    absl::StatusOr<std::unique_ptr<RingCommunicator>> b = Lend("b", &reused, 1);
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_TRUE(Exchange(**a).ok());
    ASSERT_TRUE(Exchange(**b).ok());
  }
  ASSERT_TRUE(Lend("a", &reused, 0).ok());
  EXPECT_TRUE(reused);
  ASSERT_TRUE(Lend("b", &reused, 1).ok());
  EXPECT_TRUE(reused);
  EXPECT_EQ(cache_.creations(), 2);
  ASSERT_TRUE(Lend("c", &reused, 1).ok());
  EXPECT_FALSE(reused);
  EXPECT_TRUE(connector_.made[1]->aborted) << "slot 1's older key retired";
  EXPECT_FALSE(connector_.made[0]->aborted) << "slot 0 is left alone";
  ASSERT_TRUE(Lend("a", &reused, 0).ok());
  EXPECT_TRUE(reused);
}

TEST_F(CommunicatorCacheTest, SlotOutsideTheRangeIsInvalidArgument) {
  bool reused = false;
  EXPECT_EQ(Lend("k", &reused, -1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Lend("k", &reused, kMostCommunicatorSlots).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(connector_.groups.empty());
}

TEST_F(CommunicatorCacheTest, LoanOfARetiredKeyIsAbortedWhenGivenBack) {
  bool reused = false;
  absl::StatusOr<std::unique_ptr<RingCommunicator>> old_loan =
      Lend("old", &reused);
  ASSERT_TRUE(old_loan.ok());
  ASSERT_TRUE(Exchange(**old_loan).ok());
  ASSERT_TRUE(Lend("new", &reused).ok());  // given back healthy
  EXPECT_FALSE(connector_.made[0]->destroyed) << "still lent out";
  old_loan->reset();
  EXPECT_TRUE(connector_.made[0]->aborted);
  EXPECT_TRUE(connector_.made[0]->destroyed);
  EXPECT_TRUE(Lend("new", &reused).ok());
  EXPECT_TRUE(reused) << "the old loan's return leaves the new key alone";
}

TEST_F(CommunicatorCacheTest, FailedConnectBreaksTheKeyWithoutRetrying) {
  connector_.fail = absl::DeadlineExceededError("rank 1 did not join");
  bool reused = false;
  EXPECT_EQ(Lend("k", &reused).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  connector_.fail = absl::OkStatus();
  EXPECT_EQ(Lend("k", &reused).status().code(),
            absl::StatusCode::kFailedPrecondition)
      << "the key's rendezvous is spent";
  EXPECT_EQ(connector_.groups.size(), 1u);
  EXPECT_TRUE(Lend("k2", &reused).ok());
  EXPECT_EQ(cache_.creations(), 1);
}

TEST_F(CommunicatorCacheTest, OtherRankOrWorldSizeIsRefused) {
  bool reused = false;
  ASSERT_TRUE(Lend("k", &reused).ok());
  EXPECT_EQ(cache_.Lend("k", 0, 1, 2, kTimeout, &reused).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(cache_.Lend("k", 0, 0, 3, kTimeout, &reused).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Lend("k", &reused).ok()) << "the kept one is still there";
  EXPECT_TRUE(reused);
}

TEST(CommunicatorCache, DestroyingTheCacheAbortsTheKeptCommunicators) {
  FakeConnector connector;
  {
    CommunicatorCache cache(connector);
    bool reused = false;
    ASSERT_TRUE(cache.Lend("k", 0, 0, 2, kTimeout, &reused).ok());
    ASSERT_TRUE(cache.Lend("j", 3, 0, 2, kTimeout, &reused).ok());
  }
  for (const std::shared_ptr<Events>& made : connector.made) {
    EXPECT_TRUE(made->aborted);
    EXPECT_TRUE(made->destroyed);
  }
}

}  // namespace
}  // namespace ringattn
