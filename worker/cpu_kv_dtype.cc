#include "worker/cpu_kv_dtype.h"

#include <cstdint>

#include "absl/strings/str_cat.h"

namespace ringattn {

absl::Status CheckCpuKvDType(const AttentionSpec& spec, DType kv_dtype) {
  if (kv_dtype == DType::kFloat32) return absl::OkStatus();
  if (kv_dtype != DType::kBFloat16) {
    return absl::InvalidArgumentError(
        absl::StrCat("a CPU worker holds K and V in fp32 or bf16, not ",
                     DTypeName(kv_dtype)));
  }
  if (!spec.dilated.empty()) {
    return absl::InvalidArgumentError(
        "a CPU worker holds the K and V of a dilated request in fp32");
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
