#ifndef RINGATTN_WORKER_NCCL_COMMUNICATOR_H_
#define RINGATTN_WORKER_NCCL_COMMUNICATOR_H_

// The ring communicator for GPU workers: NCCL point-to-point transfers of
// device memory. Each communicator is a non-blocking NCCL communicator (NCCL
// never blocks the calling thread; every wait here polls, against a deadline)
// with a communication stream of its own at the device's highest priority, so
// that transfers run beside the attention kernels of another stream. A peer
// that dies or never shows up makes the waiting ranks fail at their deadline,
// never hang: the communicator is then aborted (ncclCommAbort), which also
// stops its kernels.
//
// NcclConnector makes a new communicator for every group it is asked to
// connect (a few hundred ms of NCCL setup); CommunicatorCache
// (communicator_cache.h) keeps one of them across the requests the
// coordinator hands its reuse key, one request at a time.

#include <nccl.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gloo/rendezvous/store.h"
#include "worker/communicator.h"
#include "worker/device.h"

namespace ringattn {

// Sets NCCL_NVLS_ENABLE=0 in this process's environment, so that NCCL never
// uses NVLink multicast (NVLS), which the GPU machines here do not support.
// Call before the first communicator is created (NCCL reads its environment
// once); before any thread starts, as it writes the environment.
void DisableNcclMulticast();

// A fresh NCCL unique id: what every rank of one group needs to find the
// others (it names a listening socket of this process). UNAVAILABLE if NCCL
// cannot make one (no usable network interface, no NCCL library).
absl::StatusOr<ncclUniqueId> NewNcclUniqueId();

// One rank of a group connected with NCCL, bound to one CUDA device. The
// buffers handed to StartSend / StartReceive are device memory of that device.
// A receive and a send started together are issued as one NCCL group (as soon
// as both are started, or at Wait for a lone one), so that two ranks sending
// to each other never deadlock.
//
// Thread-compatible, apart from Abort(), which any thread may call at any
// time (it only raises a flag; the owning thread aborts NCCL at its next
// call). Not copyable.
class NcclCommunicator final : public RingCommunicator {
 public:
  // Joins the group named by `id` as rank `rank` of `world_size` on CUDA
  // device `device` (made current on the calling thread), and waits until
  // every rank has joined, at most `timeout`. UNAVAILABLE naming this rank
  // if that does not happen in time or NCCL fails, CANCELLED if `*cancelled`
  // (null: never) turns true first (the communicator is then aborted);
  // INVALID_ARGUMENT for a bad rank or world size; INTERNAL for a failing
  // CUDA call.
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Create(
      const ncclUniqueId& id, int rank, int world_size, int device,
      absl::Duration timeout, const std::atomic<bool>* cancelled = nullptr);

  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;
  // Releases NCCL's resources: finalized in order if the communicator is
  // healthy and idle, aborted otherwise (which never waits for peers).
  ~NcclCommunicator() override;

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  int device() const { return device_; }
  // The stream the transfers run on.
  cudaStream_t stream() const { return stream_.get(); }

  absl::Status StartSend(const void* data, int64_t bytes, int peer) override;
  absl::Status StartReceive(void* data, int64_t bytes, int peer) override;
  // Also issues a lone started transfer, then polls until the transfers have
  // completed on the device. On failure the communicator is aborted and its
  // stream drained before this returns, so that nothing writes the caller's
  // buffers afterwards.
  absl::Status Wait(absl::Time deadline) override;
  void Abort() override;

 private:
  NcclCommunicator(int rank, int world_size, int device, ncclComm_t comm,
                   CudaStream stream, CudaEvent done);

  // INVALID_ARGUMENT unless a transfer of `bytes` with `peer` is well formed;
  // CANCELLED or FAILED_PRECONDITION if none can start now.
  absl::Status CheckTransfer(int64_t bytes, int peer, bool in_flight) const;
  // Flushes and releases NCCL's resources in order; false if that fails or
  // takes too long.
  bool Finalize();
  // Issues the started transfers as one NCCL group, unless already issued.
  absl::Status Issue();
  // Polls until NCCL has finished issuing the group onto the stream.
  absl::Status WaitUntilIssued(absl::Time deadline);
  // Aborts NCCL, waits for the stream to drain, marks the communicator
  // broken and returns `status` with this rank's transfers named.
  absl::Status Break(absl::Status status);
  // "rank R of W (receiving from P, sending to Q)".
  std::string Describe() const;

  const int rank_;
  const int world_size_;
  const int device_;
  ncclComm_t comm_;  // null once aborted or destroyed
  CudaStream stream_;
  CudaEvent done_;

  // The transfers started since the last Wait.
  const void* send_data_ = nullptr;
  int64_t send_bytes_ = 0;
  int send_peer_ = -1;
  void* receive_data_ = nullptr;
  int64_t receive_bytes_ = 0;
  int receive_peer_ = -1;
  bool issued_ = false;

  bool broken_ = false;
  std::atomic<bool> abort_requested_{false};
};

// Connects requests with NCCL on one CUDA device: rank 0 of a group makes a
// unique id and publishes it in `store` under "<group>/nccl-unique-id"; the
// other ranks read it from there. Thread-safe if `store` is (HashStore and
// GrpcStore are).
class NcclConnector final : public RingConnector {
 public:
  // `store` must outlive the connector.
  NcclConnector(gloo::rendezvous::Store& store, int device);

  // As RingConnector::Connect; DEADLINE_EXCEEDED if rank 0's id does not
  // appear in the store in time, UNAVAILABLE if the store fails or NCCL
  // cannot connect.
  absl::StatusOr<std::unique_ptr<RingCommunicator>> Connect(
      const std::string& group, int rank, int world_size,
      absl::Duration timeout, const std::atomic<bool>* cancelled) override;

 private:
  gloo::rendezvous::Store& store_;
  const int device_;
};

}  // namespace ringattn

#endif  // RINGATTN_WORKER_NCCL_COMMUNICATOR_H_
