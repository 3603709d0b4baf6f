#include "server/communicator_keys.h"

#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace ringattn {

CommunicatorKeys::Lease::Lease(Lease&& other) noexcept
    : keys_(other.keys_),
      key_(std::move(other.key_)),
      slot_(other.slot_),
      first_use_(other.first_use_),
      succeeded_(other.succeeded_) {
  other.keys_ = nullptr;
  other.key_.clear();
}

CommunicatorKeys::Lease& CommunicatorKeys::Lease::operator=(
    Lease&& other) noexcept {
  if (this != &other) {
    Release();
    keys_ = other.keys_;
    key_ = std::move(other.key_);
    slot_ = other.slot_;
    first_use_ = other.first_use_;
    succeeded_ = other.succeeded_;
    other.keys_ = nullptr;
    other.key_.clear();
  }
  return *this;
}

CommunicatorKeys::Lease::~Lease() { Release(); }

void CommunicatorKeys::Lease::Release() {
  if (keys_ != nullptr) keys_->Release(slot_, key_, succeeded_);
  keys_ = nullptr;
  key_.clear();
}

CommunicatorKeys::CommunicatorKeys(RendezvousStore& store, std::string instance,
                                   int slots)
    : store_(store),
      instance_(std::move(instance)),
      slot_count_(std::max(slots, 1)),
      slots_(static_cast<size_t>(slot_count_)) {}

std::string CommunicatorKeys::NewInstance() {
  return absl::StrCat(absl::Hex(getpid()), "-",
                      absl::Hex(absl::ToUnixNanos(absl::Now())));
}

CommunicatorKeys::Lease CommunicatorKeys::Acquire(int64_t epoch,
                                                  Prefer prefer) {
  absl::MutexLock lock(&mutex_);
  auto free_of = [&](bool made) -> Slot* {
    for (Slot& slot : slots_) {
      if (!slot.held && (slot.used && slot.epoch == epoch) == made) {
        return &slot;
      }
    }
    return nullptr;
  };
  const bool made = prefer == Prefer::kMade;
  Slot* slot = free_of(made);
  if (slot == nullptr) slot = free_of(!made);
  if (slot == nullptr) return Lease();
  if (slot->key.empty() || slot->epoch != epoch) {
    slot->epoch = epoch;
    Retire(*slot);
  }
  const bool first_use = !slot->used;
  slot->used = true;
  slot->held = true;
  return Lease(this, slot->key, static_cast<int>(slot - slots_.data()),
               first_use);
}

bool CommunicatorKeys::Reusable(int64_t epoch) {
  absl::MutexLock lock(&mutex_);
  return std::any_of(slots_.begin(), slots_.end(), [&](const Slot& slot) {
    return !slot.held && slot.used && slot.epoch == epoch;
  });
}

void CommunicatorKeys::Release(int slot, const std::string& key,
                               bool succeeded) {
  absl::MutexLock lock(&mutex_);
  Slot& released = slots_[static_cast<size_t>(slot)];
  if (key != released.key) return;
  released.held = false;
  if (!succeeded) Retire(released);
}

void CommunicatorKeys::Retire(Slot& slot) {
  if (!slot.key.empty()) store_.EraseWithPrefix(absl::StrCat(slot.key, "/"));
  ++generation_;
  slot.key = absl::StrCat("communicator/", instance_, "/epoch-", slot.epoch,
                          "/generation-", generation_);
  slot.used = false;
}

}  // namespace ringattn
