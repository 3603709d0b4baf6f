#ifndef RINGATTN_SERVER_MERGE_CHOICE_H_
#define RINGATTN_SERVER_MERGE_CHOICE_H_

// The cost model that picks where broadcast-Q's LSE reduction runs for
// MERGE_AUTO, beside strategy_choice.h's bytes-moved model, and the check of
// a forced choice. Every worker holds a partial (O, LSE) of all B * Nq query
// rows; they merge either at the coordinator (each worker streams its fp32
// partial over gRPC, the coordinator merges them on its CPU) or on the
// workers (a binomial tree over the request's communicator,
// worker/partial_reduction.h; rank 0 alone streams the merged rows, in the
// output dtype). In seconds, for p workers (B batch, Nq query rows, Hq heads,
// D head dim, o bytes per output element):
//
//   R = B * Nq * Hq * (D + 1) * 4      one worker's fp32 partial O and LSE
//   Y = B * Nq * Hq * (D * o + 4)      the merged output rows and their LSE
//
//   at the coordinator = p * R / G + p * R / M_host
//   on the workers     = J + ceil(log2 p) * (R / L + R / M_worker) + Y / G
//
// G is the coordinator's gRPC intake, L the workers' interconnect (a round of
// the tree moves one partial per pair, the pairs in parallel), M the rate at
// which a merge reads partials, J the cost of joining the communicator: the
// kept one if the coordinator can lend its key now, else a new one. The rates
// (MergeRates below) are measured where a source is named and estimated
// otherwise. AUTO takes the strictly cheaper side, ties at the coordinator,
// which needs no communicator. So a one-row decode step over p >= 2 workers
// stays at the coordinator (a millisecond of J against tens of
// microseconds), a few hundred or more rows merge on them, and a world of one
// (no J, no tree) always sends its partial as the output, narrowed: 1024
// rows against 4M tokens on one H200 spent 10-30 ms in the coordinator's
// merge after the worker had finished. Pure functions; thread-safe.

#include <cstdint>

#include "absl/status/statusor.h"
#include "core/attention_spec.h"
#include "ringattn/v1/attention.pb.h"

namespace ringattn {

// The rates of the model for one kind of worker, bytes per second and
// seconds.
struct MergeRates {
  double grpc = 0;          // G
  double interconnect = 0;  // L
  double host_merge = 0;    // M_host: the coordinator's CPU merge
  double worker_merge = 0;  // M_worker
  double join_kept = 0;     // J, the kept communicator
  double join_new = 0;      // J, connecting a new one
};

// GPU workers: G 1 GB/s (4 MB partials through gRPC, measured on 2x H200),
// L 100 GB/s (NCCL send/recv of 16 MiB over NVLink, 108 GB/s measured), the
// GPU merge kernel at 1 TB/s, J 1 ms kept / 50 ms new (a new NCCL
// communicator took 48 ms to join on 2x H200, a kept one 7 us).
MergeRates GpuMergeRates();
// CPU workers: G = L = 1 GB/s (gRPC and Gloo over the same TCP network), the
// CPU merge at 2 GB/s, J 1 ms kept / 50 ms new (a TCP mesh).
MergeRates CpuMergeRates();

struct MergeSeconds {
  double at_coordinator = 0;
  double on_workers = 0;
};

// The model above for `spec` over `workers` workers whose output has
// `output_element_bytes` per element. `communicator_kept`: the coordinator
// can lend the workers' kept communicator now.
MergeSeconds EstimateMergeSeconds(const AttentionSpec& spec, int64_t workers,
                                  int64_t output_element_bytes,
                                  const MergeRates& rates,
                                  bool communicator_kept);

// Where to merge: `requested` if forced, else the model's choice. Never
// returns MERGE_AUTO. INVALID_ARGUMENT for a value PartialMerge does not
// have.
absl::StatusOr<v1::PartialMerge> ChoosePartialMerge(
    const AttentionSpec& spec, v1::PartialMerge requested, int64_t workers,
    int64_t output_element_bytes, const MergeRates& rates,
    bool communicator_kept);

}  // namespace ringattn

#endif  // RINGATTN_SERVER_MERGE_CHOICE_H_
