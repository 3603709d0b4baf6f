#include "server/context_registry.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace ringattn {

v1::ContextInfo ResidentContext::Info() const {
  v1::ContextInfo info;
  info.set_name(name);
  info.set_batch(batch);
  info.set_length(length);
  info.set_kv_heads(kv_heads);
  info.set_head_dim(head_dim);
  info.set_bytes(bytes);
  for (size_t rank = 0; rank < addresses.size(); ++rank) {
    v1::ContextPart& part = *info.add_parts();
    part.set_rank(static_cast<int32_t>(rank));
    part.set_address(addresses[rank]);
    if (rank < worker_bytes.size()) part.set_bytes(worker_bytes[rank]);
    if (rank < worker_dtypes.size()) part.set_dtype(worker_dtypes[rank]);
  }
  return info;
}

absl::StatusOr<ResidentContext> ContextRegistry::BeginUpload(
    const std::string& name, bool create) {
  absl::MutexLock lock(&mutex_);
  Entry& entry = entries_[name];
  if (entry.uploading) {
    return absl::AbortedError(absl::StrCat("another upload to context '", name,
                                           "' is in progress; retry after it"));
  }
  if (create && entry.committed.has_value()) {
    return absl::AlreadyExistsError(
        absl::StrCat("context '", name,
                     "' already exists; append to it or delete it first"));
  }
  if (!create && !entry.committed.has_value()) {
    entries_.erase(name);
    return absl::NotFoundError(absl::StrCat(
        "no context named '", name, "'; create it with CreateContext first"));
  }
  entry.uploading = true;
  if (create) {
    ResidentContext fresh;
    fresh.name = name;
    return fresh;
  }
  return *entry.committed;
}

void ContextRegistry::EndUpload(const std::string& name,
                                std::optional<ResidentContext> committed) {
  absl::MutexLock lock(&mutex_);
  Entry& entry = entries_[name];
  entry.uploading = false;
  if (committed.has_value()) entry.committed = std::move(committed);
  if (!entry.committed.has_value()) entries_.erase(name);
}

absl::StatusOr<ResidentContext> ContextRegistry::Find(const std::string& name) {
  absl::MutexLock lock(&mutex_);
  auto found = entries_.find(name);
  if (found == entries_.end() || !found->second.committed.has_value()) {
    return absl::NotFoundError(absl::StrCat(
        "no context named '", name, "'; create it with CreateContext first"));
  }
  return *found->second.committed;
}

absl::StatusOr<ResidentContext> ContextRegistry::Remove(
    const std::string& name) {
  absl::MutexLock lock(&mutex_);
  auto found = entries_.find(name);
  if (found == entries_.end() || !found->second.committed.has_value()) {
    return absl::NotFoundError(absl::StrCat("no context named '", name, "'"));
  }
  if (found->second.uploading) {
    return absl::AbortedError(absl::StrCat("an upload to context '", name,
                                           "' is in progress; retry after it"));
  }
  ResidentContext removed = std::move(*found->second.committed);
  entries_.erase(found);
  return removed;
}

std::vector<ResidentContext> ContextRegistry::List() {
  absl::MutexLock lock(&mutex_);
  std::vector<ResidentContext> contexts;
  for (const auto& [name, entry] : entries_) {
    if (entry.committed.has_value()) contexts.push_back(*entry.committed);
  }
  return contexts;
}

std::vector<Range> BalancedRuns(const std::vector<int64_t>& held,
                                int64_t length, int64_t count, int64_t last,
                                int64_t slack) {
  const int64_t workers = static_cast<int64_t>(held.size());
  const int64_t total = length + count;
  if (last >= 0 && last < workers &&
      held[last] + count <= (total + workers - 1) / workers + slack) {
    std::vector<Range> runs(static_cast<size_t>(workers),
                            Range{length, length});
    runs[last] = Range{length, total};
    for (int64_t w = last + 1; w < workers; ++w) runs[w] = Range{total, total};
    return runs;
  }
  // Fill the emptiest workers first towards total / workers (the first
  // total % workers of them, by fill order, one more).
  std::vector<int64_t> order(static_cast<size_t>(workers));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return held[a] < held[b]; });
  std::vector<int64_t> take(static_cast<size_t>(workers), 0);
  int64_t left = count;
  for (int64_t i = 0; i < workers; ++i) {
    const int64_t w = order[i];
    const int64_t target = total / workers + (i < total % workers ? 1 : 0);
    take[w] = std::min(left, std::max<int64_t>(0, target - held[w]));
    left -= take[w];
  }
  for (int64_t i = 0; left > 0; i = (i + 1) % workers, --left) ++take[order[i]];
  std::vector<Range> runs(static_cast<size_t>(workers));
  int64_t begin = length;
  for (int64_t w = 0; w < workers; ++w) {
    runs[w] = Range{begin, begin + take[w]};
    begin += take[w];
  }
  return runs;
}

}  // namespace ringattn
