#ifndef RINGATTN_CLIENT_LOCAL_CLUSTER_H_
#define RINGATTN_CLIENT_LOCAL_CLUSTER_H_

// `ringattn local`: a coordinator and its CPU workers run on this machine as
// child processes of the CLI, for trying the service out and for tests.

#include <cstdio>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace ringattn {

struct LocalClusterOptions {
  int workers = 1;
  int port = 0;       // the coordinator's gRPC port; 0: a free one
  int http_port = 0;  // its HTTP (metrics, health) port; 0: a free one
  // Where ringattn-coordinator and ringattn-worker are; empty: the directory
  // of this executable. Each may also be in bin_dir/../server and
  // bin_dir/../worker, where Bazel builds them.
  std::string bin_dir;
  // How long the cluster may take to become ready.
  absl::Duration ready_timeout = absl::Seconds(60);
  // How long the children get between SIGTERM and SIGKILL.
  absl::Duration grace = absl::Seconds(5);
};

// Blocks SIGINT, SIGTERM and SIGCHLD in the calling thread and in the threads
// it starts afterwards, so that RunLocalCluster can wait for them. Call it at
// the start of main, before any thread exists.
void BlockClusterSignals();

// Starts `ringattn-coordinator --port P --http_port H --world_size W` and W
// `ringattn-worker --coordinator 127.0.0.1:P --device cpu` (their stdout goes
// to stderr), waits until the coordinator's GetClusterInfo says ready, writes
// "ready 127.0.0.1:P\n" to `out` and flushes it, and then runs until SIGINT or
// SIGTERM, when it stops the children (SIGTERM, then SIGKILL after the grace
// period) and returns OK. Stops the remaining children and fails if a binary
// is missing (NOT_FOUND), a child ends (ABORTED, naming it and its exit
// status) or the cluster is not ready in time (DEADLINE_EXCEEDED).
// BlockClusterSignals() must have run first. Call from the main thread.
absl::Status RunLocalCluster(const LocalClusterOptions& options,
                             std::FILE* out);

}  // namespace ringattn

#endif  // RINGATTN_CLIENT_LOCAL_CLUSTER_H_
