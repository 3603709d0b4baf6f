#include "worker/communicator_cache.h"

#include <atomic>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ringattn {

// A kept communicator as lent to one request: forwards every call and notes
// whether the run over it stayed healthy; gives the communicator back to the
// cache when destroyed. Thread-compatible apart from Abort(), like the
// communicator it wraps.
class CommunicatorCache::Loan final : public RingCommunicator {
 public:
  Loan(CommunicatorCache& cache, int slot, std::string key,
       std::unique_ptr<RingCommunicator> communicator)
      : cache_(cache),
        slot_(slot),
        key_(std::move(key)),
        communicator_(std::move(communicator)) {}

  Loan(const Loan&) = delete;
  Loan& operator=(const Loan&) = delete;
  ~Loan() override {
    const bool healthy = !failed_ && !started_ && !aborted_;
    cache_.GiveBack(slot_, key_, std::move(communicator_), healthy);
  }

  int rank() const override { return communicator_->rank(); }
  int world_size() const override { return communicator_->world_size(); }

  absl::Status StartSend(const void* data, int64_t bytes, int peer) override {
    return Note(communicator_->StartSend(data, bytes, peer), true);
  }
  absl::Status StartReceive(void* data, int64_t bytes, int peer) override {
    return Note(communicator_->StartReceive(data, bytes, peer), true);
  }
  absl::Status Wait(absl::Time deadline) override {
    return Note(communicator_->Wait(deadline), false);
  }
  void Abort() override {
    aborted_ = true;
    communicator_->Abort();
  }

 private:
  // Records the outcome of a call that leaves transfers started
  // (`started`) or completed, and returns it.
  absl::Status Note(absl::Status status, bool started) {
    if (!status.ok()) failed_ = true;
    started_ = started;
    return status;
  }

  CommunicatorCache& cache_;
  const int slot_;
  const std::string key_;
  std::unique_ptr<RingCommunicator> communicator_;
  bool failed_ = false;   // some call returned an error
  bool started_ = false;  // a transfer was started and not waited for
  std::atomic<bool> aborted_{false};
};

CommunicatorCache::CommunicatorCache(RingConnector& connector)
    : connector_(connector) {}

CommunicatorCache::~CommunicatorCache() {
  for (auto& [index, slot] : slots_) {
    if (slot.idle != nullptr) slot.idle->Abort();
  }
}

absl::StatusOr<std::unique_ptr<RingCommunicator>> CommunicatorCache::Lend(
    const std::string& key, int slot, int rank, int world_size,
    absl::Duration timeout, bool* reused, const std::atomic<bool>* cancelled) {
  *reused = false;
  if (slot < 0 || slot >= kMostCommunicatorSlots) {
    return absl::InvalidArgumentError(
        absl::StrCat("communicator_slot ", slot, " is outside [0, ",
                     kMostCommunicatorSlots, ")"));
  }
  std::unique_ptr<RingCommunicator> retired;
  std::unique_ptr<RingCommunicator> kept;
  {
    absl::MutexLock lock(&mutex_);
    Slot& state = slots_[slot];
    if (key != state.key) {
      retired = std::move(state.idle);
      state.key = key;
      state.lent = false;
      state.broken = false;
    }
    if (state.lent || state.broken) {
      return absl::FailedPreconditionError(
          absl::StrCat("the cached ring communicator '", key, "' is ",
                       state.lent ? "lent to another request"
                                  : "broken by an earlier request",
                       "; the coordinator must name a new communicator key"));
    }
    if (state.idle != nullptr && (state.idle->rank() != rank ||
                                  state.idle->world_size() != world_size)) {
      return absl::FailedPreconditionError(
          absl::StrCat("the cached ring communicator '", key, "' is rank ",
                       state.idle->rank(), " of ", state.idle->world_size(),
                       ", not rank ", rank, " of ", world_size));
    }
    kept = std::move(state.idle);
    state.lent = true;
  }
  // The older key's peers may be gone: abort rather than drain.
  if (retired != nullptr) {
    retired->Abort();
    retired.reset();
  }
  if (kept != nullptr) {
    *reused = true;
    return std::unique_ptr<RingCommunicator>(
        new Loan(*this, slot, key, std::move(kept)));
  }
  absl::StatusOr<std::unique_ptr<RingCommunicator>> made =
      connector_.Connect(key, rank, world_size, timeout, cancelled);
  absl::MutexLock lock(&mutex_);
  if (!made.ok()) {
    // The key's rendezvous is spent; only a new key can make another.
    if (Slot& state = slots_[slot]; key == state.key) {
      state.lent = false;
      state.broken = true;
    }
    return made.status();
  }
  ++creations_;
  return std::unique_ptr<RingCommunicator>(
      new Loan(*this, slot, key, *std::move(made)));
}

int64_t CommunicatorCache::creations() const {
  absl::MutexLock lock(&mutex_);
  return creations_;
}

void CommunicatorCache::GiveBack(int slot, const std::string& key,
                                 std::unique_ptr<RingCommunicator> communicator,
                                 bool healthy) {
  {
    absl::MutexLock lock(&mutex_);
    if (Slot& state = slots_[slot]; key == state.key) {
      state.lent = false;
      if (healthy) {
        state.idle = std::move(communicator);
        return;
      }
      state.broken = true;
    }
  }
  // Retired or unhealthy: never drained, as a peer may be gone.
  communicator->Abort();
}

}  // namespace ringattn
