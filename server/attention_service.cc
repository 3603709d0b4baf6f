#include "server/attention_service.h"

#include <chrono>
#include <random>
#include <utility>

#include "absl/strings/str_format.h"
#include "proto/grpc_status.h"
#include "server/attach_download.h"
#include "server/attach_upload.h"
#include "server/context_upload.h"
#include "spdlog/spdlog.h"

namespace ringattn {
namespace {

// How long a worker whose channel is down after a failed call has to connect
// before it is evicted: a live worker connects in milliseconds, a dead one is
// refused at once, and a host that stopped answering uses all of it.
constexpr std::chrono::milliseconds kReconnectPatience{1000};

const char* CodeName(grpc::StatusCode code) {
  static const char* const kNames[] = {"OK",
                                       "CANCELLED",
                                       "UNKNOWN",
                                       "INVALID_ARGUMENT",
                                       "DEADLINE_EXCEEDED",
                                       "NOT_FOUND",
                                       "ALREADY_EXISTS",
                                       "PERMISSION_DENIED",
                                       "RESOURCE_EXHAUSTED",
                                       "FAILED_PRECONDITION",
                                       "ABORTED",
                                       "OUT_OF_RANGE",
                                       "UNIMPLEMENTED",
                                       "INTERNAL",
                                       "UNAVAILABLE",
                                       "DATA_LOSS",
                                       "UNAUTHENTICATED"};
  const int index = static_cast<int>(code);
  return index >= 0 && index < 17 ? kNames[index] : "UNKNOWN";
}

}  // namespace

void DeclareCoordinatorMetrics(Metrics& metrics) {
  metrics.Declare("ringattn_requests_total",
                  "Finished calls by method and gRPC status code.",
                  Metrics::Kind::kCounter);
  metrics.Declare("ringattn_request_seconds", "Wall time of calls by method.",
                  Metrics::Kind::kHistogram,
                  {0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300});
  metrics.Declare("ringattn_phase_seconds",
                  "Wall time of request phases (upload, compute).",
                  Metrics::Kind::kHistogram,
                  {0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300});
  metrics.Declare("ringattn_strategy_requests_total",
                  "Attention requests computed, by the strategy that ran.",
                  Metrics::Kind::kCounter);
  metrics.Declare("ringattn_partial_merge_requests_total",
                  "Broadcast-Q requests computed, by where their partials "
                  "merged: coordinator or workers.",
                  Metrics::Kind::kCounter);
  metrics.Declare("ringattn_kernel_launches_total",
                  "Attention kernel launches on the workers, by the kernel "
                  "that ran: cpu_block, cpu_decode, cudnn, flash, hopper or "
                  "decode (worker.proto, ExecuteDone).",
                  Metrics::Kind::kCounter);
  metrics.Declare("ringattn_tokens_total", "Query tokens answered.",
                  Metrics::Kind::kCounter);
  metrics.Declare("ringattn_flops_total", "Attention FLOPs computed.",
                  Metrics::Kind::kCounter);
  metrics.Declare("ringattn_bytes_in_total", "Tensor bytes uploaded.",
                  Metrics::Kind::kCounter);
  metrics.Declare("ringattn_bytes_out_total", "Output bytes streamed back.",
                  Metrics::Kind::kCounter);
  metrics.Declare("ringattn_ring_communicators_total",
                  "Rings formed, by the communicator the workers used: "
                  "reused (kept from an earlier request), new (made and "
                  "kept) or own (made for that request alone).",
                  Metrics::Kind::kCounter);
  metrics.Declare("ringattn_worker_row_streams_total",
                  "AttachRows streams opened to carry a large upload's rows "
                  "to a worker beside its Execute stream, and its output "
                  "back, or beside its StoreContext stream.",
                  Metrics::Kind::kCounter);
  metrics.Declare("ringattn_workers_alive", "Workers alive now.",
                  Metrics::Kind::kGauge);
  metrics.Declare("ringattn_world_size", "Workers the cluster needs.",
                  Metrics::Kind::kGauge);
  metrics.Declare("ringattn_workers_evicted_total",
                  "Workers evicted because they did not connect after a "
                  "call failed with UNAVAILABLE (before their heartbeats ran "
                  "out).",
                  Metrics::Kind::kCounter);
  metrics.Declare("ringattn_inflight_bytes",
                  "Request bytes admitted and in flight.",
                  Metrics::Kind::kGauge);
  metrics.Declare("ringattn_requests_waiting",
                  "Requests waiting for admission.", Metrics::Kind::kGauge);
}

grpc::Status AttentionService::Count(const char* method,
                                     const grpc::Status& status,
                                     double seconds) {
  state_.metrics->Add(
      "ringattn_requests_total",
      {{"method", method}, {"code", CodeName(status.error_code())}}, 1);
  state_.metrics->Observe("ringattn_request_seconds", {{"method", method}},
                          seconds);
  return status;
}

grpc::Status AttentionService::EvictDeadWorkersAfter(
    const grpc::Status& status) {
  if (status.error_code() != grpc::StatusCode::UNAVAILABLE) return status;
  for (const Cluster::Member& dead :
       state_.cluster->EvictUnreachable(kReconnectPatience)) {
    spdlog::warn(
        "worker {} ({}) evicted: it does not connect after a call failed "
        "with UNAVAILABLE; the cluster is not ready until it registers again",
        dead.rank, dead.address);
    state_.metrics->Add("ringattn_workers_evicted_total", {}, 1);
  }
  return status;
}

namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

// Attend's stream as it is.
class AttendStream final : public RequestStream {
 public:
  explicit AttendStream(
      grpc::ServerReaderWriter<v1::AttendResponse, v1::AttendRequest>* stream)
      : stream_(stream) {}
  bool Read(v1::AttendRequest* request) override {
    return stream_->Read(request);
  }
  bool Write(const v1::AttendResponse& response) override {
    return stream_->Write(response);
  }
  bool WriteLast(const v1::AttendResponse& response) override {
    return stream_->Write(response, grpc::WriteOptions().set_last_message());
  }
  void SendInitialMetadata() override { stream_->SendInitialMetadata(); }
  const std::string& context_name() const override { return none_; }
  int64_t append_length() const override { return 0; }

 private:
  grpc::ServerReaderWriter<v1::AttendResponse, v1::AttendRequest>* const
      stream_;
  const std::string none_;
};

// QueryOnce's one request and its writer, read and written as Query's stream.
class SingleQuery {
 public:
  SingleQuery(const v1::QueryRequest* request,
              grpc::ServerWriter<v1::AttendResponse>* writer)
      : request_(request), writer_(writer) {}
  bool Read(v1::QueryRequest* query) {
    if (read_) return false;
    read_ = true;
    *query = *request_;  // at most the header's carried rows: a small copy
    return true;
  }
  bool Write(const v1::AttendResponse& response,
             grpc::WriteOptions options = grpc::WriteOptions()) {
    return writer_->Write(response, options);
  }
  void SendInitialMetadata() { writer_->SendInitialMetadata(); }

 private:
  const v1::QueryRequest* const request_;
  grpc::ServerWriter<v1::AttendResponse>* const writer_;
  bool read_ = false;
};

// Query's stream (or QueryOnce's SingleQuery), seen as Attend messages: the
// header's spec becomes the header, the chunks it carries come next as chunk
// messages, and the context it names is remembered.
template <typename Stream>
class QueryStream final : public RequestStream {
 public:
  explicit QueryStream(Stream* stream) : stream_(stream) {}
  bool Read(v1::AttendRequest* request) override {
    request->Clear();
    if (next_carried_ < carried_.size()) {
      *request->mutable_chunk() = std::move(carried_[next_carried_++]);
      return true;
    }
    v1::QueryRequest query;
    if (!stream_->Read(&query)) return false;
    if (query.has_header()) {
      context_ = query.header().context();
      if (context_.empty()) context_ = "(unnamed)";
      append_length_ = query.header().append_length();
      carried_ = std::move(*query.mutable_header()->mutable_chunks());
      next_carried_ = 0;
      *request->mutable_header() =
          std::move(*query.mutable_header()->mutable_spec());
    } else if (query.has_chunk()) {
      // Moved, not copied: a chunk is up to megabytes of query rows.
      *request->mutable_chunk() = std::move(*query.mutable_chunk());
    }
    return true;
  }
  bool Write(const v1::AttendResponse& response) override {
    return stream_->Write(response);
  }
  bool WriteLast(const v1::AttendResponse& response) override {
    return stream_->Write(response, grpc::WriteOptions().set_last_message());
  }
  void SendInitialMetadata() override { stream_->SendInitialMetadata(); }
  const std::string& context_name() const override { return context_; }
  int64_t append_length() const override { return append_length_; }

 private:
  Stream* const stream_;
  std::string context_;
  int64_t append_length_ = 0;
  // The chunks the header carried, handed out by Read before the next message.
  google::protobuf::RepeatedPtrField<v1::TensorChunk> carried_;
  int next_carried_ = 0;
};

}  // namespace

grpc::Status AttentionService::Serve(const char* method,
                                     grpc::ServerContext* context,
                                     RequestStream* stream) {
  const auto start = std::chrono::steady_clock::now();
  const grpc::Status status = EvictDeadWorkersAfter(
      RunAttendCall(state_, context, stream, NewRequestId()));
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
    // A failed call commits nothing: a query's new rows were taken back.
    context->AddTrailingMetadata(kUnchangedKey, "1");
  }
  return Count(method, status, SecondsSince(start));
}

std::string AttentionService::NewRequestId() {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  return absl::StrFormat("%06x-%08x", next_request_++ & 0xFFFFFF,
                         static_cast<uint32_t>(rng()));
}

grpc::Status AttentionService::Attend(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<v1::AttendResponse, v1::AttendRequest>* stream) {
  AttendStream adapter(stream);
  return Serve("Attend", context, &adapter);
}

grpc::Status AttentionService::Query(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<v1::AttendResponse, v1::QueryRequest>* stream) {
  QueryStream adapter(stream);
  return Serve("Query", context, &adapter);
}

grpc::Status AttentionService::QueryOnce(
    grpc::ServerContext* context, const v1::QueryRequest* request,
    grpc::ServerWriter<v1::AttendResponse>* writer) {
  SingleQuery single(request, writer);
  QueryStream adapter(&single);
  return Serve("QueryOnce", context, &adapter);
}

grpc::Status AttentionService::AttachUpload(
    grpc::ServerContext* context,
    grpc::ServerReader<v1::AttachUploadRequest>* reader,
    v1::AttachUploadResponse* response) {
  const auto start = std::chrono::steady_clock::now();
  return Count("AttachUpload",
               RunAttachUpload(*state_.uploads, context, reader, response),
               SecondsSince(start));
}

grpc::Status AttentionService::AttachDownload(
    grpc::ServerContext* context, const v1::UploadTicket* ticket,
    grpc::ServerWriter<v1::AttendResponse>* writer) {
  const auto start = std::chrono::steady_clock::now();
  return Count("AttachDownload",
               RunAttachDownload(*state_.downloads, context, *ticket, writer),
               SecondsSince(start));
}

grpc::Status AttentionService::CreateContext(
    grpc::ServerContext* context, grpc::ServerReader<v1::ContextUpload>* reader,
    v1::ContextInfo* response) {
  const auto start = std::chrono::steady_clock::now();
  return Count("CreateContext",
               EvictDeadWorkersAfter(RunContextUpload(
                   state_, context, reader, true, NewRequestId(), response)),
               SecondsSince(start));
}

grpc::Status AttentionService::AppendContext(
    grpc::ServerContext* context, grpc::ServerReader<v1::ContextUpload>* reader,
    v1::ContextInfo* response) {
  const auto start = std::chrono::steady_clock::now();
  return Count("AppendContext",
               EvictDeadWorkersAfter(RunContextUpload(
                   state_, context, reader, false, NewRequestId(), response)),
               SecondsSince(start));
}

grpc::Status AttentionService::DeleteContext(
    grpc::ServerContext*, const v1::DeleteContextRequest* request,
    v1::DeleteContextResponse*) {
  absl::StatusOr<ResidentContext> removed =
      state_.contexts->Remove(request->name());
  if (!removed.ok()) {
    return Count("DeleteContext", ToGrpcStatus(removed.status()), 0);
  }
  DropOnWorkers(state_, request->name(), 0);
  return Count("DeleteContext", grpc::Status::OK, 0);
}

grpc::Status AttentionService::ListContexts(
    grpc::ServerContext*, const v1::ListContextsRequest*,
    v1::ListContextsResponse* response) {
  for (const ResidentContext& context : state_.contexts->List()) {
    *response->add_contexts() = context.Info();
  }
  return Count("ListContexts", grpc::Status::OK, 0);
}

grpc::Status AttentionService::GetClusterInfo(grpc::ServerContext*,
                                              const v1::GetClusterInfoRequest*,
                                              v1::ClusterInfo* response) {
  *response = state_.cluster->Info();
  response->set_max_request_bytes(state_.options.max_request_bytes);
  response->set_version("ringattn 0.1");
  return Count("GetClusterInfo", grpc::Status::OK, 0);
}

}  // namespace ringattn
