#include "server/communicator_keys.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace ringattn {

CommunicatorKeys::Lease::Lease(Lease&& other) noexcept
    : keys_(other.keys_),
      key_(std::move(other.key_)),
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
    first_use_ = other.first_use_;
    succeeded_ = other.succeeded_;
    other.keys_ = nullptr;
    other.key_.clear();
  }
  return *this;
}

CommunicatorKeys::Lease::~Lease() { Release(); }

void CommunicatorKeys::Lease::Release() {
  if (keys_ != nullptr) keys_->Release(key_, succeeded_);
  keys_ = nullptr;
  key_.clear();
}

CommunicatorKeys::CommunicatorKeys(RendezvousStore& store, std::string instance)
    : store_(store), instance_(std::move(instance)) {}

std::string CommunicatorKeys::NewInstance() {
  return absl::StrCat(absl::Hex(getpid()), "-",
                      absl::Hex(absl::ToUnixNanos(absl::Now())));
}

CommunicatorKeys::Lease CommunicatorKeys::Acquire(int64_t epoch) {
  absl::MutexLock lock(&mutex_);
  if (held_) return Lease();
  if (key_.empty() || epoch != epoch_) {
    epoch_ = epoch;
    Retire();
  }
  const bool first_use = !used_;
  used_ = true;
  held_ = true;
  return Lease(this, key_, first_use);
}

bool CommunicatorKeys::Reusable(int64_t epoch) {
  absl::MutexLock lock(&mutex_);
  return !held_ && !key_.empty() && epoch == epoch_ && used_;
}

void CommunicatorKeys::Release(const std::string& key, bool succeeded) {
  absl::MutexLock lock(&mutex_);
  if (key != key_) return;
  held_ = false;
  if (!succeeded) Retire();
}

void CommunicatorKeys::Retire() {
  if (!key_.empty()) store_.EraseWithPrefix(absl::StrCat(key_, "/"));
  ++generation_;
  key_ = absl::StrCat("communicator/", instance_, "/epoch-", epoch_,
                      "/generation-", generation_);
  used_ = false;
}

}  // namespace ringattn
