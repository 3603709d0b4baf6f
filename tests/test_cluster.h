#ifndef RINGATTN_TESTS_TEST_CLUSTER_H_
#define RINGATTN_TESTS_TEST_CLUSTER_H_

// TestCluster: a real coordinator and p CPU workers started as separate
// processes on loopback for end-to-end tests, stopped (and reaped) when the
// object goes away. A test can kill one worker and start a replacement. Not
// thread-safe.

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/child_process.h"
#include "client/client.h"

namespace ringattn {

// The value of the series `series` (name and labels) on a /metrics page; 0
// if it is not there.
double SeriesValue(const std::string& metrics, const std::string& series);

class TestCluster {
 public:
  struct Options {
    int workers = 2;
    std::vector<std::string> coordinator_flags;  // extra flags
    std::vector<std::string> worker_flags;       // extra flags of each worker
    // How Start and WaitReady reach the coordinator (credentials, token).
    ClientOptions client;
  };

  // Starts the processes and waits (up to `timeout`) until the cluster is
  // ready.
  static absl::StatusOr<std::unique_ptr<TestCluster>> Start(
      Options options, absl::Duration timeout = absl::Seconds(30));
  ~TestCluster();

  TestCluster(const TestCluster&) = delete;
  TestCluster& operator=(const TestCluster&) = delete;

  const std::string& target() const { return target_; }
  int http_port() const { return http_port_; }
  std::unique_ptr<Client> NewClient(ClientOptions options = {}) const;

  // SIGKILLs worker process `index` (in start order) and reaps it.
  void KillWorker(int index);
  // Sends `signal` to worker process `index` (e.g. SIGSTOP, SIGCONT).
  void SignalWorker(int index, int signal);
  // Starts one more worker process (it takes any free rank).
  absl::Status StartWorker();
  // Waits until the coordinator reports the cluster ready (or not ready).
  absl::Status WaitReady(bool ready, absl::Duration timeout);
  // The coordinator's /metrics page.
  absl::StatusOr<std::string> Metrics() const;

 private:
  TestCluster() = default;

  std::string target_;
  int http_port_ = 0;
  std::vector<std::string> worker_flags_;
  ClientOptions client_options_;
  std::vector<ChildProcess> workers_;
  std::optional<ChildProcess> coordinator_;  // stopped last
};

}  // namespace ringattn

#endif  // RINGATTN_TESTS_TEST_CLUSTER_H_
