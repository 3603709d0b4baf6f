#ifndef RINGATTN_WORKER_SOLO_COMMUNICATOR_H_
#define RINGATTN_WORKER_SOLO_COMMUNICATOR_H_

// SoloCommunicator: the communicator of a world of one rank, which has no
// peer to send to or receive from. What a GPU worker runs broadcast-Q over:
// its query rows against its own K/V, with no ring.

#include <atomic>
#include <cstdint>

#include "absl/status/status.h"
#include "worker/communicator.h"

namespace ringattn {

class SoloCommunicator final : public RingCommunicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  absl::Status StartSend(const void*, int64_t, int) override {
    return absl::FailedPreconditionError("a world of one sends nothing");
  }
  absl::Status StartReceive(void*, int64_t, int) override {
    return absl::FailedPreconditionError("a world of one receives nothing");
  }
  absl::Status Wait(absl::Time) override {
    return aborted_ ? absl::CancelledError("the request was cancelled")
                    : absl::OkStatus();
  }
  void Abort() override { aborted_ = true; }

 private:
  std::atomic<bool> aborted_{false};
};

}  // namespace ringattn

#endif  // RINGATTN_WORKER_SOLO_COMMUNICATOR_H_
