#ifndef RINGATTN_SERVER_RING_WARM_UP_H_
#define RINGATTN_SERVER_RING_WARM_UP_H_

// RingWarmUp: has the workers of a newly formed cluster make the ring
// communicators they keep between requests before a user's request needs
// them. Once per membership epoch of more than one worker it runs tiny
// internal requests down the ordinary request path: a pass-KV ring per
// communicator slot, all at once (each slot's communicator, and NCCL's first
// connections to ring neighbours), then a broadcast-Q request merged on the
// workers (the tree's connections). Without it the first ring request of each
// slot after the cluster forms pays that setup, about 0.7 s on GPUs.
// Thread-safe.

#include <cstdint>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/attend_call.h"
#include "server/metrics.h"

namespace ringattn {

class RingWarmUp {
 public:
  // `state`'s pointers must outlive this. Outcomes are counted in
  // `state.metrics` (ringattn_ring_warm_ups_total); the warm-up requests
  // themselves are not counted as requests.
  explicit RingWarmUp(const CoordinatorState& state);
  // Waits for a warm-up in flight (bounded by its ring timeout).
  ~RingWarmUp();

  RingWarmUp(const RingWarmUp&) = delete;
  RingWarmUp& operator=(const RingWarmUp&) = delete;

  // Starts a warm-up in the background if the cluster is ready in an epoch
  // not seen before, has more than one worker, and no request of the epoch
  // made the communicator yet. It runs beside requests already admitted (a
  // context upload makes no communicator). Returns at once.
  void Poll();

 private:
  void Run(int64_t epoch);
  // One warm-up request; `index` tells the rings of one epoch apart.
  grpc::Status RunOne(int64_t epoch, v1::Strategy strategy, int index);

  CoordinatorState state_;  // with metrics = &own_metrics_
  Metrics* const metrics_;  // the coordinator's
  Metrics own_metrics_;
  absl::Mutex mutex_;
  int64_t last_epoch_ ABSL_GUARDED_BY(mutex_) = -1;
  bool running_ ABSL_GUARDED_BY(mutex_) = false;
  std::thread thread_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace ringattn

#endif  // RINGATTN_SERVER_RING_WARM_UP_H_
