#include "worker/membership.h"

#include <algorithm>
#include <utility>

#include "spdlog/spdlog.h"

namespace ringattn {

Membership::Membership(std::shared_ptr<v1::Coordination::StubInterface> stub,
                       v1::RegisterRequest self,
                       const MembershipOptions& options)
    : stub_(std::move(stub)), self_(std::move(self)), options_(options) {}

void Membership::Stop() {
  absl::MutexLock lock(&mutex_);
  stopped_ = true;
  if (in_flight_ != nullptr) in_flight_->TryCancel();
}

bool Membership::WaitOrStop(absl::Duration duration) {
  absl::MutexLock lock(&mutex_);
  return mutex_.AwaitWithTimeout(absl::Condition(&stopped_), duration);
}

bool Membership::Begin(grpc::ClientContext& context) {
  context.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
  absl::MutexLock lock(&mutex_);
  if (stopped_) return false;
  in_flight_ = &context;
  return true;
}

bool Membership::End() {
  absl::MutexLock lock(&mutex_);
  in_flight_ = nullptr;
  return stopped_;
}

void Membership::Run() {
  bool registered = false;
  bool coordinator_reachable = true;
  v1::RegisterResponse membership;
  absl::Duration backoff = options_.first_backoff;
  for (;;) {
    if (!registered) {
      grpc::ClientContext context;
      if (!Begin(context)) return;
      v1::RegisterResponse response;
      const grpc::Status status = stub_->Register(&context, self_, &response);
      if (End()) return;
      if (status.ok()) {
        registered = true;
        coordinator_reachable = true;
        membership = response;
        backoff = options_.first_backoff;
        spdlog::info(
            "registered {} with the coordinator: rank {} of {}, epoch {}",
            self_.address(), response.rank(), response.world_size(),
            response.epoch());
        continue;
      }
      if (coordinator_reachable) {
        spdlog::warn("cannot register with the coordinator ({}): {}; retrying",
                     static_cast<int>(status.error_code()),
                     status.error_message());
        coordinator_reachable = false;
      }
      if (WaitOrStop(backoff)) return;
      backoff = std::min(2 * backoff, options_.most_backoff);
      continue;
    }
    if (WaitOrStop(options_.heartbeat_interval)) return;
    v1::HeartbeatRequest heartbeat;
    heartbeat.set_rank(membership.rank());
    heartbeat.set_epoch(membership.epoch());
    heartbeat.set_address(self_.address());
    v1::HeartbeatResponse response;
    grpc::ClientContext context;
    if (!Begin(context)) return;
    const grpc::Status status =
        stub_->Heartbeat(&context, heartbeat, &response);
    if (End()) return;
    if (!status.ok()) {
      if (coordinator_reachable) {
        spdlog::warn("heartbeat to the coordinator failed ({}): {}",
                     static_cast<int>(status.error_code()),
                     status.error_message());
        coordinator_reachable = false;
      }
      continue;
    }
    if (!coordinator_reachable) {
      spdlog::info("the coordinator answers heartbeats again");
      coordinator_reachable = true;
    }
    if (!response.registered()) {
      spdlog::warn(
          "the coordinator forgot {} (it restarted?); registering again",
          self_.address());
      registered = false;
    }
  }
}

}  // namespace ringattn
