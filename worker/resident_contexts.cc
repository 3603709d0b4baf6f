#include "worker/resident_contexts.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ringattn {

int64_t ResidentContexts::additions() {
  absl::MutexLock lock(&additions_mutex_);
  return additions_;
}

bool ResidentContexts::AwaitAddition(int64_t seen, absl::Time deadline) {
  absl::MutexLock lock(&additions_mutex_);
  auto added = [this, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(additions_mutex_) {
    return additions_ > seen;
  };
  return additions_mutex_.AwaitWithDeadline(absl::Condition(&added), deadline);
}

absl::StatusOr<int64_t> ResidentContexts::AddUnlessUndone(
    const std::string& name, bool create, const Layout& layout, Range positions,
    TypedTensor k, TypedTensor v, int64_t undone_appends) {
  absl::MutexLock lock(&undo_mutex_);
  auto undone = undone_appends_.find(name);
  if (!create && undone != undone_appends_.end() &&
      undone->second > undone_appends) {
    return absl::AbortedError(absl::StrCat(
        "the append of positions [", positions.begin, ", ", positions.end,
        ") to context '", name, "' was undone before its rows arrived"));
  }
  return Add(name, create, layout, positions, std::move(k), std::move(v));
}

void ResidentContexts::Undo(const std::string& name, int64_t keep_length,
                            int64_t undone_appends) {
  absl::MutexLock lock(&undo_mutex_);
  if (keep_length <= 0) {
    undone_appends_.erase(name);
  } else {
    int64_t& undone = undone_appends_[name];
    undone = std::max(undone, undone_appends);
  }
  Drop(name, keep_length);
}

void ResidentContexts::CountAddition() {
  absl::MutexLock lock(&additions_mutex_);
  ++additions_;
}

absl::Status CheckAddition(const std::string& name, bool create, bool exists,
                           const ResidentContexts::Layout& has,
                           const ResidentContexts::Layout& layout) {
  if (create && exists) {
    return absl::AlreadyExistsError(
        absl::StrCat("context '", name, "' already exists on this worker"));
  }
  if (!create && !exists) {
    return absl::NotFoundError(
        absl::StrCat("context '", name, "' is not held by this worker"));
  }
  if (exists && (has.batch != layout.batch || has.kv_heads != layout.kv_heads ||
                 has.head_dim != layout.head_dim)) {
    return absl::InvalidArgumentError(
        absl::StrCat("context '", name, "' holds batch ", has.batch, ", ",
                     has.kv_heads, " heads of dim ", has.head_dim,
                     "; the new rows have batch ", layout.batch, ", ",
                     layout.kv_heads, " heads of dim ", layout.head_dim));
  }
  return absl::OkStatus();
}

absl::Status CheckContextRoom(const char* where, int64_t in_use,
                              int64_t capacity, int64_t added) {
  if (in_use + added <= capacity) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      where, " is full: ", in_use, " of ", capacity, " bytes in use, ", added,
      " more needed; delete contexts or add workers"));
}

int64_t GrownCapacity(int64_t rows) { return rows + rows / 8; }

}  // namespace ringattn
