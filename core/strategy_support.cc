#include "core/strategy_support.h"

#include "absl/strings/str_cat.h"

namespace ringattn {

absl::Status CheckBroadcastQSupports(const AttentionSpec& spec) {
  const char* pattern = !spec.dilated.empty()           ? "dilated"
                        : spec.block_sparse.has_value() ? "block-sparse"
                        : spec.hilbert.has_value()      ? "Hilbert"
                                                        : nullptr;
  if (pattern == nullptr) return absl::OkStatus();
  return absl::UnimplementedError(absl::StrCat(
      "strategy BROADCAST_Q runs dense and causal attention only, "
      "not a ",
      pattern, " pattern; use PASS_KV or STRATEGY_AUTO for this request"));
}

}  // namespace ringattn
