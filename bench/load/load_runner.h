#ifndef RINGATTN_BENCH_LOAD_LOAD_RUNNER_H_
#define RINGATTN_BENCH_LOAD_LOAD_RUNNER_H_

// The bounded load run (and, with faults, the fault run): a coordinator and
// workers (CPU, or one per GPU) started as processes on loopback, many client
// threads sending
// mixed requests (request_mix.h) and resident-context queries for a set time,
// every result checked against the float64 reference; with faults, workers
// are killed with SIGKILL at random and replacements started. A request that
// does not return within its deadline plus a slack is a hang.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ringattn {

struct LoadOptions {
  std::string coordinator_binary;  // path of ringattn-coordinator
  std::string worker_binary;       // path of ringattn-worker
  int workers = 3;
  // Worker slot i runs on CUDA device i instead of the CPU; results are then
  // checked within kGpuTolerance (request_mix.h) instead of kCpuTolerance.
  bool cuda = false;
  int clients = 16;
  absl::Duration duration = absl::Minutes(2);
  uint32_t seed = 1;
  // Largest Q + K + V of one request, in fp32 bytes.
  int64_t max_request_bytes = int64_t{4} << 20;
  // Share of client threads that work on a resident context of their own
  // (create, append, query, decode, delete) instead of sending attends.
  double context_share = 0.25;
  // Deadline of every call (of every attempt of it); a call still running
  // `hang_slack` after its attempts' deadlines and the waits between them is
  // a hang.
  absl::Duration deadline = absl::Seconds(60);
  absl::Duration hang_slack = absl::Seconds(15);
  // The clients' ClientOptions::max_attempts.
  int max_attempts = 1;
  // Fault mode: a random live worker is killed every [kill_min, kill_max]
  // (uniform) and a replacement started [0, restart_max] after the kill.
  bool faults = false;
  absl::Duration kill_min = absl::Seconds(2);
  absl::Duration kill_max = absl::Seconds(8);
  absl::Duration restart_max = absl::Seconds(2);
  // Extra coordinator flags.
  std::vector<std::string> coordinator_flags;
};

// Resident and peak memory of one process, from /proc/PID/status, in bytes.
struct ProcessMemory {
  std::string name;  // "coordinator", "worker 0", ...
  int64_t rss_start = 0;
  int64_t rss_half = 0;  // half-way through the run (0: the worker was down)
  int64_t rss_end = 0;
  int64_t peak_end = 0;  // VmHWM at the end
  int restarts = 0;      // times this worker slot was killed and replaced
};

struct LoadReport {
  int64_t sent = 0;  // calls started (every RPC, uploads included)
  int64_t succeeded = 0;
  std::map<std::string, int64_t> failed;        // by status code name
  std::map<std::string, std::string> examples;  // a message per code
  int64_t checked = 0;  // results compared with the reference
  int64_t wrong = 0;
  std::vector<std::string> wrong_examples;  // the first few
  int64_t hangs = 0;
  int64_t kills = 0;
  int64_t request_bytes = 0;  // Q, K, V of succeeded attends and queries
  absl::Duration elapsed;
  absl::Duration p50, p99, max_latency;  // of succeeded calls
  std::vector<ProcessMemory> memory;

  // A human-readable table of all of the above.
  std::string ToString() const;
};

// OK if a fault run went as it should: no wrong result, no hang, at least
// `min_kills` workers killed, some results checked, and every failure one a
// dying worker may cause (UNAVAILABLE; NOT_FOUND, a context lost with its
// worker and deleted; FAILED_PRECONDITION, a query of a context that lost a
// worker's part, once the cluster re-formed; ABORTED; RESOURCE_EXHAUSTED, a
// live worker's execution slots still held by streams of failed requests).
// Otherwise INTERNAL, saying what was wrong.
absl::Status CheckFaultRun(const LoadReport& report, int64_t min_kills);

// Runs the load (see the file comment) and returns what happened; an error
// only if the cluster could not be started or a replacement worker could not
// be spawned. Hung calls are left behind on detached threads.
absl::StatusOr<LoadReport> RunLoad(const LoadOptions& options);

}  // namespace ringattn

#endif  // RINGATTN_BENCH_LOAD_LOAD_RUNNER_H_
