#ifndef RINGATTN_KERNELS_CPU_RING_SIMULATION_H_
#define RINGATTN_KERNELS_CPU_RING_SIMULATION_H_

// SimulateRing: p workers executing the ring plan inside one process, each
// holding only its own shard and the K/V block passed to it, with blocks handed
// from worker to worker exactly as the plan's send/receive flags say. It is the
// distributed algorithm without the network: tests hold it to the float64
// reference, and a plan that asks a worker to compute on a block it was never
// sent fails it.

#include <cstdint>

#include "absl/status/statusor.h"
#include "core/attention_spec.h"
#include "core/tensor.h"

namespace ringattn {

struct RingStats {
  int64_t num_steps = 0;
  int64_t num_transfers = 0;  // K/V blocks passed between workers
  int64_t num_tasks = 0;
  // The most rows of Q, K and V (with the incoming block) any worker held at
  // once.
  int64_t peak_rows_per_worker = 0;
};

struct AttentionOutput {
  Tensor<float> o;    // [B, Nq, Hq, D], the caller's order
  Tensor<float> lse;  // [B, Nq, Hq, 1], natural log
  RingStats stats;
};

// Attention of q ([B, Nq, Hq, D]) over k, v ([B, Nk, Hkv, D]) on `workers`
// simulated workers. INVALID_ARGUMENT for a bad spec or shapes that disagree
// with it; INTERNAL if the plan is inconsistent.
absl::StatusOr<AttentionOutput> SimulateRing(const AttentionSpec& spec,
                                             View<const float> q,
                                             View<const float> k,
                                             View<const float> v,
                                             int64_t workers);

}  // namespace ringattn

#endif  // RINGATTN_KERNELS_CPU_RING_SIMULATION_H_
