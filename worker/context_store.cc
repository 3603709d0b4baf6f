#include "worker/context_store.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace ringattn {
namespace {

// Context rows a core converts at a time.
constexpr int64_t kRowsPerRun = 256;

// Rows to convert from one [batch, n, heads, dim] tensor to another.
struct RowRun {
  TypedView from;
  int64_t from_row;
  TypedView to;
  int64_t to_row;
  int64_t count;
};

// Adds runs of at most kRowsPerRun rows for `count` rows from `from_row` of
// `from` to `to_row` of `to`, so that the cores share evenly.
void AddRuns(const TypedView& from, int64_t from_row, const TypedView& to,
             int64_t to_row, int64_t count, std::vector<RowRun>& runs) {
  for (int64_t at = 0; at < count; at += kRowsPerRun) {
    runs.push_back(RowRun{from, from_row + at, to, to_row + at,
                          std::min(kRowsPerRun, count - at)});
  }
}

// Converts `runs` on every core, every batch of each.
void ConvertRuns(const std::vector<RowRun>& runs, int64_t batch) {
  const int64_t total = static_cast<int64_t>(runs.size()) * batch;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = 0; i < total; ++i) {
    const RowRun& run = runs[i / batch];
    const int64_t b = i % batch;
    const Shape& shape = run.from.shape();
    ConvertDType(run.from.dtype(), run.from.Row(b, run.from_row),
                 run.to.dtype(), run.to.Row(b, run.to_row),
                 run.count * shape.heads * shape.dim);
  }
}

}  // namespace

int64_t ContextStore::RowBytes(const Context& context) {
  return context.layout.kv_heads * context.layout.head_dim *
         DTypeSize(context.dtype);
}

int64_t ContextStore::CapacityOf(const Context& context) {
  return context.buffers ? context.buffers->k.view().shape().seq : 0;
}

int64_t ContextStore::BytesOf(const Context& context) {
  return 2 * context.layout.batch * CapacityOf(context) * RowBytes(context);
}

absl::StatusOr<const ContextStore::Context*> ContextStore::Lookup(
    const std::string& name) const {
  auto found = contexts_.find(name);
  if (found == contexts_.end()) {
    return absl::NotFoundError(
        absl::StrCat("context '", name, "' is not held by this worker"));
  }
  return &found->second;
}

int64_t ContextStore::HeldBytes() const {
  int64_t bytes = 0;
  for (const auto& [name, context] : contexts_) bytes += BytesOf(context);
  return bytes;
}

absl::Status ContextStore::Reserve(Context& context, int64_t rows) {
  if (rows <= CapacityOf(context)) return absl::OkStatus();
  const int64_t capacity = context.buffers ? GrownCapacity(rows) : rows;
  const int64_t batch = context.layout.batch;
  RINGATTN_RETURN_IF_ERROR(CheckContextRoom(
      "this worker's context memory", HeldBytes(), capacity_,
      2 * batch * capacity * RowBytes(context) - BytesOf(context)));
  const Shape shape{batch, capacity, context.layout.kv_heads,
                    context.layout.head_dim};
  auto buffers = std::make_shared<Buffers>();
  buffers->k = TypedTensor(context.dtype, shape);
  buffers->v = TypedTensor(context.dtype, shape);
  const int64_t held_rows = context.held.rows();
  if (held_rows > 0) {
    std::vector<RowRun> runs;
    AddRuns(context.buffers->k.view(), 0, buffers->k.view(), 0, held_rows,
            runs);
    AddRuns(context.buffers->v.view(), 0, buffers->v.view(), 0, held_rows,
            runs);
    ConvertRuns(runs, batch);
  }
  context.buffers = std::move(buffers);
  return absl::OkStatus();
}

absl::StatusOr<int64_t> ContextStore::Add(const std::string& name, bool create,
                                          const Layout& layout, Range positions,
                                          TypedTensor k, TypedTensor v) {
  absl::MutexLock lock(&mutex_);
  auto found = contexts_.find(name);
  const bool exists = found != contexts_.end();
  RINGATTN_RETURN_IF_ERROR(CheckAddition(
      name, create, exists, exists ? found->second.layout : Layout{}, layout));
  if (exists) {
    RINGATTN_RETURN_IF_ERROR(found->second.held.CheckAppend(name, positions));
  }
  Context fresh;
  if (!exists) {
    fresh.layout = layout;
    fresh.dtype =
        k.dtype() == DType::kBFloat16 ? DType::kBFloat16 : DType::kFloat32;
  }
  Context& context = exists ? found->second : fresh;
  const int64_t count = positions.size();
  if (count > 0 && context.buffers == nullptr && k.dtype() == context.dtype &&
      v.dtype() == context.dtype) {
    // The first rows, already in the context's dtype, become its buffers.
    RINGATTN_RETURN_IF_ERROR(
        CheckContextRoom("this worker's context memory", HeldBytes(), capacity_,
                         k.view().bytes() + v.view().bytes()));
    context.buffers =
        std::make_shared<Buffers>(Buffers{std::move(k), std::move(v)});
    context.held.Append(positions);
  } else if (count > 0) {
    const int64_t at = context.held.rows();
    RINGATTN_RETURN_IF_ERROR(Reserve(context, at + count));
    std::vector<RowRun> runs;
    AddRuns(k.view(), 0, context.buffers->k.view(), at, count, runs);
    AddRuns(v.view(), 0, context.buffers->v.view(), at, count, runs);
    ConvertRuns(runs, layout.batch);
    context.held.Append(positions);
  }
  const int64_t bytes = BytesOf(context);
  if (!exists) contexts_.emplace(name, std::move(fresh));
  CountAddition();
  return bytes;
}

void ContextStore::Drop(const std::string& name, int64_t keep_length) {
  absl::MutexLock lock(&mutex_);
  auto found = contexts_.find(name);
  if (found == contexts_.end()) return;
  if (keep_length <= 0) {
    contexts_.erase(found);
    return;
  }
  found->second.held.DropFrom(keep_length);
}

int64_t ContextStore::bytes_in_use() {
  absl::MutexLock lock(&mutex_);
  return HeldBytes();
}

absl::StatusOr<DType> ContextStore::HeldDType(const std::string& name) {
  absl::MutexLock lock(&mutex_);
  absl::StatusOr<const Context*> context = Lookup(name);
  if (!context.ok()) return context.status();
  return (*context)->dtype;
}

absl::StatusOr<ResidentRows> ContextStore::Find(
    const std::string& name, const std::vector<Range>& chunks) {
  absl::MutexLock lock(&mutex_);
  absl::StatusOr<const Context*> found = Lookup(name);
  if (!found.ok()) return found.status();
  const Context& context = **found;
  absl::StatusOr<Range> rows = context.held.RowsOf(name, chunks);
  if (!rows.ok()) return rows.status();
  ResidentRows resident;
  if (!context.buffers) {  // nothing held yet: no rows
    const View<const float> none(
        nullptr, Shape{context.layout.batch, 0, context.layout.kv_heads,
                       context.layout.head_dim});
    resident.k = none;
    resident.v = none;
    return resident;
  }
  resident.k = KvRowsOf(context.buffers->k.view(), rows->begin, rows->size());
  resident.v = KvRowsOf(context.buffers->v.view(), rows->begin, rows->size());
  resident.keep_alive = context.buffers;
  return resident;
}

absl::Status ContextStore::Copy(const std::string& name,
                                const std::vector<Range>& chunks,
                                const TypedView& k, const TypedView& v) {
  absl::MutexLock lock(&mutex_);
  absl::StatusOr<const Context*> found = Lookup(name);
  if (!found.ok()) return found.status();
  const Context& context = **found;
  std::vector<RowRun> runs;
  int64_t row = 0;
  for (const Range& chunk : chunks) {
    absl::StatusOr<std::vector<HeldPositions::RowRun>> held =
        context.held.RunsOf(name, chunk);
    if (!held.ok()) return held.status();
    for (const HeldPositions::RowRun& run : *held) {
      AddRuns(context.buffers->k.view(), run.row, k, row, run.count, runs);
      AddRuns(context.buffers->v.view(), run.row, v, row, run.count, runs);
      row += run.count;
    }
  }
  ConvertRuns(runs, k.shape().batch);
  return absl::OkStatus();
}

}  // namespace ringattn
