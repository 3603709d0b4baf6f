#include "server/merge_choice.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace ringattn {

MergeRates GpuMergeRates() {
  return MergeRates{/*grpc=*/1e9,       /*interconnect=*/1e11,
                    /*host_merge=*/2e9, /*worker_merge=*/1e12,
                    /*join_kept=*/1e-3, /*join_new=*/0.05};
}

MergeRates CpuMergeRates() {
  return MergeRates{/*grpc=*/1e9,       /*interconnect=*/1e9,
                    /*host_merge=*/2e9, /*worker_merge=*/2e9,
                    /*join_kept=*/1e-3, /*join_new=*/0.05};
}

MergeSeconds EstimateMergeSeconds(const AttentionSpec& spec, int64_t workers,
                                  int64_t output_element_bytes,
                                  const MergeRates& rates,
                                  bool communicator_kept) {
  // In double, so that absurd shapes do not overflow.
  const double p = static_cast<double>(workers);
  const double rows = static_cast<double>(spec.batch) * spec.q_len *
                      static_cast<double>(spec.q_heads);
  const double r = rows * (spec.head_dim + 1) * 4.0;
  const double y =
      rows * (spec.head_dim * static_cast<double>(output_element_bytes) + 4.0);
  const double rounds = workers > 1 ? std::ceil(std::log2(p)) : 0;
  const double join =
      workers > 1 ? (communicator_kept ? rates.join_kept : rates.join_new) : 0;
  return MergeSeconds{
      p * r / rates.grpc + p * r / rates.host_merge,
      join + rounds * (r / rates.interconnect + r / rates.worker_merge) +
          y / rates.grpc};
}

absl::StatusOr<v1::PartialMerge> ChoosePartialMerge(
    const AttentionSpec& spec, v1::PartialMerge requested, int64_t workers,
    int64_t output_element_bytes, const MergeRates& rates,
    bool communicator_kept) {
  switch (requested) {
    case v1::MERGE_AT_COORDINATOR:
    case v1::MERGE_ON_WORKERS:
      return requested;
    case v1::MERGE_AUTO:
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "field 'partial_merge' has no value ", static_cast<int>(requested)));
  }
  const MergeSeconds seconds = EstimateMergeSeconds(
      spec, workers, output_element_bytes, rates, communicator_kept);
  return seconds.on_workers < seconds.at_coordinator ? v1::MERGE_ON_WORKERS
                                                     : v1::MERGE_AT_COORDINATOR;
}

}  // namespace ringattn
