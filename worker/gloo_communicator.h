#ifndef RINGATTN_WORKER_GLOO_COMMUNICATOR_H_
#define RINGATTN_WORKER_GLOO_COMMUNICATOR_H_

// The ring communicator for CPU workers: Gloo over TCP. Each request gets its
// own Gloo context, connected full-mesh through a rendezvous store under the
// request's prefix, so requests never share sockets or message slots. Gloo
// reports errors by throwing; everything here catches them and returns
// absl::Status instead.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/store.h"
#include "gloo/transport/device.h"
#include "gloo/transport/unbound_buffer.h"
#include "worker/communicator.h"

namespace ringattn {

// The TCP device all Gloo traffic of this process goes through. It listens on
// the address `hostname` resolves to, or on network interface `interface` if
// that is not empty; peers must be able to reach that address. UNAVAILABLE if
// neither can be resolved. The device is thread-safe and may be shared by any
// number of communicators. Unless the program handles SIGPIPE itself, this
// sets it to be ignored for the whole process, so that a peer that closed its
// connection fails a transfer instead of ending the process.
absl::StatusOr<std::shared_ptr<gloo::transport::Device>> CreateGlooTcpDevice(
    const std::string& hostname, const std::string& interface = "");

// One rank of a group connected with Gloo. Thread-compatible apart from
// Abort() (see RingCommunicator); not copyable.
class GlooCommunicator final : public RingCommunicator {
 public:
  // Joins the group of `world_size` ranks whose rendezvous keys live under
  // `prefix` in `store`, as rank `rank`, and connects to every other rank over
  // `device`. Blocks until all ranks are connected or `timeout` has passed
  // (DEADLINE_EXCEEDED naming the ranks that did not show up), or until
  // `*cancelled` (null: never) turns true while it waits for a rank to show
  // up (CANCELLED). `store` is only used during the call.
  static absl::StatusOr<std::unique_ptr<GlooCommunicator>> Connect(
      gloo::rendezvous::Store& store, const std::string& prefix, int rank,
      int world_size, std::shared_ptr<gloo::transport::Device> device,
      absl::Duration timeout, const std::atomic<bool>* cancelled = nullptr);

  GlooCommunicator(const GlooCommunicator&) = delete;
  GlooCommunicator& operator=(const GlooCommunicator&) = delete;
  // Closes every connection; transfers still in flight are dropped.
  ~GlooCommunicator() override;

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  absl::Status StartSend(const void* data, int64_t bytes, int peer) override;
  absl::Status StartReceive(void* data, int64_t bytes, int peer) override;
  absl::Status Wait(absl::Time deadline) override;
  void Abort() override;

 private:
  explicit GlooCommunicator(std::shared_ptr<gloo::rendezvous::Context> context);

  // INVALID_ARGUMENT unless a transfer of `bytes` with `peer` is well formed;
  // CANCELLED or FAILED_PRECONDITION if the communicator cannot start one.
  absl::Status CheckTransfer(int64_t bytes, int peer, bool in_flight) const;
  // Drops the transfers in flight, so that nothing touches caller memory any
  // more, closes every connection, marks the communicator broken and returns
  // `status`.
  absl::Status Break(absl::Status status);

  const int rank_;
  const int world_size_;
  std::shared_ptr<gloo::rendezvous::Context> context_;  // null once broken
  // Transfers started so far per peer: the k-th transfer uses slot k on both
  // ends.
  std::vector<uint64_t> sends_to_;
  std::vector<uint64_t> receives_from_;
  int send_peer_ = -1;
  int receive_peer_ = -1;
  bool broken_ = false;

  mutable absl::Mutex mutex_;
  bool aborted_ ABSL_GUARDED_BY(mutex_) = false;
  // Written only by the thread that owns the communicator; Abort() reads them.
  std::unique_ptr<gloo::transport::UnboundBuffer> send_ ABSL_GUARDED_BY(mutex_);
  std::unique_ptr<gloo::transport::UnboundBuffer> receive_
      ABSL_GUARDED_BY(mutex_);
};

// Connects requests with Gloo: every group is a GlooCommunicator whose
// rendezvous keys live under the group name in `store`. Thread-safe if `store`
// is (HashStore and GrpcStore are).
class GlooConnector final : public RingConnector {
 public:
  // `store` must outlive the connector.
  GlooConnector(gloo::rendezvous::Store& store,
                std::shared_ptr<gloo::transport::Device> device);

  absl::StatusOr<std::unique_ptr<RingCommunicator>> Connect(
      const std::string& group, int rank, int world_size,
      absl::Duration timeout, const std::atomic<bool>* cancelled) override;

 private:
  gloo::rendezvous::Store& store_;
  const std::shared_ptr<gloo::transport::Device> device_;
};

}  // namespace ringattn

#endif  // RINGATTN_WORKER_GLOO_COMMUNICATOR_H_
