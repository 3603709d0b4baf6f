#ifndef RINGATTN_WORKER_ONE_GPU_RING_H_
#define RINGATTN_WORKER_ONE_GPU_RING_H_

// OneGpuRing: the communicators of a ring whose ranks all run on one GPU, in
// threads of one process, for tests where the machine has fewer GPUs than
// the ring has ranks (NCCL takes one rank per GPU). A send is copied device to
// device into the receive its peer posted, in the sender's Wait; the peer's
// Wait returns once its receive is filled. Nothing overlaps as it would over
// NCCL, but every byte a rank receives is what its peer sent.
//
// Thread-safe: each rank's communicator is used by its own thread.

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/communicator.h"
#include "worker/device.h"

namespace ringattn {

class OneGpuRing {
 public:
  // A ring of `world_size` ranks on CUDA device `device`.
  OneGpuRing(int world_size, int device);
  ~OneGpuRing();

  OneGpuRing(const OneGpuRing&) = delete;
  OneGpuRing& operator=(const OneGpuRing&) = delete;

  // The communicator of `rank`, owned by the ring.
  RingCommunicator& Rank(int rank);

 private:
  class Member;

  // What rank r has posted: a receive not yet filled, a send not yet copied.
  struct Slot {
    void* receive = nullptr;
    int64_t receive_bytes = 0;
    int receive_from = -1;
    bool receive_filled = false;
    const void* send = nullptr;
    int64_t send_bytes = 0;
    int send_to = -1;
  };

  const int device_;
  absl::Mutex mutex_;
  absl::CondVar changed_;  // a slot changed, or the ring was aborted
  std::vector<Slot> slots_ ABSL_GUARDED_BY(mutex_);
  bool aborted_ ABSL_GUARDED_BY(mutex_) = false;
  std::vector<std::unique_ptr<Member>> ranks_;
};

}  // namespace ringattn

#endif  // RINGATTN_WORKER_ONE_GPU_RING_H_
