#ifndef RINGATTN_SERVER_COMMUNICATOR_KEYS_H_
#define RINGATTN_SERVER_COMMUNICATOR_KEYS_H_

// CommunicatorKeys: names the ring communicators the workers keep between
// requests (ExecuteHeader.communicator_key), one per slot, and lends each to
// one request at a time. A key names this coordinator process, the cluster's
// membership epoch and a generation: a slot lent on a new epoch gets a new key,
// and so does the slot of a request that held its key and did not succeed,
// because a worker of that request may have aborted its communicator or left
// it mid-transfer. Requests that find every slot lent out ring over
// communicators of their own. The rendezvous keys of a retired key are erased
// from the store. Thread-safe.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/rendezvous_store.h"

namespace ringattn {

class CommunicatorKeys {
 public:
  // The right of one request to ring over the kept communicator. A lease
  // whose key() is empty holds nothing. Movable, not copyable; must not
  // outlive the CommunicatorKeys that made it.
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& other) noexcept;
    Lease& operator=(Lease&& other) noexcept;
    // Gives the key back: kept for the next request if Succeeded() was
    // called, retired otherwise.
    ~Lease();

    // The key for ExecuteHeader.communicator_key; empty: the request's
    // workers connect a communicator of their own.
    const std::string& key() const { return key_; }
    // The key's slot, for ExecuteHeader.communicator_slot.
    int slot() const { return slot_; }
    // Whether the workers make the key's communicator in this request (its
    // first) rather than reuse it.
    bool first_use() const { return first_use_; }
    // Every worker of the request finished its run without error.
    void Succeeded() { succeeded_ = true; }

   private:
    friend class CommunicatorKeys;
    Lease(CommunicatorKeys* keys, std::string key, int slot, bool first_use)
        : keys_(keys),
          key_(std::move(key)),
          slot_(slot),
          first_use_(first_use) {}
    void Release();

    CommunicatorKeys* keys_ = nullptr;
    std::string key_;
    int slot_ = 0;
    bool first_use_ = false;
    bool succeeded_ = false;
  };

  // `store` (the workers' rendezvous store) must outlive this. `instance`
  // tells this coordinator's keys from those of an earlier coordinator
  // process the workers may still remember. `slots` (>= 1): how many
  // communicators the workers keep, one for each request the coordinator runs
  // at once.
  CommunicatorKeys(RendezvousStore& store, std::string instance, int slots = 1);

  CommunicatorKeys(const CommunicatorKeys&) = delete;
  CommunicatorKeys& operator=(const CommunicatorKeys&) = delete;

  // Which free slot Acquire prefers: one whose communicator the workers made
  // in the epoch (a request's choice), or one whose communicator they have
  // yet to make (the ring warm-up's, which makes them all).
  enum class Prefer { kMade, kUnmade };

  // A key for a request on the cluster of membership epoch `epoch`: that of
  // a free slot of the kind `prefer` names if there is one, else of another
  // free slot (a new key if the epoch changed since it was named); an empty
  // lease while other requests hold every slot.
  Lease Acquire(int64_t epoch, Prefer prefer = Prefer::kMade);

  // Whether Acquire(epoch) would now lend the key of a communicator the
  // workers already made (a request held it and succeeded, in this epoch).
  // A hint for cost models: another request may take the key first.
  bool Reusable(int64_t epoch);

  // How many communicators the workers keep.
  int slots() const { return slot_count_; }

  // A fresh instance name for a coordinator process.
  static std::string NewInstance();

 private:
  struct Slot {
    int64_t epoch = -1;
    std::string key;    // empty until the slot is first lent
    bool used = false;  // some request had key
    bool held = false;
  };

  void Release(int slot, const std::string& key, bool succeeded);
  // Erases `slot`'s key's rendezvous and names it a key of the next
  // generation, in its epoch.
  void Retire(Slot& slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  RendezvousStore& store_;
  const std::string instance_;
  const int slot_count_;
  absl::Mutex mutex_;
  int64_t generation_ ABSL_GUARDED_BY(mutex_) = 0;  // of the newest key
  std::vector<Slot> slots_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace ringattn

#endif  // RINGATTN_SERVER_COMMUNICATOR_KEYS_H_
