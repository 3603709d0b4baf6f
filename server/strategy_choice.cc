#include "server/strategy_choice.h"

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "core/strategy_support.h"

namespace ringattn {

BytesMoved EstimateBytesMoved(const AttentionSpec& spec, int64_t workers,
                              int64_t wire_element_bytes) {
  // In double, so that absurd shapes do not overflow.
  const double b = static_cast<double>(spec.batch);
  const double p = static_cast<double>(workers);
  const double q = b * spec.q_len * spec.q_heads * spec.head_dim *
                   static_cast<double>(wire_element_bytes);
  const double r = b * spec.q_len * spec.q_heads * (spec.head_dim + 1) * 4.0;
  const double kv = 2 * b * spec.kv_len * spec.kv_heads * spec.head_dim * 4.0;
  const double a =
      b * spec.q_len * spec.q_heads * (2 * spec.head_dim + 1) * 4.0;
  const double ring_q = workers > 1 ? p * a : 0;
  return BytesMoved{q + r + (p - 1) * kv, q + r + ring_q, p * (q + r)};
}

absl::StatusOr<v1::Strategy> ChooseStrategy(const AttentionSpec& spec,
                                            v1::Strategy requested,
                                            int64_t workers,
                                            int64_t wire_element_bytes) {
  switch (requested) {
    case v1::PASS_KV:
      return v1::PASS_KV;
    case v1::PASS_Q:
      return v1::PASS_Q;
    case v1::BROADCAST_Q:
      RINGATTN_RETURN_IF_ERROR(CheckBroadcastQSupports(spec));
      return v1::BROADCAST_Q;
    case v1::STRATEGY_AUTO:
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "field 'strategy' has no value ", static_cast<int>(requested)));
  }
  const BytesMoved bytes =
      EstimateBytesMoved(spec, workers, wire_element_bytes);
  v1::Strategy best = v1::PASS_KV;
  double fewest = bytes.pass_kv;
  if (CheckBroadcastQSupports(spec).ok() && bytes.broadcast_q < fewest) {
    best = v1::BROADCAST_Q;
    fewest = bytes.broadcast_q;
  }
  if (bytes.pass_q < fewest) best = v1::PASS_Q;
  return best;
}

}  // namespace ringattn
