// CancellableStore over gloo's HashStore: a key that exists ends the wait, a
// flag raised while it waits ends it as cancelled, a wait past its timeout and
// a failing inner store throw as the inner store would.

#include "worker/cancellable_store.h"

#include <atomic>
#include <string>
#include <vector>

#include "gloo/common/error.h"
#include "gloo/rendezvous/hash_store.h"
#include "gtest/gtest.h"
#include "worker/forwarding_store.h"

namespace ringattn {
namespace {

// A HashStore whose waits raise `flag` as they begin, as a cancel arriving
// while a rank waits for its peers would.
class RaisingStore final : public ForwardingStore {
 public:
  explicit RaisingStore(std::atomic<bool>& flag)
      : ForwardingStore(hash_), flag_(flag) {}

  using ForwardingStore::wait;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    ++waits;
    flag_ = true;
    ForwardingStore::wait(keys, timeout);
  }

  int waits = 0;

 private:
  gloo::rendezvous::HashStore hash_;
  std::atomic<bool>& flag_;
};

// A store whose waits fail at once.
class BrokenStore final : public gloo::rendezvous::Store {
 public:
  void set(const std::string&, const std::vector<char>&) override {}
  std::vector<char> get(const std::string&) override { return {}; }
  void wait(const std::vector<std::string>&) override {
    throw gloo::IoException("the coordinator is gone");
  }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds&) override {
    wait(keys);
  }
};

std::string MessageOfWait(gloo::rendezvous::Store& store,
                          std::chrono::milliseconds timeout) {
  try {
    store.wait({"peer"}, timeout);
  } catch (const gloo::IoException& e) {
    return e.what();
  }
  return "";
}

TEST(CancellableStore, KeyThatExistsEndsTheWaitAndIsRead) {
  gloo::rendezvous::HashStore inner;
  std::atomic<bool> cancelled{false};
  CancellableStore store(inner, &cancelled);
  store.set("peer", {'a', 'b'});
  EXPECT_EQ(store.get("peer"), (std::vector<char>{'a', 'b'}));
  EXPECT_EQ(MessageOfWait(store, std::chrono::seconds(10)), "");
}

TEST(CancellableStore, FlagRaisedDuringAWaitEndsItAsCancelled) {
  std::atomic<bool> cancelled{false};
  RaisingStore inner(cancelled);
  CancellableStore store(inner, &cancelled);
  const std::string message = MessageOfWait(store, std::chrono::hours(1));
  EXPECT_NE(message.find("cancelled while waiting for 'peer'"),
            std::string::npos)
      << message;
  EXPECT_EQ(inner.waits, 1) << "one slice, then the flag was seen";
}

TEST(CancellableStore, WaitPastItsTimeoutThrowsAsTheInnerStoreWould) {
  gloo::rendezvous::HashStore inner;
  CancellableStore store(inner, nullptr);
  const std::string message =
      MessageOfWait(store, std::chrono::milliseconds(250));
  EXPECT_FALSE(message.empty());
  EXPECT_EQ(message.find("cancelled"), std::string::npos) << message;
}

TEST(CancellableStore, FailingInnerStoreIsPassedOnAtOnce) {
  BrokenStore inner;
  std::atomic<bool> cancelled{false};
  CancellableStore store(inner, &cancelled);
  const std::string message = MessageOfWait(store, std::chrono::hours(1));
  EXPECT_NE(message.find("the coordinator is gone"), std::string::npos)
      << message;
}

}  // namespace
}  // namespace ringattn
