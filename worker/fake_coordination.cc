#include "worker/fake_coordination.h"

#include <algorithm>
#include <chrono>

#include "grpcpp/server_context.h"

namespace ringattn {

grpc::Status FakeCoordination::Register(grpc::ServerContext*,
                                        const v1::RegisterRequest* request,
                                        v1::RegisterResponse* response) {
  absl::MutexLock lock(&mutex_);
  auto [it, added] =
      ranks_.emplace(request->address(), static_cast<int>(ranks_.size()));
  response->set_rank(it->second);
  response->set_world_size(static_cast<int>(ranks_.size()));
  response->set_epoch(epoch_);
  ++registrations_;
  last_address_ = request->address();
  return grpc::Status::OK;
}

grpc::Status FakeCoordination::Heartbeat(grpc::ServerContext*,
                                         const v1::HeartbeatRequest* request,
                                         v1::HeartbeatResponse* response) {
  absl::MutexLock lock(&mutex_);
  const bool registered =
      request->epoch() == epoch_ && ranks_.count(request->address()) != 0;
  response->set_registered(registered);
  if (registered) ++heartbeats_;
  return grpc::Status::OK;
}

grpc::Status FakeCoordination::StoreSet(grpc::ServerContext*,
                                        const v1::StoreSetRequest* request,
                                        v1::StoreSetResponse*) {
  absl::MutexLock lock(&mutex_);
  store_[request->key()] = request->value();
  return grpc::Status::OK;
}

grpc::Status FakeCoordination::StoreGet(grpc::ServerContext* context,
                                        const v1::StoreGetRequest* request,
                                        v1::StoreGetResponse* response) {
  const absl::Time deadline = absl::FromChrono(context->deadline());
  absl::MutexLock lock(&mutex_);
  auto all_present = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    return std::all_of(
        request->keys().begin(), request->keys().end(),
        [&](const std::string& key) { return store_.count(key) != 0; });
  };
  // Wakes up now and then to notice a cancelled call.
  while (!mutex_.AwaitWithDeadline(
      absl::Condition(&all_present),
      std::min(deadline, absl::Now() + absl::Milliseconds(100)))) {
    if (context->IsCancelled()) {
      return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
    }
    if (absl::Now() >= deadline) {
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                          "keys did not appear in time");
    }
  }
  for (const std::string& key : request->keys()) {
    response->add_values(store_[key]);
  }
  return grpc::Status::OK;
}

void FakeCoordination::Restart() {
  absl::MutexLock lock(&mutex_);
  ranks_.clear();
  ++epoch_;
  heartbeats_ = 0;
}

bool FakeCoordination::AwaitRegistrations(int count, absl::Duration timeout) {
  absl::MutexLock lock(&mutex_);
  auto reached = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    return registrations_ >= count;
  };
  return mutex_.AwaitWithTimeout(absl::Condition(&reached), timeout);
}

bool FakeCoordination::AwaitHeartbeats(int count, absl::Duration timeout) {
  absl::MutexLock lock(&mutex_);
  auto reached = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    return heartbeats_ >= count;
  };
  return mutex_.AwaitWithTimeout(absl::Condition(&reached), timeout);
}

std::string FakeCoordination::last_address() const {
  absl::MutexLock lock(&mutex_);
  return last_address_;
}

}  // namespace ringattn
