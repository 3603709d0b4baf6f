#ifndef RINGATTN_SERVER_ATTENTION_SERVICE_H_
#define RINGATTN_SERVER_ATTENTION_SERVICE_H_

// The public ringattn API (attention.proto) as the coordinator serves it. Each
// Attend call runs as an AttendCall; every call is counted in the metrics by
// method and status code. Thread-safe.

#include <atomic>
#include <string>

#include "ringattn/v1/attention.grpc.pb.h"
#include "server/attend_call.h"

namespace ringattn {

class AttentionService final : public v1::Attention::Service {
 public:
  // `state`'s pointers must outlive the service.
  explicit AttentionService(CoordinatorState state)
      : state_(std::move(state)) {}

  grpc::Status Attend(grpc::ServerContext* context,
                      AttendStream* stream) override;
  grpc::Status GetClusterInfo(grpc::ServerContext* context,
                              const v1::GetClusterInfoRequest* request,
                              v1::ClusterInfo* response) override;

 private:
  // Counts a finished call and passes its status on.
  grpc::Status Count(const char* method, const grpc::Status& status,
                     double seconds);

  const CoordinatorState state_;
  std::atomic<uint64_t> next_request_{1};
};

// Declares every metric the coordinator exports.
void DeclareCoordinatorMetrics(Metrics& metrics);

}  // namespace ringattn

#endif  // RINGATTN_SERVER_ATTENTION_SERVICE_H_
