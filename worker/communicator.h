#ifndef RINGATTN_WORKER_COMMUNICATOR_H_
#define RINGATTN_WORKER_COMMUNICATOR_H_

// The transport that moves K/V blocks between the ranks of one request's ring.
// RingCommunicator is what the ring executor sees: at most one send and one
// receive in flight, started without blocking and completed together by Wait,
// so a block travels while the next one is computed on. RingConnector makes a
// connected communicator for one request. Implementations: Gloo over TCP
// (gloo_communicator.h) and NCCL (nccl_communicator.h).

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace ringattn {

// One rank's end of a connected group of ranks. A send to rank r is received
// by the receive that rank r posts for this rank as the same ordinal (the k-th
// send to r meets r's k-th receive from this rank), so both sides must agree
// on how many bytes each transfer carries.
//
// Thread-compatible, except Abort(), which any thread may call at any time.
// After a call returns a non-OK status the communicator is broken: every later
// call fails, and it no longer touches any memory handed to it.
class RingCommunicator {
 public:
  virtual ~RingCommunicator() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;

  // Starts sending `bytes` bytes at `data` to rank `peer` and returns at once.
  // `data` must stay valid and unchanged until Wait returns. At most one send
  // may be in flight. Requires bytes > 0 and peer != rank().
  virtual absl::Status StartSend(const void* data, int64_t bytes, int peer) = 0;

  // Starts receiving `bytes` bytes from rank `peer` into `data` and returns at
  // once. `data` must stay valid and untouched until Wait returns. At most one
  // receive may be in flight. Requires bytes > 0 and peer != rank().
  virtual absl::Status StartReceive(void* data, int64_t bytes, int peer) = 0;

  // Blocks until the started send and receive (either may be absent) have
  // completed. OK when both did; DEADLINE_EXCEEDED if `deadline` passed first,
  // UNAVAILABLE if a peer failed or went away (the message names its rank),
  // CANCELLED after Abort().
  virtual absl::Status Wait(absl::Time deadline) = 0;

  // Makes a Wait in progress, and every later call, return CANCELLED.
  // Thread-safe; idempotent.
  virtual void Abort() = 0;
};

// OK if `communicator` is rank `rank` of `world_size`, as the executor that
// runs over it; INVALID_ARGUMENT naming both otherwise.
inline absl::Status CheckCommunicatorRank(const RingCommunicator& communicator,
                                          int rank, int world_size) {
  if (communicator.rank() == rank && communicator.world_size() == world_size) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("the communicator is rank ", communicator.rank(), " of ",
                   communicator.world_size(), " but the executor is rank ",
                   rank, " of ", world_size));
}

// Ends a ring on this rank that cannot go on: aborts `communicator` and, if a
// transfer is in flight, waits for it to end (at once, being aborted), so that
// no buffer of the run is in use afterwards.
inline void AbortRing(RingCommunicator& communicator, bool in_flight) {
  communicator.Abort();
  if (in_flight) communicator.Wait(absl::Now()).IgnoreError();
}

// Connects the ranks of one request into a group. Implementations are
// thread-safe: requests connect concurrently.
class RingConnector {
 public:
  virtual ~RingConnector() = default;

  // Joins the group named `group` as rank `rank` of `world_size` and blocks
  // until every rank has joined, at most `timeout`, or until `*cancelled`
  // (null: never) has been true for a moment (kCancelCheckInterval).
  // DEADLINE_EXCEEDED if some rank did not show up in time (the message names
  // it where known), CANCELLED once cancelled, UNAVAILABLE if the rendezvous
  // or a connection failed, INVALID_ARGUMENT for a bad rank or world size.
  virtual absl::StatusOr<std::unique_ptr<RingCommunicator>> Connect(
      const std::string& group, int rank, int world_size,
      absl::Duration timeout, const std::atomic<bool>* cancelled) = 0;
};

}  // namespace ringattn

#endif  // RINGATTN_WORKER_COMMUNICATOR_H_
