#include "worker/context_store.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace ringattn {
namespace {

// Context rows a core converts at a time.
constexpr int64_t kRowsPerRun = 256;
// Spare rows after a reallocation, as a fraction of the rows needed.
constexpr int64_t kGrowthSpareDivisor = 8;

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

// K or V rows [first, first + rows) of a [batch, capacity, heads, dim] buffer
// as the kernels read them.
KvView RowsOf(const TypedTensor& buffer, int64_t first, int64_t rows) {
  const Shape& shape = buffer.shape();
  const int64_t seq_stride = shape.heads * shape.dim;
  const Shape view_shape{shape.batch, rows, shape.heads, shape.dim};
  const int64_t offset = first * seq_stride;
  if (buffer.dtype() == DType::kBFloat16) {
    return KvView::BFloat16(View<const uint16_t>(
        reinterpret_cast<const uint16_t*>(buffer.view().data()) + offset,
        view_shape, shape.seq * seq_stride, seq_stride));
  }
  return View<const float>(
      reinterpret_cast<const float*>(buffer.view().data()) + offset, view_shape,
      shape.seq * seq_stride, seq_stride);
}

}  // namespace

int64_t ContextStore::RowBytes(const Context& context) {
  return context.layout.kv_heads * context.layout.head_dim *
         DTypeSize(context.dtype);
}

int64_t ContextStore::BytesOf(const Context& context) {
  return context.buffers ? 2 * context.layout.batch *
                               context.buffers->capacity * RowBytes(context)
                         : 0;
}

const ContextStore::Piece* ContextStore::PieceHolding(const Context& context,
                                                      int64_t position) {
  auto piece = std::upper_bound(
      context.pieces.begin(), context.pieces.end(), position,
      [](int64_t p, const Piece& piece) { return p < piece.positions.begin; });
  if (piece == context.pieces.begin()) return nullptr;
  --piece;
  return position < piece->positions.end ? &*piece : nullptr;
}

int64_t ContextStore::RowOf(const Context& context, int64_t position) {
  const Piece* piece = PieceHolding(context, position);
  return piece == nullptr
             ? -1
             : piece->first_row + position - piece->positions.begin;
}

int64_t ContextStore::HeldBytes() const {
  int64_t bytes = 0;
  for (const auto& [name, context] : contexts_) bytes += BytesOf(context);
  return bytes;
}

absl::Status ContextStore::Reserve(Context& context, int64_t rows) {
  const int64_t held = context.buffers ? context.buffers->capacity : 0;
  if (rows <= held) return absl::OkStatus();
  const int64_t capacity =
      context.buffers ? rows + rows / kGrowthSpareDivisor : rows;
  const int64_t batch = context.layout.batch;
  const int64_t old_bytes = BytesOf(context);
  const int64_t new_bytes = 2 * batch * capacity * RowBytes(context);
  const int64_t in_use = HeldBytes();
  if (in_use - old_bytes + new_bytes > capacity_) {
    return ContextMemoryFull("this worker's context memory", in_use, capacity_,
                             new_bytes - old_bytes);
  }
  const Shape shape{batch, capacity, context.layout.kv_heads,
                    context.layout.head_dim};
  auto buffers = std::make_shared<Buffers>();
  buffers->k = TypedTensor(context.dtype, shape);
  buffers->v = TypedTensor(context.dtype, shape);
  buffers->capacity = capacity;
  if (context.rows() > 0) {
    std::vector<RowRun> runs;
    AddRuns(context.buffers->k.view(), 0, buffers->k.view(), 0, context.rows(),
            runs);
    AddRuns(context.buffers->v.view(), 0, buffers->v.view(), 0, context.rows(),
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
  if (exists && !found->second.pieces.empty() &&
      positions.begin < found->second.pieces.back().positions.end) {
    return absl::InvalidArgumentError(absl::StrCat(
        "context '", name, "' holds positions up to ",
        found->second.pieces.back().positions.end,
        " on this worker; a worker takes new rows only after those, got [",
        positions.begin, ", ", positions.end, ")"));
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
    const int64_t in_use = HeldBytes();
    const int64_t added = k.view().bytes() + v.view().bytes();
    if (in_use + added > capacity_) {
      return ContextMemoryFull("this worker's context memory", in_use,
                               capacity_, added);
    }
    context.buffers =
        std::make_shared<Buffers>(Buffers{std::move(k), std::move(v), count});
    context.pieces.push_back(Piece{positions, 0});
  } else if (count > 0) {
    RINGATTN_RETURN_IF_ERROR(Reserve(context, context.rows() + count));
    std::vector<RowRun> runs;
    AddRuns(k.view(), 0, context.buffers->k.view(), context.rows(), count,
            runs);
    AddRuns(v.view(), 0, context.buffers->v.view(), context.rows(), count,
            runs);
    ConvertRuns(runs, layout.batch);
    context.pieces.push_back(Piece{positions, context.rows()});
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
  Context& context = found->second;
  if (keep_length <= 0) {
    contexts_.erase(found);
    return;
  }
  while (!context.pieces.empty() &&
         context.pieces.back().positions.begin >= keep_length) {
    context.pieces.pop_back();
  }
}

int64_t ContextStore::bytes_in_use() {
  absl::MutexLock lock(&mutex_);
  return HeldBytes();
}

absl::StatusOr<DType> ContextStore::DTypeOf(const std::string& name) {
  absl::MutexLock lock(&mutex_);
  auto found = contexts_.find(name);
  if (found == contexts_.end()) {
    return absl::NotFoundError(
        absl::StrCat("context '", name, "' is not held by this worker"));
  }
  return found->second.dtype;
}

absl::StatusOr<ResidentRows> ContextStore::Find(
    const std::string& name, const std::vector<Range>& chunks) {
  absl::MutexLock lock(&mutex_);
  auto found = contexts_.find(name);
  if (found == contexts_.end()) {
    return absl::NotFoundError(
        absl::StrCat("context '", name, "' is not held by this worker"));
  }
  const Context& context = found->second;
  int64_t first = -1;
  int64_t rows = 0;
  for (const Range& chunk : chunks) {
    if (chunk.empty()) continue;
    const int64_t begin = RowOf(context, chunk.begin);
    const int64_t last = RowOf(context, chunk.end - 1);
    if (begin < 0 || last < 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("context '", name, "' positions [", chunk.begin, ", ",
                       chunk.end, ") are not all held by this worker"));
    }
    if (last - begin != chunk.size() - 1 ||
        (first >= 0 && begin != first + rows)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "context '", name, "' positions [", chunk.begin, ", ", chunk.end,
          ") are not the rows that follow the query's previous ones here"));
    }
    if (first < 0) first = begin;
    rows += chunk.size();
  }
  ResidentRows resident;
  if (!context.buffers) {  // nothing held yet: no rows
    const View<const float> none(
        nullptr, Shape{context.layout.batch, 0, context.layout.kv_heads,
                       context.layout.head_dim});
    resident.k = none;
    resident.v = none;
    return resident;
  }
  first = std::max<int64_t>(first, 0);
  resident.k = RowsOf(context.buffers->k, first, rows);
  resident.v = RowsOf(context.buffers->v, first, rows);
  resident.keep_alive = context.buffers;
  return resident;
}

absl::Status ContextStore::Copy(const std::string& name,
                                const std::vector<Range>& chunks,
                                const TypedView& k, const TypedView& v) {
  std::vector<RowRun> runs;
  absl::MutexLock lock(&mutex_);
  auto found = contexts_.find(name);
  if (found == contexts_.end()) {
    return absl::NotFoundError(
        absl::StrCat("context '", name, "' is not held by this worker"));
  }
  const Context& context = found->second;
  int64_t row = 0;
  for (const Range& chunk : chunks) {
    for (int64_t p = chunk.begin; p < chunk.end;) {
      const Piece* piece = PieceHolding(context, p);
      if (piece == nullptr) {
        return absl::FailedPreconditionError(
            absl::StrCat("context '", name, "' position ", p,
                         " is not held by this worker"));
      }
      const int64_t from = piece->first_row + p - piece->positions.begin;
      // The rest of the chunk, up to the end of the piece holding p.
      const int64_t end = std::min(chunk.end, piece->positions.end);
      AddRuns(context.buffers->k.view(), from, k, row, end - p, runs);
      AddRuns(context.buffers->v.view(), from, v, row, end - p, runs);
      row += end - p;
      p = end;
    }
  }
  ConvertRuns(runs, k.shape().batch);
  return absl::OkStatus();
}

}  // namespace ringattn
