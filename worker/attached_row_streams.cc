#include "worker/attached_row_streams.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace ringattn {
namespace {

// Closed keys remembered, so that a stream arriving after its Execute
// stream ended is refused instead of waiting for its deadline.
constexpr size_t kRememberedClosedKeys = 4096;

}  // namespace

absl::Status AttachedRowStreams::Closed(const std::string& key) {
  return absl::FailedPreconditionError(
      absl::StrCat("rows key '", key,
                   "': its Execute stream already ran or ended; attached rows "
                   "must finish before 'run'"));
}

absl::Status AttachedRowStreams::Open(const std::string& key,
                                      AttachedShard shard) {
  std::vector<Waiter*> waiting;
  {
    absl::MutexLock lock(&mutex_);
    if (closed_.count(key) > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("header: rows_key '", key, "' was used before"));
    }
    Entry& entry = entries_[key];
    if (entry.shard.intake != nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "header: rows_key '", key, "' is in use by another Execute stream"));
    }
    entry.shard = shard;
    waiting.swap(entry.waiting);
  }
  for (Waiter* waiter : waiting) waiter->Attach(shard);
  return absl::OkStatus();
}

void AttachedRowStreams::Close(const std::string& key) {
  std::vector<Waiter*> waiting;
  {
    absl::MutexLock lock(&mutex_);
    auto it = entries_.find(key);
    if (it != entries_.end()) {
      waiting.swap(it->second.waiting);
      entries_.erase(it);
    }
    RememberClosed(key);
  }
  for (Waiter* waiter : waiting) waiter->Refuse(Closed(key));
}

void AttachedRowStreams::Await(const std::string& key, Waiter* waiter) {
  AttachedShard shard;
  {
    absl::MutexLock lock(&mutex_);
    if (closed_.count(key) == 0) {
      Entry& entry = entries_[key];
      if (entry.shard.intake == nullptr) {
        entry.waiting.push_back(waiter);
        return;
      }
      shard = entry.shard;
    }
  }
  if (shard.intake == nullptr) {
    waiter->Refuse(Closed(key));
    return;
  }
  waiter->Attach(std::move(shard));
}

bool AttachedRowStreams::Forget(const std::string& key, Waiter* waiter) {
  absl::MutexLock lock(&mutex_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return false;
  std::vector<Waiter*>& waiting = it->second.waiting;
  for (auto w = waiting.begin(); w != waiting.end(); ++w) {
    if (*w != waiter) continue;
    waiting.erase(w);
    if (waiting.empty() && it->second.shard.intake == nullptr) {
      entries_.erase(it);
    }
    return true;
  }
  return false;
}

void AttachedRowStreams::RememberClosed(const std::string& key) {
  if (!closed_.insert(key).second) return;
  closed_order_.push_back(key);
  if (closed_order_.size() > kRememberedClosedKeys) {
    closed_.erase(closed_order_.front());
    closed_order_.pop_front();
  }
}

absl::Status RowsKeyClaim::Open(AttachedShard shard) {
  const absl::Status opened = streams_.Open(key_, std::move(shard));
  if (!opened.ok()) key_.clear();
  return opened;
}

void RowsKeyClaim::Close() {
  if (key_.empty()) return;
  streams_.Close(key_);
  key_.clear();
}

}  // namespace ringattn
