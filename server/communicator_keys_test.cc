// CommunicatorKeys: each of the workers' kept communicators goes to one request
// at a time, a failed request retires its slot's key, a new membership epoch
// gets new keys, and a retired key's rendezvous leaves the store. Cluster: its
// epoch moves whenever the ready members may have changed.

#include "server/communicator_keys.h"

#include <chrono>
#include <string>
#include <utility>

#include "gtest/gtest.h"
#include "server/cluster.h"
#include "server/rendezvous_store.h"

namespace ringattn {
namespace {

TEST(CommunicatorKeys, KeyGoesToOneRequestAtATime) {
  RendezvousStore store;
  CommunicatorKeys keys(store, "c");
  std::string key;
  {
    CommunicatorKeys::Lease first = keys.Acquire(1);
    ASSERT_FALSE(first.key().empty());
    EXPECT_TRUE(first.first_use());
    key = first.key();
    const CommunicatorKeys::Lease concurrent = keys.Acquire(1);
    EXPECT_TRUE(concurrent.key().empty())
        << "a concurrent request rings over a communicator of its own";
    first.Succeeded();
  }
  const CommunicatorKeys::Lease next = keys.Acquire(1);
  EXPECT_EQ(next.key(), key) << "a success keeps the key";
  EXPECT_FALSE(next.first_use());
}

TEST(CommunicatorKeys, ConcurrentRequestsGetASlotEach) {
  RendezvousStore store;
  CommunicatorKeys keys(store, "c", /*slots=*/2);
  std::string first_key, second_key;
  {
    CommunicatorKeys::Lease first = keys.Acquire(1);
    CommunicatorKeys::Lease second = keys.Acquire(1);
    ASSERT_FALSE(first.key().empty());
    ASSERT_FALSE(second.key().empty());
    EXPECT_NE(first.key(), second.key());
    EXPECT_NE(first.slot(), second.slot());
    EXPECT_TRUE(keys.Acquire(1).key().empty()) << "both slots are lent";
    first_key = first.key();
    second_key = second.key();
    first.Succeeded();
    second.Succeeded();
  }
  {
    CommunicatorKeys::Lease first = keys.Acquire(1);
    CommunicatorKeys::Lease second = keys.Acquire(1);
    EXPECT_FALSE(first.first_use());
    EXPECT_FALSE(second.first_use());
    EXPECT_EQ(first.key(), first_key);
    EXPECT_EQ(second.key(), second_key);
    second.Succeeded();  // the first fails: only its slot gets a new key
  }
  CommunicatorKeys::Lease reused = keys.Acquire(1);
  EXPECT_EQ(reused.key(), second_key) << "a made communicator is lent first";
  EXPECT_FALSE(reused.first_use());
  CommunicatorKeys::Lease fresh = keys.Acquire(1);
  EXPECT_NE(fresh.key(), first_key);
  EXPECT_TRUE(fresh.first_use());
}

// A request takes a made communicator while one is free; the warm-up takes
// one not made yet, so that it makes every slot's in turn.
TEST(CommunicatorKeys, WarmUpTakesASlotWhoseCommunicatorIsNotMadeYet) {
  RendezvousStore store;
  CommunicatorKeys keys(store, "c", /*slots=*/3);
  EXPECT_EQ(keys.slots(), 3);
  {
    CommunicatorKeys::Lease made = keys.Acquire(1);
    ASSERT_EQ(made.slot(), 0);
    made.Succeeded();
  }
  for (int slot : {1, 2}) {
    CommunicatorKeys::Lease warm_up =
        keys.Acquire(1, CommunicatorKeys::Prefer::kUnmade);
    EXPECT_EQ(warm_up.slot(), slot);
    EXPECT_TRUE(warm_up.first_use());
    warm_up.Succeeded();
  }
  const CommunicatorKeys::Lease all_made =
      keys.Acquire(1, CommunicatorKeys::Prefer::kUnmade);
  EXPECT_EQ(all_made.slot(), 0) << "with every slot made, any free one";
  EXPECT_FALSE(all_made.first_use());
  const CommunicatorKeys::Lease request = keys.Acquire(1);
  EXPECT_EQ(request.slot(), 1);
  EXPECT_FALSE(request.first_use());
}

TEST(CommunicatorKeys, ReusableOnlyWhenAMadeCommunicatorIsFree) {
  RendezvousStore store;
  CommunicatorKeys keys(store, "c");
  EXPECT_FALSE(keys.Reusable(1)) << "no key named yet";
  {
    CommunicatorKeys::Lease lease = keys.Acquire(1);
    EXPECT_FALSE(keys.Reusable(1)) << "lent out";
    lease.Succeeded();
  }
  EXPECT_TRUE(keys.Reusable(1));
  EXPECT_FALSE(keys.Reusable(2)) << "a new epoch needs a new communicator";
  { const CommunicatorKeys::Lease failed = keys.Acquire(1); }
  EXPECT_FALSE(keys.Reusable(1)) << "a failure retires the key";
}

TEST(CommunicatorKeys, KeyNamesInstanceEpochAndGeneration) {
  RendezvousStore store;
  CommunicatorKeys keys(store, "coordinator-7");
  const CommunicatorKeys::Lease lease = keys.Acquire(12);
  EXPECT_EQ(lease.key(), "communicator/coordinator-7/epoch-12/generation-1");
}

TEST(CommunicatorKeys, FailedRequestBumpsTheGeneration) {
  RendezvousStore store;
  CommunicatorKeys keys(store, "c");
  std::string failed_key;
  {
    const CommunicatorKeys::Lease lease = keys.Acquire(1);
    failed_key = lease.key();
    // Released without Succeeded(): a worker error, a cancel, a timeout.
  }
  const CommunicatorKeys::Lease next = keys.Acquire(1);
  ASSERT_FALSE(next.key().empty());
  EXPECT_NE(next.key(), failed_key);
  EXPECT_TRUE(next.first_use());
  EXPECT_NE(next.key().find("epoch-1/"), std::string::npos) << next.key();
}

TEST(CommunicatorKeys, NewEpochGetsANewKey) {
  RendezvousStore store;
  CommunicatorKeys keys(store, "c");
  std::string old_key;
  {
    CommunicatorKeys::Lease lease = keys.Acquire(3);
    old_key = lease.key();
    lease.Succeeded();
  }
  const CommunicatorKeys::Lease next = keys.Acquire(4);
  EXPECT_NE(next.key(), old_key);
  EXPECT_TRUE(next.first_use());
  EXPECT_NE(next.key().find("epoch-4/"), std::string::npos) << next.key();
}

TEST(CommunicatorKeys, RetiredKeyLeavesTheStore) {
  RendezvousStore store;
  CommunicatorKeys keys(store, "c");
  std::string old_key;
  {
    const CommunicatorKeys::Lease lease = keys.Acquire(1);
    old_key = lease.key();
    store.Set(old_key + "/nccl-unique-id", "id");
    store.Set(old_key + "0/unrelated", "x");
    store.Set("request/r1/x", "y");
  }
  EXPECT_EQ(store.size(), 2u) << "only the failed key's rendezvous is erased";
  const CommunicatorKeys::Lease next = keys.Acquire(1);
  store.Set(next.key() + "/nccl-unique-id", "id");
  EXPECT_EQ(store.size(), 3u);
}

TEST(CommunicatorKeys, MovedLeaseReleasesOnce) {
  RendezvousStore store;
  CommunicatorKeys keys(store, "c");
  std::string key;
  {
    CommunicatorKeys::Lease lease = keys.Acquire(1);
    key = lease.key();
    CommunicatorKeys::Lease moved = std::move(lease);
    EXPECT_TRUE(keys.Acquire(1).key().empty()) << "still held after the move";
    moved.Succeeded();
  }
  EXPECT_EQ(keys.Acquire(1).key(), key);
}

TEST(Cluster, EpochMovesWithMembership) {
  Cluster cluster(2, std::chrono::hours(1));
  v1::RegisterRequest request;
  for (const char* address : {"a:1", "b:1"}) {
    request.set_address(address);
    ASSERT_TRUE(cluster.Register(request).ok());
  }
  absl::StatusOr<Cluster::Membership> first = cluster.ReadyMembership();
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->members.size(), 2u);
  absl::StatusOr<Cluster::Membership> same = cluster.ReadyMembership();
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(same->epoch, first->epoch);
  ASSERT_TRUE(cluster.Heartbeat(1, "b:1"));
  EXPECT_EQ(cluster.ReadyMembership()->epoch, first->epoch)
      << "a heartbeat of a live worker changes nothing";

  // A worker restarted at the same address keeps its rank, not its epoch.
  request.set_address("b:1");
  ASSERT_TRUE(cluster.Register(request).ok());
  absl::StatusOr<Cluster::Membership> restarted = cluster.ReadyMembership();
  ASSERT_TRUE(restarted.ok());
  EXPECT_GT(restarted->epoch, first->epoch);

  cluster.MarkDead(1, "b:1");
  request.set_address("c:1");
  ASSERT_TRUE(cluster.Register(request).ok());
  absl::StatusOr<Cluster::Membership> replaced = cluster.ReadyMembership();
  ASSERT_TRUE(replaced.ok());
  EXPECT_GT(replaced->epoch, restarted->epoch);
  EXPECT_EQ(replaced->members[1].address, "c:1");
}

}  // namespace
}  // namespace ringattn
