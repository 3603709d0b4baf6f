#ifndef RINGATTN_WORKER_COMMUNICATOR_CACHE_H_
#define RINGATTN_WORKER_COMMUNICATOR_CACHE_H_

// CommunicatorCache: keeps a ring communicator between requests in each of the
// coordinator's slots, so that a request the coordinator hands one of the
// cluster's reuse keys (ExecuteHeader's communicator_key and communicator_slot)
// rings over the communicator an earlier request of the same key made instead
// of connecting a new one (NCCL setup and its first connection, 0.7 s on two
// H200s; a full TCP mesh for Gloo). The coordinator lends a key to one request
// at a time and names a new key for its slot for every membership epoch and
// after every failed request, so a kept communicator is only ever reused by
// ranks that all ended the previous run healthily. Works over any
// RingConnector: GPU workers keep NCCL communicators, CPU workers Gloo ones.

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/communicator.h"

namespace ringattn {

// The most slots a coordinator may name (communicator_slot < this).
inline constexpr int kMostCommunicatorSlots = 64;

// Thread-safe. Not copyable.
class CommunicatorCache {
 public:
  // `connector` makes the communicators; it must outlive the cache, and the
  // cache must outlive every communicator it lends.
  explicit CommunicatorCache(RingConnector& connector);

  CommunicatorCache(const CommunicatorCache&) = delete;
  CommunicatorCache& operator=(const CommunicatorCache&) = delete;
  // Aborts the kept communicators (their peers may be gone: they are not
  // drained).
  ~CommunicatorCache();

  // Lends the communicator of reuse key `key` in slot `slot` as rank `rank` of
  // `world_size`: the one kept from an earlier request of the key (*reused =
  // true), else a new one the connector makes with `key` as its group, in at
  // most `timeout` (*reused = false). Destroying what this returns gives the
  // communicator back: it is kept for the key's next request if every call on
  // it succeeded, no transfer is left started and it was never aborted;
  // otherwise it is destroyed (an NCCL communicator is then aborted, never
  // finalized).
  //
  // A key other than the last one seen in its slot retires the slot's older
  // key: its kept communicator is aborted now, one still lent out when it
  // comes back.
  //
  // A new communicator's connect gives up once `*cancelled` (null: never)
  // turns true, as RingConnector::Connect says.
  //
  // Errors: those of the connector; INVALID_ARGUMENT for a slot outside [0,
  // kMostCommunicatorSlots); FAILED_PRECONDITION if the key's communicator is
  // lent to another request, was broken by an earlier one (or failed to come
  // up), or is of another rank or world size. None of these happens while the
  // coordinator lends each key to one request at a time and retires it after
  // a failure; they fail at once rather than hang on a rendezvous that is
  // already spent.
  absl::StatusOr<std::unique_ptr<RingCommunicator>> Lend(
      const std::string& key, int slot, int rank, int world_size,
      absl::Duration timeout, bool* reused,
      const std::atomic<bool>* cancelled = nullptr);

  // Communicators the connector made for the cache so far.
  int64_t creations() const;

 private:
  class Loan;

  // The last key seen in a slot and the state of its communicator: kept
  // (`idle`), lent out, or broken; none of these before its first Lend.
  struct Slot {
    std::string key;
    std::unique_ptr<RingCommunicator> idle;
    bool lent = false;
    bool broken = false;
  };

  // Takes back the communicator lent for `key` in `slot`; `healthy`: whether
  // the run over it ended cleanly.
  void GiveBack(int slot, const std::string& key,
                std::unique_ptr<RingCommunicator> communicator, bool healthy);

  RingConnector& connector_;
  mutable absl::Mutex mutex_;
  std::map<int, Slot> slots_ ABSL_GUARDED_BY(mutex_);
  int64_t creations_ ABSL_GUARDED_BY(mutex_) = 0;
};

}  // namespace ringattn

#endif  // RINGATTN_WORKER_COMMUNICATOR_CACHE_H_
