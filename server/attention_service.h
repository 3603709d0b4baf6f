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

  grpc::Status Attend(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::AttendResponse, v1::AttendRequest>* stream)
      override;
  grpc::Status AttachUpload(grpc::ServerContext* context,
                            grpc::ServerReader<v1::AttachUploadRequest>* reader,
                            v1::AttachUploadResponse* response) override;
  grpc::Status AttachDownload(
      grpc::ServerContext* context, const v1::UploadTicket* ticket,
      grpc::ServerWriter<v1::AttendResponse>* writer) override;
  grpc::Status CreateContext(grpc::ServerContext* context,
                             grpc::ServerReader<v1::ContextUpload>* reader,
                             v1::ContextInfo* response) override;
  grpc::Status AppendContext(grpc::ServerContext* context,
                             grpc::ServerReader<v1::ContextUpload>* reader,
                             v1::ContextInfo* response) override;
  grpc::Status Query(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::AttendResponse, v1::QueryRequest>* stream)
      override;
  grpc::Status QueryOnce(
      grpc::ServerContext* context, const v1::QueryRequest* request,
      grpc::ServerWriter<v1::AttendResponse>* writer) override;
  grpc::Status DeleteContext(grpc::ServerContext* context,
                             const v1::DeleteContextRequest* request,
                             v1::DeleteContextResponse* response) override;
  grpc::Status ListContexts(grpc::ServerContext* context,
                            const v1::ListContextsRequest* request,
                            v1::ListContextsResponse* response) override;
  grpc::Status GetClusterInfo(grpc::ServerContext* context,
                              const v1::GetClusterInfoRequest* request,
                              v1::ClusterInfo* response) override;

 private:
  // Counts a finished call and passes its status on.
  grpc::Status Count(const char* method, const grpc::Status& status,
                     double seconds);
  // Passes `status` on; first, if it is UNAVAILABLE, evicts the workers that
  // no longer connect (a worker that died during the call), so that the next
  // calls are told the cluster is not ready instead of failing one after
  // another on the dead worker until its heartbeats run out.
  grpc::Status EvictDeadWorkersAfter(const grpc::Status& status);
  // Runs an Attend, Query or QueryOnce call and counts it.
  grpc::Status Serve(const char* method, grpc::ServerContext* context,
                     RequestStream* stream);
  // An id for a new call, unique in this process, which logs, summaries and
  // attached streams' tickets name it by.
  std::string NewRequestId();

  const CoordinatorState state_;
  std::atomic<uint64_t> next_request_{1};
};

// Declares every metric the coordinator exports.
void DeclareCoordinatorMetrics(Metrics& metrics);

}  // namespace ringattn

#endif  // RINGATTN_SERVER_ATTENTION_SERVICE_H_
