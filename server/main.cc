// ringattn-coordinator: the public gRPC service, the workers' registry and
// rendezvous, gRPC health, and /healthz /readyz /metrics over HTTP. Runs until
// SIGINT or SIGTERM.

#include <csignal>
#include <memory>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "server/admission_control.h"
#include "server/attention_service.h"
#include "server/cluster.h"
#include "server/coordination_service.h"
#include "server/http_endpoints.h"
#include "server/metrics.h"
#include "server/rendezvous_store.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, host, "127.0.0.1",
          "address the gRPC and HTTP ports listen on (0.0.0.0: every "
          "interface)");
ABSL_FLAG(int, port, 50051, "gRPC port (0: any free port)");
ABSL_FLAG(int, http_port, 8080,
          "HTTP port for /healthz /readyz /metrics (0: any)");
ABSL_FLAG(int, world_size, 0, "number of workers the cluster needs (required)");
ABSL_FLAG(int64_t, max_request_bytes, int64_t{8} << 30,
          "largest Q + K + V upload of one request, in wire bytes");
ABSL_FLAG(int64_t, max_inflight_bytes, int64_t{16} << 30,
          "wire bytes all admitted requests may hold together; more wait");
ABSL_FLAG(
    int, max_concurrent_requests, 2,
    "requests computed at once (each uses every worker); more wait in line");
ABSL_FLAG(double, ring_timeout_seconds, 60,
          "how long workers wait on each other before failing a request");
ABSL_FLAG(double, heartbeat_timeout_seconds, 3,
          "a worker silent this long is considered dead");

namespace ringattn {
namespace {

int Main() {
  const int world_size = absl::GetFlag(FLAGS_world_size);
  if (world_size < 1) {
    spdlog::error("--world_size must be >= 1 (the number of workers), got {}",
                  world_size);
    return 2;
  }
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  Cluster cluster(world_size,
                  std::chrono::milliseconds(static_cast<int64_t>(
                      absl::GetFlag(FLAGS_heartbeat_timeout_seconds) * 1000)));
  RendezvousStore store;
  Metrics metrics;
  DeclareCoordinatorMetrics(metrics);
  CoordinatorOptions options;
  options.max_request_bytes = absl::GetFlag(FLAGS_max_request_bytes);
  options.max_inflight_bytes = absl::GetFlag(FLAGS_max_inflight_bytes);
  options.ring_timeout =
      absl::Seconds(absl::GetFlag(FLAGS_ring_timeout_seconds));
  AdmissionControl admission(options.max_inflight_bytes,
                             absl::GetFlag(FLAGS_max_concurrent_requests));
  ContextRegistry contexts;
  AttentionService attention(CoordinatorState{options, &cluster, &store,
                                              &metrics, &admission, &contexts});
  CoordinationService coordination(&cluster, &store);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int port = 0;
  const std::string host = absl::GetFlag(FLAGS_host);
  builder.AddListeningPort(absl::StrCat(host, ":", absl::GetFlag(FLAGS_port)),
                           grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&attention);
  builder.RegisterService(&coordination);
  builder.SetMaxReceiveMessageSize(16 << 20);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    spdlog::error("cannot listen for gRPC on {}:{}", host,
                  absl::GetFlag(FLAGS_port));
    return 1;
  }
  auto refresh = [&] {
    metrics.Set("ringattn_workers_alive", {}, cluster.LiveWorkers());
    metrics.Set("ringattn_world_size", {}, world_size);
    metrics.Set("ringattn_inflight_bytes", {},
                static_cast<double>(admission.in_use()));
    metrics.Set("ringattn_requests_waiting", {},
                static_cast<double>(admission.waiting()));
  };
  absl::StatusOr<std::unique_ptr<HttpEndpoints>> http = HttpEndpoints::Start(
      host, absl::GetFlag(FLAGS_http_port), &cluster, &metrics, refresh);
  if (!http.ok()) {
    spdlog::error("{}", http.status().ToString());
    return 1;
  }
  spdlog::info(
      "coordinator listening on {}:{} (HTTP {}), waiting for {} workers", host,
      port, (*http)->port(), world_size);

  // gRPC health follows readiness: SERVING once every worker has joined.
  absl::Notification stopping;
  std::thread health([&] {
    bool ready = false;
    server->GetHealthCheckService()->SetServingStatus(false);
    while (!stopping.WaitForNotificationWithTimeout(absl::Milliseconds(250))) {
      const bool now = cluster.Ready();
      if (now == ready) continue;
      ready = now;
      server->GetHealthCheckService()->SetServingStatus(ready);
      spdlog::info("cluster {}", ready ? "ready" : "not ready");
    }
  });

  int signal = 0;
  sigwait(&signals, &signal);
  spdlog::info("signal {}: shutting down", signal);
  stopping.Notify();
  health.join();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  return 0;
}

}  // namespace
}  // namespace ringattn

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "ringattn-coordinator --world_size P [--port 50051] [--http_port 8080]");
  absl::ParseCommandLine(argc, argv);
  return ringattn::Main();
}
