#include "worker/context_store.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace ringattn {
namespace {

// Context rows a core converts at a time when a query copies them.
constexpr int64_t kRowsPerRun = 256;

}  // namespace

absl::StatusOr<int64_t> ContextStore::Add(const std::string& name, bool create,
                                          const Layout& layout, Range positions,
                                          TypedTensor k, TypedTensor v) {
  absl::MutexLock lock(&mutex_);
  auto found = contexts_.find(name);
  const bool exists = found != contexts_.end();
  RINGATTN_RETURN_IF_ERROR(CheckAddition(
      name, create, exists, exists ? found->second.layout : Layout{}, layout));
  if (!create) {
    for (const auto& [first, piece] : found->second.pieces) {
      if (!piece.positions.Intersect(positions).empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "context '", name, "' already holds positions [",
            piece.positions.begin, ", ", piece.positions.end, ")"));
      }
    }
  }
  const int64_t added = k.view().bytes() + v.view().bytes();
  if (bytes_ + added > capacity_) {
    return ContextMemoryFull("this worker's context memory", bytes_, capacity_,
                             added);
  }
  Context& context = contexts_[name];
  context.layout = layout;
  if (!positions.empty()) {
    context.pieces[positions.begin] =
        Piece{positions, std::move(k), std::move(v)};
  }
  context.bytes += added;
  bytes_ += added;
  CountAddition();
  return context.bytes;
}

void ContextStore::Drop(const std::string& name, int64_t keep_length) {
  absl::MutexLock lock(&mutex_);
  auto found = contexts_.find(name);
  if (found == contexts_.end()) return;
  Context& context = found->second;
  if (keep_length <= 0) {
    bytes_ -= context.bytes;
    contexts_.erase(found);
    return;
  }
  for (auto piece = context.pieces.lower_bound(keep_length);
       piece != context.pieces.end();) {
    const int64_t freed =
        piece->second.k.view().bytes() + piece->second.v.view().bytes();
    context.bytes -= freed;
    bytes_ -= freed;
    piece = context.pieces.erase(piece);
  }
}

absl::Status ContextStore::Copy(const std::string& name,
                                const std::vector<Range>& chunks,
                                const TypedView& k, const TypedView& v) {
  // Where each run of rows comes from and goes to, then the runs converted
  // on every core: a long context's rows are most of a query's bytes.
  struct Run {
    TypedView from_k, from_v;
    int64_t from_row;
    int64_t to_row;
    int64_t count;
  };
  std::vector<Run> runs;
  absl::MutexLock lock(&mutex_);
  auto found = contexts_.find(name);
  if (found == contexts_.end()) {
    return absl::NotFoundError(
        absl::StrCat("context '", name, "' is not held by this worker"));
  }
  const std::map<int64_t, Piece>& pieces = found->second.pieces;
  int64_t row = 0;
  for (const Range& chunk : chunks) {
    for (int64_t p = chunk.begin; p < chunk.end;) {
      auto piece = pieces.upper_bound(p);
      if (piece == pieces.begin() || (--piece)->second.positions.end <= p) {
        return absl::FailedPreconditionError(
            absl::StrCat("context '", name, "' position ", p,
                         " is not held by this worker"));
      }
      const Piece& held = piece->second;
      const int64_t end = std::min(chunk.end, held.positions.end);
      // Runs of at most kRowsPerRun rows, so that the cores share evenly.
      for (int64_t at = p; at < end; at += kRowsPerRun) {
        const int64_t count = std::min(kRowsPerRun, end - at);
        runs.push_back({held.k.view(), held.v.view(), at - held.positions.begin,
                        row + at - p, count});
      }
      row += end - p;
      p = end;
    }
  }
  const int64_t values_per_row = k.shape().heads * k.shape().dim;
  const int64_t total = static_cast<int64_t>(runs.size()) * k.shape().batch;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = 0; i < total; ++i) {
    const Run& run = runs[i / k.shape().batch];
    const int64_t b = i % k.shape().batch;
    const int64_t values = run.count * values_per_row;
    ConvertDType(run.from_k.dtype(), run.from_k.Row(b, run.from_row), k.dtype(),
                 k.Row(b, run.to_row), values);
    ConvertDType(run.from_v.dtype(), run.from_v.Row(b, run.from_row), v.dtype(),
                 v.Row(b, run.to_row), values);
  }
  return absl::OkStatus();
}

bool ContextStore::HoldsOnlyBFloat16(const std::string& name) {
  absl::MutexLock lock(&mutex_);
  auto found = contexts_.find(name);
  if (found == contexts_.end()) return false;
  for (const auto& [first, piece] : found->second.pieces) {
    if (piece.k.dtype() != DType::kBFloat16 ||
        piece.v.dtype() != DType::kBFloat16) {
      return false;
    }
  }
  return true;
}

int64_t ContextStore::bytes_in_use() {
  absl::MutexLock lock(&mutex_);
  return bytes_;
}

}  // namespace ringattn
