#include "server/rendezvous_store.h"

#include "absl/strings/str_cat.h"

namespace ringattn {

void RendezvousStore::Set(const std::string& key, const std::string& value) {
  absl::MutexLock lock(&mutex_);
  values_[key] = value;
}

absl::StatusOr<std::vector<std::string>> RendezvousStore::Get(
    const std::vector<std::string>& keys, absl::Time deadline) {
  absl::MutexLock lock(&mutex_);
  auto all_present = [&]() {
    for (const std::string& key : keys) {
      if (values_.find(key) == values_.end()) return false;
    }
    return true;
  };
  if (!mutex_.AwaitWithDeadline(absl::Condition(&all_present), deadline)) {
    for (const std::string& key : keys) {
      if (values_.find(key) == values_.end()) {
        return absl::DeadlineExceededError(
            absl::StrCat("rendezvous key '", key,
                         "' was not set in time (a peer worker "
                         "did not join the request)"));
      }
    }
  }
  std::vector<std::string> values;
  values.reserve(keys.size());
  for (const std::string& key : keys) values.push_back(values_[key]);
  return values;
}

void RendezvousStore::EraseWithPrefix(const std::string& prefix) {
  absl::MutexLock lock(&mutex_);
  auto it = values_.lower_bound(prefix);
  while (it != values_.end() &&
         it->first.compare(0, prefix.size(), prefix) == 0) {
    it = values_.erase(it);
  }
}

size_t RendezvousStore::size() {
  absl::MutexLock lock(&mutex_);
  return values_.size();
}

}  // namespace ringattn
