#include "worker/one_gpu_ring.h"

#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "kernels/cuda/device_buffer.h"

namespace ringattn {

class OneGpuRing::Member final : public RingCommunicator {
 public:
  Member(OneGpuRing& ring, int rank) : ring_(ring), rank_(rank) {}

  int rank() const override { return rank_; }
  int world_size() const override {
    return static_cast<int>(ring_.ranks_.size());
  }

  absl::Status StartSend(const void* data, int64_t bytes, int peer) override {
    absl::MutexLock lock(&ring_.mutex_);
    if (ring_.aborted_) return absl::CancelledError("the ring was aborted");
    Slot& slot = ring_.slots_[rank_];
    if (slot.send != nullptr) {
      return absl::FailedPreconditionError("a send is already in flight");
    }
    slot.send = data;
    slot.send_bytes = bytes;
    slot.send_to = peer;
    ring_.changed_.SignalAll();
    return absl::OkStatus();
  }

  absl::Status StartReceive(void* data, int64_t bytes, int peer) override {
    absl::MutexLock lock(&ring_.mutex_);
    if (ring_.aborted_) return absl::CancelledError("the ring was aborted");
    Slot& slot = ring_.slots_[rank_];
    if (slot.receive != nullptr) {
      return absl::FailedPreconditionError("a receive is already in flight");
    }
    slot.receive = data;
    slot.receive_bytes = bytes;
    slot.receive_from = peer;
    slot.receive_filled = false;
    ring_.changed_.SignalAll();
    return absl::OkStatus();
  }

  absl::Status Wait(absl::Time deadline) override {
    absl::MutexLock lock(&ring_.mutex_);
    Slot& own = ring_.slots_[rank_];
    if (own.send != nullptr) {
      Slot& peer = ring_.slots_[own.send_to];
      const auto posted = [&] {
        return ring_.aborted_ ||
               (peer.receive != nullptr && !peer.receive_filled &&
                peer.receive_from == rank_);
      };
      if (!AwaitUntil(posted, deadline)) {
        return absl::DeadlineExceededError(absl::StrCat(
            "rank ", own.send_to, " posted no receive for rank ", rank_));
      }
      if (ring_.aborted_) return absl::CancelledError("the ring was aborted");
      if (peer.receive_bytes != own.send_bytes) {
        return absl::InternalError(absl::StrCat(
            "rank ", rank_, " sends ", own.send_bytes, " bytes where rank ",
            own.send_to, " receives ", peer.receive_bytes));
      }
      // The copy runs under the lock: the peer's buffer stays posted.
      if (absl::Status copied = Copy(peer.receive, own.send, own.send_bytes);
          !copied.ok()) {
        return copied;
      }
      peer.receive = nullptr;
      peer.receive_filled = true;
      own.send = nullptr;
      ring_.changed_.SignalAll();
    }
    if (own.receive != nullptr || own.receive_filled) {
      const auto filled = [&] { return ring_.aborted_ || own.receive_filled; };
      if (!AwaitUntil(filled, deadline)) {
        return absl::DeadlineExceededError(absl::StrCat(
            "rank ", own.receive_from, " sent nothing to rank ", rank_));
      }
      if (ring_.aborted_) return absl::CancelledError("the ring was aborted");
      own.receive_filled = false;
    }
    return absl::OkStatus();
  }

  void Abort() override {
    absl::MutexLock lock(&ring_.mutex_);
    ring_.aborted_ = true;
    ring_.changed_.SignalAll();
  }

 private:
  // Waits (holding the ring's mutex) until `done()` or `deadline`; whether
  // done() came true.
  template <typename Done>
  bool AwaitUntil(const Done& done, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ring_.mutex_) {
    while (!done()) {
      if (ring_.changed_.WaitWithDeadline(&ring_.mutex_, deadline)) {
        return done();
      }
    }
    return true;
  }

  absl::Status Copy(void* to, const void* from, int64_t bytes) {
    if (!stream_.has_value()) {
      RINGATTN_RETURN_IF_ERROR(UseCudaDevice(ring_.device_));
      absl::StatusOr<CudaStream> stream = CudaStream::Create();
      if (!stream.ok()) return stream.status();
      stream_ = *std::move(stream);
    }
    RINGATTN_RETURN_IF_ERROR(
        CudaStatus(cudaMemcpyAsync(to, from, static_cast<size_t>(bytes),
                                   cudaMemcpyDeviceToDevice, stream_->get()),
                   "copying a block to the next rank"));
    return CudaStatus(cudaStreamSynchronize(stream_->get()),
                      "copying a block to the next rank");
  }

  OneGpuRing& ring_;
  const int rank_;
  std::optional<CudaStream> stream_;
};

OneGpuRing::OneGpuRing(int world_size, int device)
    : device_(device), slots_(static_cast<size_t>(world_size)) {
  for (int rank = 0; rank < world_size; ++rank) {
    ranks_.push_back(std::make_unique<Member>(*this, rank));
  }
}

OneGpuRing::~OneGpuRing() = default;

RingCommunicator& OneGpuRing::Rank(int rank) { return *ranks_[rank]; }

}  // namespace ringattn
