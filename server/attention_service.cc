#include "server/attention_service.h"

#include <chrono>
#include <random>

#include "absl/strings/str_format.h"

namespace ringattn {
namespace {

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
  metrics.Declare("ringattn_tokens_total", "Query tokens answered.",
                  Metrics::Kind::kCounter);
  metrics.Declare("ringattn_flops_total", "Attention FLOPs computed.",
                  Metrics::Kind::kCounter);
  metrics.Declare("ringattn_bytes_in_total", "Tensor bytes uploaded.",
                  Metrics::Kind::kCounter);
  metrics.Declare("ringattn_bytes_out_total", "Output bytes streamed back.",
                  Metrics::Kind::kCounter);
  metrics.Declare("ringattn_workers_alive", "Workers alive now.",
                  Metrics::Kind::kGauge);
  metrics.Declare("ringattn_world_size", "Workers the cluster needs.",
                  Metrics::Kind::kGauge);
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

grpc::Status AttentionService::Attend(grpc::ServerContext* context,
                                      AttendStream* stream) {
  const auto start = std::chrono::steady_clock::now();
  static thread_local std::mt19937_64 rng(std::random_device{}());
  const std::string request_id = absl::StrFormat(
      "%06x-%08x", next_request_++ & 0xFFFFFF, static_cast<uint32_t>(rng()));
  const grpc::Status status =
      RunAttendCall(state_, context, stream, request_id);
  return Count(
      "Attend", status,
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count());
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
