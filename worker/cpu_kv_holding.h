#ifndef RINGATTN_WORKER_CPU_KV_HOLDING_H_
#define RINGATTN_WORKER_CPU_KV_HOLDING_H_

// How the CPU executors hold K and V: in fp32, or in bf16 when the rows arrive
// in bf16 (the kernels read them at that width, which is exact, with half the
// bytes to copy, send and read); and for those that keep their K/V shard
// (broadcast-Q, pass-Q) possibly not at all, reading the rows of a resident
// context where they lie (ResidentRows). Pass-KV rings hold their travelling
// blocks in the same two dtypes.

#include <memory>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/attention_spec.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "core/typed_tensor.h"
#include "kernels/cpu/kv_view.h"

namespace ringattn {

struct CpuKvHolding {
  DType dtype = DType::kFloat32;  // of the executor's own buffers
  bool resident = false;          // rows of a resident context instead

  // The bytes the executor's own buffers take for `values` K and V values.
  double OwnBytes(double values) const {
    return resident ? 0 : static_cast<double>(DTypeSize(dtype)) * values;
  }
};

// Rows of a resident context as a query reads them in place: K and V
// [batch, rows, kv_heads, head_dim], fp32 or bf16. Keeps the memory alive
// while it exists.
struct ResidentRows {
  KvView k;
  KvView v;
  std::shared_ptr<const void> keep_alive;
};

// The K and V rows a CPU executor computes with: buffers of its own, or rows
// of a resident context given later. Thread-compatible.
class CpuKvRows {
 public:
  CpuKvRows() = default;
  // Buffers of `shape` ([batch, rows, kv_heads, head_dim]) in holding.dtype,
  // uninitialized; none when holding.resident.
  CpuKvRows(const CpuKvHolding& holding, const Shape& shape);

  const CpuKvHolding& holding() const { return holding_; }
  // The own buffers, where the caller loads the rows (empty when resident).
  TypedView k() const { return k_.view(); }
  TypedView v() const { return v_.view(); }

  // Takes the resident rows to read. FAILED_PRECONDITION when holding rows
  // of its own, INVALID_ARGUMENT for rows of another shape.
  absl::Status UseResidentRows(ResidentRows rows);

  // K and V for the kernels; FAILED_PRECONDITION while resident rows are
  // still to be given.
  absl::StatusOr<std::pair<KvView, KvView>> Views() const;

 private:
  CpuKvHolding holding_;
  Shape shape_;
  TypedTensor k_;
  TypedTensor v_;
  std::optional<ResidentRows> resident_;
};

// Rows [first, first + count) of a contiguous [batch, capacity, heads, dim]
// buffer in fp32 or bf16, as the kernels read them in place.
KvView KvRowsOf(const TypedView& buffer, int64_t first, int64_t count);

// INVALID_ARGUMENT unless the K and V of `spec` can be held as `holding`
// says: own buffers in fp32 always, in bf16 unless the spec is dilated (its
// tasks gather strided fp32 rows); resident rows unless the spec is dilated.
absl::Status CheckCpuKvHolding(const AttentionSpec& spec,
                               const CpuKvHolding& holding);

}  // namespace ringattn

#endif  // RINGATTN_WORKER_CPU_KV_HOLDING_H_
