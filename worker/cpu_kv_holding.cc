#include "worker/cpu_kv_holding.h"

#include <cstdint>

#include "absl/strings/str_cat.h"

namespace ringattn {

absl::Status CheckCpuKvHolding(const AttentionSpec& spec,
                               const CpuKvHolding& holding) {
  if (holding.dtype != DType::kFloat32 && holding.dtype != DType::kBFloat16) {
    return absl::InvalidArgumentError(
        absl::StrCat("a CPU worker holds K and V in fp32 or bf16, not ",
                     DTypeName(holding.dtype)));
  }
  if ((holding.resident || holding.dtype != DType::kFloat32) &&
      !spec.dilated.empty()) {
    return absl::InvalidArgumentError(
        "a CPU worker holds the K and V of a dilated request in fp32 buffers "
        "of its own");
  }
  return absl::OkStatus();
}

KvView KvRowsOf(const TypedView& buffer, int64_t first, int64_t count) {
  const Shape& shape = buffer.shape();
  const int64_t seq_stride = shape.heads * shape.dim;
  const Shape rows{shape.batch, count, shape.heads, shape.dim};
  const int64_t offset = first * seq_stride;
  if (buffer.dtype() == DType::kBFloat16) {
    return KvView::BFloat16(View<const uint16_t>(
        reinterpret_cast<const uint16_t*>(buffer.data()) + offset, rows,
        shape.seq * seq_stride, seq_stride));
  }
  return View<const float>(
      reinterpret_cast<const float*>(buffer.data()) + offset, rows,
      shape.seq * seq_stride, seq_stride);
}

CpuKvRows::CpuKvRows(const CpuKvHolding& holding, const Shape& shape)
    : holding_(holding), shape_(shape) {
  if (!holding.resident) {
    k_ = TypedTensor(holding.dtype, shape);
    v_ = TypedTensor(holding.dtype, shape);
  }
}

absl::Status CpuKvRows::UseResidentRows(ResidentRows rows) {
  if (!holding_.resident) {
    return absl::FailedPreconditionError(
        "this executor holds K and V in buffers of its own");
  }
  if (rows.k.shape() != shape_ || rows.v.shape() != shape_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expected ", shape_.seq, " resident K/V rows of ", shape_.heads,
        " heads of ", shape_.dim, ", got ", rows.k.shape().seq, " of ",
        rows.k.shape().heads, " of ", rows.k.shape().dim));
  }
  resident_ = std::move(rows);
  return absl::OkStatus();
}

absl::StatusOr<std::pair<KvView, KvView>> CpuKvRows::Views() const {
  if (!holding_.resident) {
    return std::make_pair(KvRowsOf(k_.view(), 0, shape_.seq),
                          KvRowsOf(v_.view(), 0, shape_.seq));
  }
  if (!resident_.has_value()) {
    return absl::FailedPreconditionError(
        "no resident rows were given to read K and V from");
  }
  return std::make_pair(resident_->k, resident_->v);
}

}  // namespace ringattn
