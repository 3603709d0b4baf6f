#include "server/strategy_choice.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "core/strategy_support.h"

namespace ringattn {

StrategyRates GpuStrategyRates() {
  return StrategyRates{GpuMergeRates(),
                       /*memory=*/4e12,
                       /*flops=*/5.5e14,
                       /*step=*/2e-4,
                       /*hop_interference=*/1.0 / 3,
                       /*ring_element_bytes=*/2};
}

StrategyRates CpuStrategyRates() {
  return StrategyRates{CpuMergeRates(),
                       /*memory=*/1e10,
                       /*flops=*/5e10,
                       /*step=*/5e-5,
                       /*hop_interference=*/1.0 / 3,
                       /*ring_element_bytes=*/4,
                       /*single_worker_copies=*/true};
}

StrategySeconds EstimateStrategySeconds(const AttentionSpec& spec,
                                        int64_t workers,
                                        int64_t wire_element_bytes,
                                        int64_t output_element_bytes,
                                        const StrategyRates& rates,
                                        bool communicator_kept) {
  // In double, so that absurd shapes do not overflow.
  const double p = static_cast<double>(workers);
  const double b = static_cast<double>(spec.batch);
  const double nq = static_cast<double>(spec.q_len);
  const double nk = static_cast<double>(spec.kv_len);
  const double hq = static_cast<double>(spec.q_heads);
  const double d = static_cast<double>(spec.head_dim);
  const double k = static_cast<double>(rates.ring_element_bytes);
  const double g = rates.merge.grpc;
  const double l = rates.merge.interconnect;
  const double n = std::ceil(nq / p);
  const double m = std::ceil(nk / p);
  // Bottom-right causal: query row i sees Nk - Nq + 1 + i keys.
  double pairs = nq * nk;
  if (spec.causal) pairs -= std::min(nq, nk) * (std::min(nq, nk) - 1) / 2;
  const double c = pairs / (nq * nk);
  const auto kv = [&](double rows) {
    return 2 * b * rows * spec.kv_heads * d * k;
  };
  const auto attend = [&](double rows, double keys) {
    return kv(keys) / rates.memory +
           4 * b * rows * keys * hq * d * c / rates.flops;
  };
  const double q = b * nq * hq * d * static_cast<double>(wire_element_bytes);
  const double y =
      b * nq * hq * (d * static_cast<double>(output_element_bytes) + 4);
  const double a = b * nq * hq * (d * k + 4 * (d + 1));
  const double step = attend(n, m);
  const MergeSeconds merge = EstimateMergeSeconds(
      spec, workers, output_element_bytes, rates.merge, communicator_kept);
  StrategySeconds seconds;
  const double hop = kv(m) / l;
  const double copy =
      workers > 1 || rates.single_worker_copies ? 2 * kv(m) / rates.memory : 0;
  seconds.pass_kv =
      (q + y) / g + copy + step +
      (p - 1) * (std::max(step, hop) +
                 rates.hop_interference * std::min(step, hop) + rates.step);
  seconds.pass_q =
      (q + y) / g +
      (workers > 1 ? p * (step + a / (p * l) + rates.step) : attend(nq, nk));
  seconds.broadcast_q = p * q / g + attend(nq, m) +
                        std::min(merge.at_coordinator, merge.on_workers);
  return seconds;
}

absl::StatusOr<v1::Strategy> ChooseStrategy(
    const AttentionSpec& spec, v1::Strategy requested, int64_t workers,
    int64_t wire_element_bytes, int64_t output_element_bytes,
    const StrategyRates& rates, bool communicator_kept) {
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
  const StrategySeconds seconds =
      EstimateStrategySeconds(spec, workers, wire_element_bytes,
                              output_element_bytes, rates, communicator_kept);
  v1::Strategy best = v1::PASS_KV;
  double fastest = seconds.pass_kv;
  if (CheckBroadcastQSupports(spec).ok() && seconds.broadcast_q < fastest) {
    best = v1::BROADCAST_Q;
    fastest = seconds.broadcast_q;
  }
  const int64_t block_rows = (spec.q_len + workers - 1) / workers;
  if (block_rows >= kPassQFullRateRows && seconds.pass_q < fastest) {
    best = v1::PASS_Q;
  }
  return best;
}

}  // namespace ringattn
