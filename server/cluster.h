#ifndef RINGATTN_SERVER_CLUSTER_H_
#define RINGATTN_SERVER_CLUSTER_H_

// Cluster: the coordinator's view of its workers. Workers register and get a
// rank; a worker that misses heartbeats for `heartbeat_timeout` is dead and its
// rank is free for the next worker that registers. The cluster is ready when
// all `world_size` ranks are held by live workers. Every change of membership
// starts a new epoch. Thread-safe.
//
// Channels to the workers come from a ChannelFactory: plaintext by default,
// TLS when the coordinator is given worker credentials. Besides its main
// channel a worker may get `row_channels` more, each its own connection, over
// which large uploads send rows and take output back (AttachRows).

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "ringattn/v1/worker.grpc.pb.h"

namespace ringattn {

class Cluster {
 public:
  using Clock = std::chrono::steady_clock;

  // Opens the channel to the worker that advertised `address`, with the
  // cluster's `arguments` (keepalive) and the factory's own.
  using ChannelFactory = std::function<std::shared_ptr<grpc::Channel>(
      const std::string& address, grpc::ChannelArguments arguments)>;
  static std::shared_ptr<grpc::Channel> PlaintextChannel(
      const std::string& address, grpc::ChannelArguments arguments);

  Cluster(int world_size, Clock::duration heartbeat_timeout,
          ChannelFactory make_channel = PlaintextChannel, int row_channels = 0);

  Cluster(const Cluster&) = delete;
  Cluster& operator=(const Cluster&) = delete;

  // A worker at `address` joins: it keeps its rank if it held one, else takes
  // the lowest free rank. RESOURCE_EXHAUSTED if all ranks are held by live
  // workers.
  absl::StatusOr<v1::RegisterResponse> Register(
      const v1::RegisterRequest& request);
  // Records a heartbeat; false if `rank` is not held by `address` (it must
  // register).
  bool Heartbeat(int rank, const std::string& address);
  // Evicts the worker at `rank` now, so the cluster is not ready until a worker
  // registers for that rank again.
  void MarkDead(int rank, const std::string& address);

  // One live worker as a request sees it.
  struct Member {
    int rank;
    std::string address;
    std::string device;
    int64_t memory_bytes;
    std::shared_ptr<grpc::Channel> channel;  // the stub's
    std::shared_ptr<v1::Worker::Stub> stub;
    // One per row channel, each on a connection of its own.
    std::vector<std::shared_ptr<v1::Worker::Stub>> row_stubs;
  };
  // All ranks in order if the cluster is ready; UNAVAILABLE naming the missing
  // ranks otherwise.
  absl::StatusOr<std::vector<Member>> ReadyMembers();
  // ReadyMembers with the membership epoch they were read in: the same epoch
  // means the same worker processes at the same ranks.
  struct Membership {
    int64_t epoch;
    std::vector<Member> members;
  };
  absl::StatusOr<Membership> ReadyMembership();
  bool Ready();
  // Evicts every worker whose channel does not connect within `patience` and
  // returns them. Called when a request failed with UNAVAILABLE, so that the
  // cluster stops admitting requests that would fail on a dead worker before
  // its heartbeats run out: a live worker that only lost a peer is connected
  // (it just answered), and one evicted by mistake registers again on its
  // next heartbeat. A worker that registered again since the probe began is
  // kept.
  std::vector<Member> EvictUnreachable(Clock::duration patience);
  int LiveWorkers();
  int world_size() const { return world_size_; }
  v1::ClusterInfo Info();

 private:
  struct Slot {
    bool held = false;
    Member member;
    Clock::time_point last_seen;
  };
  bool Alive(const Slot& slot, Clock::time_point now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  const int world_size_;
  const Clock::duration heartbeat_timeout_;
  const ChannelFactory make_channel_;
  const int row_channels_;
  absl::Mutex mutex_;
  std::vector<Slot> slots_ ABSL_GUARDED_BY(mutex_);
  int64_t epoch_ ABSL_GUARDED_BY(mutex_) = 0;
};

}  // namespace ringattn

#endif  // RINGATTN_SERVER_CLUSTER_H_
