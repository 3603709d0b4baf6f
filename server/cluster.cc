#include "server/cluster.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ringattn {
namespace {

// The channel to a worker pings it whenever it has been quiet for a heartbeat
// timeout and gives up on it after another without an answer, so that a call
// to a worker that stopped answering (stopped, cut off) fails with UNAVAILABLE
// instead of blocking on flow control forever.
grpc::ChannelArguments KeepaliveArguments(
    Cluster::Clock::duration heartbeat_timeout) {
  const int ms = std::max<int>(
      1000,
      std::chrono::duration_cast<std::chrono::milliseconds>(heartbeat_timeout)
          .count());
  grpc::ChannelArguments arguments;
  arguments.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, ms);
  arguments.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, ms);
  arguments.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  return arguments;
}

// Whether `channel` is connected, or connects within `patience`. A refused
// connect ends the wait at once (TRANSIENT_FAILURE); a host that does not
// answer at all uses up the patience.
bool Connects(grpc::Channel& channel, Cluster::Clock::duration patience) {
  const auto deadline =
      std::chrono::system_clock::now() +
      std::chrono::duration_cast<std::chrono::system_clock::duration>(patience);
  for (grpc_connectivity_state state = channel.GetState(true);;
       state = channel.GetState(true)) {
    switch (state) {
      case GRPC_CHANNEL_READY:
        return true;
      case GRPC_CHANNEL_TRANSIENT_FAILURE:
      case GRPC_CHANNEL_SHUTDOWN:
        return false;
      default:
        if (!channel.WaitForStateChange(state, deadline)) return false;
    }
  }
}

}  // namespace

std::shared_ptr<grpc::Channel> Cluster::PlaintextChannel(
    const std::string& address, grpc::ChannelArguments arguments) {
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(),
                                   arguments);
}

Cluster::Cluster(int world_size, Clock::duration heartbeat_timeout,
                 ChannelFactory make_channel, int row_channels)
    : world_size_(world_size),
      heartbeat_timeout_(heartbeat_timeout),
      make_channel_(std::move(make_channel)),
      row_channels_(row_channels),
      slots_(static_cast<size_t>(world_size)) {}

bool Cluster::Alive(const Slot& slot, Clock::time_point now) const {
  return slot.held && now - slot.last_seen <= heartbeat_timeout_;
}

absl::StatusOr<v1::RegisterResponse> Cluster::Register(
    const v1::RegisterRequest& request) {
  absl::MutexLock lock(&mutex_);
  const Clock::time_point now = Clock::now();
  int rank = -1;
  for (int r = 0; r < world_size_; ++r) {
    if (slots_[r].held && slots_[r].member.address == request.address()) {
      rank = r;
      break;
    }
  }
  for (int r = 0; rank < 0 && r < world_size_; ++r) {
    if (!Alive(slots_[r], now)) rank = r;
  }
  if (rank < 0) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the cluster already has its ", world_size_,
        " workers; start the coordinator with a larger --world_size"));
  }
  Slot& slot = slots_[rank];
  slot.held = true;
  slot.last_seen = now;
  std::shared_ptr<grpc::Channel> channel =
      make_channel_(request.address(), KeepaliveArguments(heartbeat_timeout_));
  std::shared_ptr<v1::Worker::Stub> stub = v1::Worker::NewStub(channel);
  slot.member = Member{rank,
                       request.address(),
                       request.device(),
                       request.memory_bytes(),
                       std::move(channel),
                       std::move(stub),
                       {}};
  for (int i = 1; i <= row_channels_; ++i) {
    // Channels whose arguments differ never share a connection.
    grpc::ChannelArguments arguments = KeepaliveArguments(heartbeat_timeout_);
    arguments.SetInt("ringattn.row_channel", i);
    slot.member.row_stubs.push_back(v1::Worker::NewStub(
        make_channel_(request.address(), std::move(arguments))));
  }
  ++epoch_;
  v1::RegisterResponse response;
  response.set_rank(rank);
  response.set_world_size(world_size_);
  response.set_epoch(epoch_);
  return response;
}

bool Cluster::Heartbeat(int rank, const std::string& address) {
  absl::MutexLock lock(&mutex_);
  if (rank < 0 || rank >= world_size_) return false;
  Slot& slot = slots_[rank];
  if (!slot.held || slot.member.address != address) return false;
  if (!Alive(slot, Clock::now())) ++epoch_;  // back from the dead
  slot.last_seen = Clock::now();
  return true;
}

void Cluster::MarkDead(int rank, const std::string& address) {
  absl::MutexLock lock(&mutex_);
  if (rank < 0 || rank >= world_size_) return;
  Slot& slot = slots_[rank];
  if (!slot.held || slot.member.address != address) return;
  slot.held = false;
  ++epoch_;
}

std::vector<Cluster::Member> Cluster::EvictUnreachable(
    Clock::duration patience) {
  std::vector<Member> held;
  {
    absl::MutexLock lock(&mutex_);
    for (const Slot& slot : slots_) {
      if (slot.held) held.push_back(slot.member);
    }
  }
  std::vector<Member> evicted;
  for (Member& member : held) {
    if (Connects(*member.channel, patience)) continue;
    absl::MutexLock lock(&mutex_);
    Slot& slot = slots_[member.rank];
    if (!slot.held || slot.member.channel != member.channel) continue;
    slot.held = false;
    ++epoch_;
    evicted.push_back(std::move(member));
  }
  return evicted;
}

absl::StatusOr<std::vector<Cluster::Member>> Cluster::ReadyMembers() {
  absl::StatusOr<Membership> membership = ReadyMembership();
  if (!membership.ok()) return membership.status();
  return std::move(membership->members);
}

absl::StatusOr<Cluster::Membership> Cluster::ReadyMembership() {
  absl::MutexLock lock(&mutex_);
  const Clock::time_point now = Clock::now();
  std::vector<Member> members;
  std::vector<int> missing;
  for (int r = 0; r < world_size_; ++r) {
    if (Alive(slots_[r], now)) {
      members.push_back(slots_[r].member);
    } else {
      missing.push_back(r);
    }
  }
  if (!missing.empty()) {
    return absl::UnavailableError(absl::StrCat(
        "cluster not ready: ", members.size(), " of ", world_size_,
        " workers alive (missing rank ", absl::StrJoin(missing, ", "),
        "); start or restart ringattn-worker processes"));
  }
  return Membership{epoch_, std::move(members)};
}

bool Cluster::Ready() { return ReadyMembers().ok(); }

int Cluster::LiveWorkers() {
  absl::MutexLock lock(&mutex_);
  const Clock::time_point now = Clock::now();
  int live = 0;
  for (const Slot& slot : slots_) live += Alive(slot, now);
  return live;
}

v1::ClusterInfo Cluster::Info() {
  absl::MutexLock lock(&mutex_);
  const Clock::time_point now = Clock::now();
  v1::ClusterInfo info;
  info.set_world_size(world_size_);
  bool ready = true;
  for (int r = 0; r < world_size_; ++r) {
    const Slot& slot = slots_[r];
    ready = ready && Alive(slot, now);
    if (!slot.held) continue;
    v1::WorkerInfo* worker = info.add_workers();
    worker->set_rank(r);
    worker->set_address(slot.member.address);
    worker->set_device(slot.member.device);
    worker->set_memory_bytes(slot.member.memory_bytes);
    worker->set_alive(Alive(slot, now));
  }
  info.set_ready(ready);
  return info;
}

}  // namespace ringattn
