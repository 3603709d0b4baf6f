// ringattn-coordinator: the public gRPC service, the workers' registry and
// rendezvous, gRPC health, and /healthz /readyz /metrics over HTTP. Runs until
// SIGINT or SIGTERM.

#include <csignal>
#include <memory>
#include <optional>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "core/large_buffers.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "security/tls_credentials.h"
#include "server/admission_control.h"
#include "server/attention_service.h"
#include "server/bearer_token_auth.h"
#include "server/cluster.h"
#include "server/coordination_service.h"
#include "server/http_endpoints.h"
#include "server/metrics.h"
#include "server/rendezvous_store.h"
#include "server/ring_warm_up.h"
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
ABSL_FLAG(int, max_concurrent_requests, 2,
          "requests computed at once (each uses every worker, and the workers "
          "keep a ring communicator for each); more wait in line");
ABSL_FLAG(double, ring_timeout_seconds, 60,
          "how long workers wait on each other before failing a request");
ABSL_FLAG(int, worker_row_streams, 4,
          "streams, each on a connection of its own, that carry a large "
          "request's rows to each worker and its output back, or a large "
          "context upload's rows (1: its Execute or StoreContext stream "
          "alone); one gRPC stream moves about 1.4 GB/s");
ABSL_FLAG(int64_t, row_streams_min_bytes, int64_t{8} << 20,
          "a request or context upload sending fewer bytes to a worker than "
          "this uses one stream to it");
ABSL_FLAG(double, heartbeat_timeout_seconds, 3,
          "a worker silent this long is considered dead");
ABSL_FLAG(bool, warm_up_ring, true,
          "when the cluster forms, run two tiny internal requests so that the "
          "workers make their ring communicator before the first request "
          "needs it (about 0.5 s on GPUs)");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain of the gRPC port; with --tls_key, clients "
          "and workers must connect over TLS");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA bundle: every client of the gRPC port, workers included, "
          "must present a certificate it verifies (mutual TLS); needs "
          "--tls_cert");
ABSL_FLAG(std::string, auth_token_file, "",
          "file of bearer tokens, one per line: every call of the Attention "
          "service must carry 'authorization: Bearer <one of them>' (health "
          "and worker registration stay open); needs --tls_cert");
ABSL_FLAG(std::string, worker_tls_ca, "",
          "PEM CA bundle that verifies the workers' certificates: calls to "
          "workers go over TLS");
ABSL_FLAG(std::string, worker_tls_cert, "",
          "PEM certificate presented to workers that require client "
          "certificates (their --tls_ca)");
ABSL_FLAG(std::string, worker_tls_key, "",
          "PEM private key of --worker_tls_cert");
ABSL_FLAG(std::string, worker_tls_server_name, "",
          "name the workers' certificates must carry, instead of the address "
          "each worker advertises (one certificate for every worker)");

namespace ringattn {
namespace {

// Credentials of the gRPC port: --tls_* and, with --auth_token_file, the
// bearer-token check of the Attention service.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> PortCredentials() {
  const TlsFiles files{absl::GetFlag(FLAGS_tls_cert),
                       absl::GetFlag(FLAGS_tls_key),
                       absl::GetFlag(FLAGS_tls_ca)};
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      ServerCredentials(files, "--tls");
  if (!credentials.ok()) return credentials.status();
  const std::string token_file = absl::GetFlag(FLAGS_auth_token_file);
  if (token_file.empty()) return credentials;
  if (files.cert.empty()) {
    return absl::InvalidArgumentError(
        "--auth_token_file needs --tls_cert and --tls_key: bearer tokens "
        "must not travel in plaintext");
  }
  absl::StatusOr<BearerTokens> tokens = BearerTokens::FromFile(token_file);
  if (!tokens.ok()) return tokens.status();
  (*credentials)
      ->SetAuthMetadataProcessor(
          std::make_shared<BearerTokenProcessor>(*std::move(tokens)));
  return credentials;
}

// How the coordinator opens channels to its workers: --worker_tls_*.
absl::StatusOr<Cluster::ChannelFactory> WorkerChannels() {
  const TlsFiles files{absl::GetFlag(FLAGS_worker_tls_cert),
                       absl::GetFlag(FLAGS_worker_tls_key),
                       absl::GetFlag(FLAGS_worker_tls_ca)};
  const std::string server_name = absl::GetFlag(FLAGS_worker_tls_server_name);
  if (files.empty()) {
    if (!server_name.empty()) {
      return absl::InvalidArgumentError(
          "--worker_tls_server_name needs --worker_tls_ca: it names the "
          "workers' certificates");
    }
    return Cluster::ChannelFactory(Cluster::PlaintextChannel);
  }
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      ChannelCredentials(files, "--worker_tls");
  if (!credentials.ok()) return credentials.status();
  return Cluster::ChannelFactory(
      [credentials = *std::move(credentials), server_name](
          const std::string& address, grpc::ChannelArguments arguments) {
        if (!server_name.empty()) {
          arguments.SetSslTargetNameOverride(server_name);
        }
        return grpc::CreateCustomChannel(address, credentials, arguments);
      });
}

int Main() {
  const int world_size = absl::GetFlag(FLAGS_world_size);
  if (world_size < 1) {
    spdlog::error("--world_size must be >= 1 (the number of workers), got {}",
                  world_size);
    return 2;
  }
  const int row_streams = absl::GetFlag(FLAGS_worker_row_streams);
  if (row_streams < 1 || row_streams > 16) {
    spdlog::error("--worker_row_streams must be in [1, 16], got {}",
                  row_streams);
    return 2;
  }
  if (absl::GetFlag(FLAGS_row_streams_min_bytes) < 0) {
    spdlog::error("--row_streams_min_bytes must be >= 0, got {}",
                  absl::GetFlag(FLAGS_row_streams_min_bytes));
    return 2;
  }
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> port_credentials =
      PortCredentials();
  absl::StatusOr<Cluster::ChannelFactory> worker_channels = WorkerChannels();
  for (const absl::Status& status :
       {port_credentials.status(), worker_channels.status()}) {
    if (!status.ok()) {
      spdlog::error("{}", status.ToString());
      return 2;
    }
  }
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  Cluster cluster(world_size,
                  std::chrono::milliseconds(static_cast<int64_t>(
                      absl::GetFlag(FLAGS_heartbeat_timeout_seconds) * 1000)),
                  *std::move(worker_channels), row_streams - 1);
  RendezvousStore store;
  Metrics metrics;
  DeclareCoordinatorMetrics(metrics);
  CoordinatorOptions options;
  options.max_request_bytes = absl::GetFlag(FLAGS_max_request_bytes);
  options.max_inflight_bytes = absl::GetFlag(FLAGS_max_inflight_bytes);
  options.ring_timeout =
      absl::Seconds(absl::GetFlag(FLAGS_ring_timeout_seconds));
  options.row_streams_min_bytes = absl::GetFlag(FLAGS_row_streams_min_bytes);
  AdmissionControl admission(options.max_inflight_bytes,
                             absl::GetFlag(FLAGS_max_concurrent_requests));
  ContextRegistry contexts;
  // A kept ring communicator for each request computed at once.
  CommunicatorKeys communicator_keys(
      store, CommunicatorKeys::NewInstance(),
      absl::GetFlag(FLAGS_max_concurrent_requests));
  RequestRegistry<SharedUpload> uploads;
  RequestRegistry<SharedDownload> downloads;
  const CoordinatorState state{
      options,   &cluster,           &store,   &metrics,  &admission,
      &contexts, &communicator_keys, &uploads, &downloads};
  AttentionService attention(state);
  std::optional<RingWarmUp> warm_up;
  if (absl::GetFlag(FLAGS_warm_up_ring)) warm_up.emplace(state);
  CoordinationService coordination(&cluster, &store);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int port = 0;
  const std::string host = absl::GetFlag(FLAGS_host);
  builder.AddListeningPort(absl::StrCat(host, ":", absl::GetFlag(FLAGS_port)),
                           *port_credentials, &port);
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
      "coordinator listening on {}:{} (gRPC {}{}; HTTP {}), waiting for {} "
      "workers",
      host, port,
      absl::GetFlag(FLAGS_tls_cert).empty()
          ? "plaintext"
          : (absl::GetFlag(FLAGS_tls_ca).empty() ? "over TLS"
                                                 : "over mutual TLS"),
      absl::GetFlag(FLAGS_auth_token_file).empty() ? ""
                                                   : ", bearer tokens required",
      (*http)->port(), world_size);

  // gRPC health follows readiness: SERVING once every worker has joined. Each
  // newly formed cluster is warmed up.
  absl::Notification stopping;
  std::thread health([&] {
    bool ready = false;
    server->GetHealthCheckService()->SetServingStatus(false);
    while (!stopping.WaitForNotificationWithTimeout(absl::Milliseconds(250))) {
      if (warm_up.has_value()) warm_up->Poll();
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
  warm_up.reset();
  return 0;
}

}  // namespace
}  // namespace ringattn

int main(int argc, char** argv) {
  ringattn::KeepLargeBuffersInTheHeap();
  absl::SetProgramUsageMessage(
      "ringattn-coordinator --world_size P [--host 127.0.0.1] [--port 50051] "
      "[--http_port 8080] [--tls_cert F --tls_key F [--tls_ca F] "
      "[--auth_token_file F]] [--worker_tls_ca F [--worker_tls_cert F "
      "--worker_tls_key F]]");
  absl::ParseCommandLine(argc, argv);
  // Microseconds: a decode step's phases are a few hundred of them apart.
  spdlog::set_pattern("[%Y-%m-%d %H:%M:%S.%f] [%l] %v");
  return ringattn::Main();
}
