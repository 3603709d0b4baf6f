#include "tests/test_cluster.h"

#include <signal.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/free_port.h"
#include "httplib.h"

namespace ringattn {
namespace {

// Where Bazel put the binary `package/name` this test depends on.
std::string RunfilePath(const std::string& package_and_name) {
  const char* root = std::getenv("TEST_SRCDIR");
  return absl::StrCat(root != nullptr ? root : ".", "/ringattn/",
                      package_and_name);
}

}  // namespace

absl::StatusOr<std::unique_ptr<TestCluster>> TestCluster::Start(
    Options options, absl::Duration timeout) {
  std::unique_ptr<TestCluster> cluster(new TestCluster());
  absl::StatusOr<int> port = FreePort();
  absl::StatusOr<int> http_port = FreePort();
  if (!port.ok()) return port.status();
  if (!http_port.ok()) return http_port.status();
  cluster->target_ = absl::StrCat("127.0.0.1:", *port);
  cluster->http_port_ = *http_port;
  cluster->worker_flags_ = std::move(options.worker_flags);
  cluster->client_options_ = std::move(options.client);
  std::vector<std::string> args = {
      "--host=127.0.0.1", absl::StrCat("--port=", *port),
      absl::StrCat("--http_port=", *http_port),
      absl::StrCat("--world_size=", options.workers)};
  args.insert(args.end(), options.coordinator_flags.begin(),
              options.coordinator_flags.end());
  absl::StatusOr<ChildProcess> coordinator =
      ChildProcess::Spawn(RunfilePath("server/ringattn-coordinator"), args);
  if (!coordinator.ok()) return coordinator.status();
  cluster->coordinator_.emplace(std::move(*coordinator));
  for (int i = 0; i < options.workers; ++i) {
    if (absl::Status s = cluster->StartWorker(); !s.ok()) return s;
  }
  if (absl::Status s = cluster->WaitReady(true, timeout); !s.ok()) return s;
  return cluster;
}

absl::Status TestCluster::StartWorker() {
  std::vector<std::string> args = {absl::StrCat("--coordinator=", target_),
                                   "--device=cpu", "--host=127.0.0.1",
                                   "--port=0"};
  args.insert(args.end(), worker_flags_.begin(), worker_flags_.end());
  absl::StatusOr<ChildProcess> worker =
      ChildProcess::Spawn(RunfilePath("worker/ringattn-worker"), args);
  if (!worker.ok()) return worker.status();
  workers_.push_back(std::move(*worker));
  return absl::OkStatus();
}

void TestCluster::KillWorker(int index) {
  workers_[index].Signal(SIGKILL);
  workers_[index].Wait();
}

void TestCluster::SignalWorker(int index, int signal) {
  workers_[index].Signal(signal);
}

absl::Status TestCluster::WaitReady(bool ready, absl::Duration timeout) {
  ClientOptions options = client_options_;
  options.wait_for_ready = true;
  std::unique_ptr<Client> client = NewClient(options);
  const absl::Time deadline = absl::Now() + timeout;
  absl::Status last = absl::OkStatus();
  while (absl::Now() < deadline) {
    absl::StatusOr<v1::ClusterInfo> info = client->GetClusterInfo();
    if (info.ok() && info->ready() == ready) return absl::OkStatus();
    last = info.ok() ? absl::OkStatus() : info.status();
    // Polls: the cluster changes state on its own (registration, heartbeats).
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("cluster did not become ", ready ? "ready" : "not ready",
                   " in time; last status: ", last.ToString()));
}

double SeriesValue(const std::string& metrics, const std::string& series) {
  const size_t at = metrics.find("\n" + series + " ");
  if (at == std::string::npos) return 0;
  return std::strtod(metrics.c_str() + at + series.size() + 2, nullptr);
}

absl::StatusOr<std::string> TestCluster::Metrics() const {
  httplib::Client http("127.0.0.1", http_port_);
  httplib::Result result = http.Get("/metrics");
  if (!result || result->status != 200) {
    return absl::UnavailableError("cannot fetch /metrics");
  }
  return result->body;
}

std::unique_ptr<Client> TestCluster::NewClient(ClientOptions options) const {
  return *Client::Connect(target_, std::move(options));
}

TestCluster::~TestCluster() {
  for (ChildProcess& worker : workers_) worker.Terminate(absl::Seconds(5));
  if (coordinator_.has_value()) coordinator_->Terminate(absl::Seconds(5));
}

}  // namespace ringattn
