// ringattn-worker: a worker of the ringattn service, on the CPU or on one CUDA
// device (--device cuda:N). It serves the Worker gRPC service, registers with
// the coordinator (and keeps registered through heartbeats), and passes K/V
// blocks to the other workers over Gloo/TCP (CPU) or NCCL (CUDA). It exits
// cleanly on SIGTERM or SIGINT.

#include <signal.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "core/large_buffers.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "ringattn/v1/worker.grpc.pb.h"
#include "security/tls_credentials.h"
#include "spdlog/spdlog.h"
#include "worker/device.h"
#include "worker/executor_memory_pool.h"
#include "worker/gloo_communicator.h"
#include "worker/gpu_ring_executor.h"
#include "worker/grpc_store.h"
#include "worker/membership.h"
#include "worker/nccl_communicator.h"
#include "worker/worker_service.h"

ABSL_FLAG(std::string, coordinator, "",
          "HOST:PORT of the coordinator's Coordination service (required)");
ABSL_FLAG(std::string, device, "cpu",
          "compute device: cpu, or cuda:N for CUDA device N");
ABSL_FLAG(std::string, host, "127.0.0.1",
          "address of this machine that the coordinator and the other workers "
          "reach it by; advertised with the port, and used for ring traffic");
ABSL_FLAG(int32_t, port, 0, "port of the Worker service; 0 picks a free one");
ABSL_FLAG(std::string, listen, "",
          "address the Worker service listens on (0.0.0.0: every interface); "
          "empty: --host's address");
ABSL_FLAG(std::string, gloo_interface, "",
          "network interface for ring traffic instead of --host's address");
ABSL_FLAG(int64_t, memory_bytes, 0,
          "memory requests may hold together (device memory with --device "
          "cuda:N); 0: half of physical memory, or 90% of the device's free "
          "memory");
ABSL_FLAG(int32_t, max_concurrent, 4,
          "requests executed at once; more get RESOURCE_EXHAUSTED");
ABSL_FLAG(int64_t, compute_linger_us, -1,
          "how long a compute thread whose request ended polls for the next "
          "before it sleeps, in microseconds (a core busy meanwhile; the next "
          "request then starts without a thread wake-up); -1: 2000 with "
          "--device cuda:N, 0 on the CPU, whose cores compute");
ABSL_FLAG(double, pinned_staging_gib,
          static_cast<double>(ringattn::DefaultMostPinnedStagingBytes()) /
              (int64_t{1} << 30),
          "with --device cuda:N, a request's host staging of at most this "
          "many GiB is page-locked once its pages are in, so that it crosses "
          "to the device as DMA; while the request holds it, locked memory "
          "cannot be swapped out or used by anything else on the host "
          "(default: a quarter of this host's memory; 0: never)");
ABSL_FLAG(int64_t, pinned_staging_buffer_mib, 16,
          "with --device cuda:N, each of --max_concurrent requests whose host "
          "staging fits this many MiB stages in a page-locked buffer kept for "
          "reuse, all page-locked when the worker starts (0: none)");
ABSL_FLAG(double, ring_timeout_seconds, 60,
          "how long a rank waits for its peers when a request sets no "
          "timeout");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain: with --tls_key the Worker service is served "
          "over TLS, and it is this worker's client certificate towards the "
          "coordinator");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA bundle: callers of the Worker service (the coordinator) "
          "must present a certificate it verifies (mutual TLS); needs "
          "--tls_cert");
ABSL_FLAG(std::string, coordinator_tls_ca, "",
          "PEM CA bundle that verifies the coordinator's certificate: "
          "registration and rendezvous go over TLS (presenting --tls_cert "
          "when given)");

namespace ringattn {
namespace {

// Exit codes.
constexpr int kUsageError = 2;
constexpr int kStartupError = 1;
constexpr int kMaxReceiveMessageBytes = 20 << 20;

int64_t HalfOfPhysicalMemory() {
  const int64_t pages = sysconf(_SC_PHYS_PAGES);
  const int64_t page_size = sysconf(_SC_PAGESIZE);
  return pages > 0 && page_size > 0 ? pages * page_size / 2 : int64_t{4} << 30;
}

std::string Hostname() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "";
  return name;
}

int Usage(const std::string& message) {
  std::fprintf(stderr, "ringattn-worker: %s\n", message.c_str());
  return kUsageError;
}

int Main() {
  const std::string coordinator = absl::GetFlag(FLAGS_coordinator);
  if (coordinator.empty()) {
    return Usage("--coordinator HOST:PORT is required");
  }
  const absl::StatusOr<DeviceChoice> device =
      ParseDevice(absl::GetFlag(FLAGS_device));
  if (!device.ok()) return Usage(std::string(device.status().message()));
  std::string device_description = "cpu";
  int64_t device_memory_bytes = 0;
  if (device->is_cuda()) {
    // NCCL reads its environment once, at its first communicator, and CUDA
    // at its first call; set both before any thread starts.
    DisableNcclMulticast();
    LoadKernelsEagerly();
    const absl::StatusOr<CudaDeviceInfo> info =
        OpenCudaDevice(device->cuda_index);
    if (!info.ok()) return Usage(std::string(info.status().message()));
    device_memory_bytes = info->free_bytes / 10 * 9;
    const absl::Time filling = absl::Now();
    if (absl::Status filled = FillExecutorMemoryPool(device->cuda_index);
        filled.ok()) {
      spdlog::info("mapped the executors' memory pool ({} MiB) in {}",
                   kExecutorMemoryKeptBytes >> 20,
                   absl::FormatDuration(absl::Now() - filling));
    } else {
      spdlog::warn("executors' memory pool not filled at start: {}",
                   filled.ToString());
    }
    device_description = absl::StrCat(device->Name(), " (", info->name, ", ",
                                      info->total_bytes >> 20, " MiB, ",
                                      info->free_bytes >> 20, " MiB free)");
  }
  const int32_t port = absl::GetFlag(FLAGS_port);
  if (port < 0 || port > 65535) {
    return Usage(absl::StrCat("--port must be in [0, 65535], got ", port));
  }
  const double ring_timeout = absl::GetFlag(FLAGS_ring_timeout_seconds);
  if (!(ring_timeout > 0)) {
    return Usage(absl::StrCat("--ring_timeout_seconds must be positive, got ",
                              ring_timeout));
  }
  WorkerServiceOptions options;
  options.max_concurrent_executions = absl::GetFlag(FLAGS_max_concurrent);
  options.memory_bytes = absl::GetFlag(FLAGS_memory_bytes);
  options.default_ring_timeout = absl::Seconds(ring_timeout);
  if (options.max_concurrent_executions < 1) {
    return Usage("--max_concurrent must be at least 1");
  }
  if (options.memory_bytes < 0) {
    return Usage("--memory_bytes must not be negative");
  }
  if (options.memory_bytes == 0) {
    options.memory_bytes =
        device->is_cuda() ? device_memory_bytes : HalfOfPhysicalMemory();
  }
  options.cuda_device = device->cuda_index;
  const int64_t linger_us = absl::GetFlag(FLAGS_compute_linger_us);
  if (linger_us < -1) {
    return Usage(absl::StrCat(
        "--compute_linger_us must be -1 (automatic) or at least 0, got ",
        linger_us));
  }
  options.compute_linger = absl::Microseconds(
      linger_us >= 0 ? linger_us : (device->is_cuda() ? 2000 : 0));
  const double pinned_gib = absl::GetFlag(FLAGS_pinned_staging_gib);
  if (!(pinned_gib >= 0)) {
    return Usage(absl::StrCat("--pinned_staging_gib must not be negative, got ",
                              pinned_gib));
  }
  options.most_pinned_staging_bytes =
      static_cast<int64_t>(pinned_gib * (int64_t{1} << 30));
  const int64_t staging_buffer_mib =
      absl::GetFlag(FLAGS_pinned_staging_buffer_mib);
  if (staging_buffer_mib < 0) {
    return Usage(
        absl::StrCat("--pinned_staging_buffer_mib must not be negative, got ",
                     staging_buffer_mib));
  }
  options.pinned_staging_buffer_bytes = staging_buffer_mib << 20;
  // Resident contexts may use as much again as requests in flight.
  options.context_memory_bytes = options.memory_bytes;
  if (device->is_cuda()) {
    const absl::Time preparing = absl::Now();
    const int dispatchers = PrepareDispatchers(
        device->cuda_index, options.max_concurrent_executions);
    spdlog::info("made {} attention dispatchers (cuDNN handles) in {}",
                 dispatchers, absl::FormatDuration(absl::Now() - preparing));
  }

  const std::string tls_cert = absl::GetFlag(FLAGS_tls_cert);
  const std::string tls_key = absl::GetFlag(FLAGS_tls_key);
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> server_credentials =
      ServerCredentials({tls_cert, tls_key, absl::GetFlag(FLAGS_tls_ca)},
                        "--tls");
  if (!server_credentials.ok()) {
    return Usage(std::string(server_credentials.status().message()));
  }
  const std::string coordinator_ca = absl::GetFlag(FLAGS_coordinator_tls_ca);
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>
      coordinator_credentials =
          coordinator_ca.empty()
              ? grpc::InsecureChannelCredentials()
              : ChannelCredentials({tls_cert, tls_key, coordinator_ca},
                                   "--tls");
  if (!coordinator_credentials.ok()) {
    return Usage(std::string(coordinator_credentials.status().message()));
  }

  // SIGTERM and SIGINT are taken by sigwait() below, never by a handler:
  // block them before any thread starts, so that every thread inherits that.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  const std::string host = absl::GetFlag(FLAGS_host);
  absl::StatusOr<std::shared_ptr<gloo::transport::Device>> gloo_device =
      CreateGlooTcpDevice(host, absl::GetFlag(FLAGS_gloo_interface));
  if (!gloo_device.ok()) {
    spdlog::error("{}", gloo_device.status().ToString());
    return kStartupError;
  }
  std::shared_ptr<v1::Coordination::Stub> coordination =
      v1::Coordination::NewStub(
          grpc::CreateChannel(coordinator, *coordinator_credentials));
  GrpcStore store(coordination, options.default_ring_timeout);
  std::unique_ptr<RingConnector> connector;
  if (device->is_cuda()) {
    connector = std::make_unique<NcclConnector>(store, device->cuda_index);
  } else {
    connector = std::make_unique<GlooConnector>(store, *gloo_device);
  }
  WorkerService service(*connector, options);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int bound_port = 0;
  const std::string listen_host =
      absl::GetFlag(FLAGS_listen).empty() ? host : absl::GetFlag(FLAGS_listen);
  const std::string listen = absl::StrCat(listen_host, ":", port);
  builder.AddListeningPort(listen, *server_credentials, &bound_port);
  builder.RegisterService(&service);
  // The coordinator forwards the rows of a client's chunk (up to its own
  // 16 MiB receive limit) in one message, plus their header.
  builder.SetMaxReceiveMessageSize(kMaxReceiveMessageBytes);
  // The coordinator pings its streams to find stalled workers, also while a
  // long computation sends nothing back: answer every ping, never refuse.
  builder.AddChannelArgument(
      GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 100);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || bound_port == 0) {
    spdlog::error("cannot serve the Worker service on {}", listen);
    return kStartupError;
  }
  const std::string address = absl::StrCat(host, ":", bound_port);
  spdlog::info(
      "serving the Worker service on port {} (advertised as {}); device {}, "
      "{} bytes and {} concurrent requests at most; coordinator {}",
      bound_port, address, device_description, options.memory_bytes,
      options.max_concurrent_executions, coordinator);

  v1::RegisterRequest self;
  self.set_address(address);
  self.set_device(device->Name());
  self.set_memory_bytes(options.memory_bytes);
  self.set_hostname(Hostname());
  Membership membership(coordination, self, MembershipOptions());
  std::thread heartbeats([&membership] { membership.Run(); });

  int signal = 0;
  sigwait(&signals, &signal);
  spdlog::info("received {}; shutting down", strsignal(signal));
  membership.Stop();
  heartbeats.join();
  // Requests still running get a few seconds, then their streams are
  // cancelled.
  server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  spdlog::info("stopped");
  return 0;
}

}  // namespace
}  // namespace ringattn

int main(int argc, char** argv) {
  ringattn::KeepLargeBuffersInTheHeap();
  absl::SetProgramUsageMessage(
      "ringattn-worker --coordinator HOST:PORT [--device cpu|cuda:N] "
      "[--host ADDR] [--port N] [--memory_bytes N] [--tls_cert F --tls_key F "
      "[--tls_ca F]] [--coordinator_tls_ca F]");
  absl::ParseCommandLine(argc, argv);
  // Microseconds: a decode step's phases are a few hundred of them apart.
  spdlog::set_pattern("[%Y-%m-%d %H:%M:%S.%f] [%l] %v");
  return ringattn::Main();
}
