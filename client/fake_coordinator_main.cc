// fake_coordinator: a stand-in for ringattn-coordinator in tests of the CLI.
// It takes the coordinator's flags (--port --http_port --world_size), serves
// FakeAttention on 127.0.0.1:PORT, reports the cluster ready unless
// FAKE_COORDINATOR_READY=0, writes its pid to $FAKE_PID_DIR/coordinator when
// that is set, and runs until SIGINT or SIGTERM.

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/fake_attention.h"
#include "client/flags.h"
#include "grpcpp/grpcpp.h"

int main(int argc, char** argv) {
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  absl::StatusOr<ringattn::Flags> flags =
      ringattn::Flags::Parse(std::vector<std::string>(argv + 1, argv + argc),
                             {"port", "http_port", "world_size"}, {});
  absl::StatusOr<int64_t> port =
      flags.ok() ? flags->GetInt("port", 0) : flags.status();
  absl::StatusOr<int64_t> world_size =
      flags.ok() ? flags->GetInt("world_size", 1) : flags.status();
  if (!port.ok() || !world_size.ok()) {
    std::fprintf(
        stderr, "fake_coordinator: %s\n",
        (port.ok() ? world_size.status() : port.status()).ToString().c_str());
    return 2;
  }
  const char* ready = std::getenv("FAKE_COORDINATOR_READY");
  ringattn::FakeAttention service;
  service.set_cluster(static_cast<int>(*world_size),
                      ready == nullptr || std::string(ready) != "0");
  grpc::ServerBuilder builder;
  builder.AddListeningPort(absl::StrCat("127.0.0.1:", *port),
                           grpc::InsecureServerCredentials());
  builder.RegisterService(&service);
  // The real coordinator's limit: the client's 4 MiB chunks plus headers
  // exceed gRPC's default of 4 MiB.
  builder.SetMaxReceiveMessageSize(16 << 20);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) {
    std::fprintf(stderr, "fake_coordinator: cannot serve on port %lld\n",
                 static_cast<long long>(*port));
    return 1;
  }
  if (const char* pid_dir = std::getenv("FAKE_PID_DIR")) {
    std::ofstream(std::string(pid_dir) + "/coordinator") << getpid() << "\n";
  }
  int signal;
  sigwait(&stop_signals, &signal);
  server->Shutdown();
  return 0;
}
