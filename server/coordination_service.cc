#include "server/coordination_service.h"

#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "proto/grpc_status.h"
#include "spdlog/spdlog.h"

namespace ringattn {

grpc::Status CoordinationService::Register(grpc::ServerContext*,
                                           const v1::RegisterRequest* request,
                                           v1::RegisterResponse* response) {
  absl::StatusOr<v1::RegisterResponse> registered =
      cluster_->Register(*request);
  if (!registered.ok()) {
    spdlog::warn("worker {} refused: {}", request->address(),
                 registered.status().ToString());
    return ToGrpcStatus(registered.status());
  }
  *response = *registered;
  spdlog::info("worker {} ({}) joined as rank {} (epoch {})",
               request->address(), request->device(), response->rank(),
               response->epoch());
  return grpc::Status::OK;
}

grpc::Status CoordinationService::Heartbeat(grpc::ServerContext*,
                                            const v1::HeartbeatRequest* request,
                                            v1::HeartbeatResponse* response) {
  response->set_registered(
      cluster_->Heartbeat(request->rank(), request->address()));
  return grpc::Status::OK;
}

grpc::Status CoordinationService::StoreSet(grpc::ServerContext*,
                                           const v1::StoreSetRequest* request,
                                           v1::StoreSetResponse*) {
  store_->Set(request->key(), request->value());
  return grpc::Status::OK;
}

grpc::Status CoordinationService::StoreGet(grpc::ServerContext* context,
                                           const v1::StoreGetRequest* request,
                                           v1::StoreGetResponse* response) {
  const std::vector<std::string> keys(request->keys().begin(),
                                      request->keys().end());
  // Wait in short slices so a cancelled caller does not hold a thread.
  const absl::Time deadline = std::min(absl::FromChrono(context->deadline()),
                                       absl::Now() + absl::Minutes(10));
  while (true) {
    const absl::Time slice = std::min(deadline, absl::Now() + absl::Seconds(1));
    absl::StatusOr<std::vector<std::string>> values = store_->Get(keys, slice);
    if (values.ok()) {
      for (std::string& value : *values) response->add_values(std::move(value));
      return grpc::Status::OK;
    }
    if (context->IsCancelled()) {
      return grpc::Status(grpc::StatusCode::CANCELLED, "caller went away");
    }
    if (absl::Now() >= deadline) return ToGrpcStatus(values.status());
  }
}

}  // namespace ringattn
