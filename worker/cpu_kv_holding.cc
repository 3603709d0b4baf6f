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

KvView CpuKvView(const TypedTensor& rows) {
  if (rows.dtype() == DType::kBFloat16) {
    return KvView::BFloat16(View<const uint16_t>(
        reinterpret_cast<const uint16_t*>(rows.view().data()), rows.shape()));
  }
  return rows.floats();
}

}  // namespace ringattn
