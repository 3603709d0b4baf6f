// load_run: the bounded load run and the fault run (load_runner.h) as a
// command. It starts its own coordinator and workers (CPU, or one per GPU
// with --cuda) on loopback from --bin_dir, prints the report, and exits 1 if
// any result was wrong or any call hung, 2 if the run could not be made.
//
//   bin/load_run                          2 minutes, 16 clients, 3 workers
//   bin/load_run --faults                 the same while workers are killed
//   bin/load_run --cuda --workers=1       one worker on cuda:0

#include <unistd.h>

#include <climits>
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "bench/load/load_runner.h"
#include "client/client.h"

ABSL_FLAG(double, duration_s, 120, "how long clients keep sending requests");
ABSL_FLAG(int, clients, 16, "concurrent client threads");
ABSL_FLAG(int, workers, 3, "workers");
ABSL_FLAG(bool, cuda, false,
          "worker i on CUDA device i (results checked within the GPU "
          "tolerance) instead of the CPU");
ABSL_FLAG(uint32_t, seed, 1, "seeds the requests and the fault schedule");
ABSL_FLAG(bool, faults, false,
          "kill a random worker (SIGKILL) every 2-8 s and start a "
          "replacement 0-2 s later");
ABSL_FLAG(double, max_request_mib, 4, "largest Q + K + V of a request (fp32)");
ABSL_FLAG(int, max_attempts, 1,
          "attempts of an attend or query the coordinator refuses with "
          "UNAVAILABLE (the clients' ClientOptions::max_attempts, 1 to 5)");
ABSL_FLAG(double, deadline_s, 60,
          "deadline of every call; one still running 15 s later is a hang");
ABSL_FLAG(std::string, bin_dir, "",
          "where ringattn-coordinator and ringattn-worker are; empty: the "
          "directory of this program (bin/ after ./dev build)");

namespace ringattn {
namespace {

std::string OwnDirectory() {
  char path[PATH_MAX] = {};
  const ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  const std::string self(path, n > 0 ? n : 0);
  return self.substr(0, self.rfind('/'));
}

int Main() {
  std::string bin_dir = absl::GetFlag(FLAGS_bin_dir);
  if (bin_dir.empty()) bin_dir = OwnDirectory();
  LoadOptions options;
  options.coordinator_binary = bin_dir + "/ringattn-coordinator";
  options.worker_binary = bin_dir + "/ringattn-worker";
  options.workers = absl::GetFlag(FLAGS_workers);
  options.cuda = absl::GetFlag(FLAGS_cuda);
  options.clients = absl::GetFlag(FLAGS_clients);
  options.duration = absl::Seconds(absl::GetFlag(FLAGS_duration_s));
  options.seed = absl::GetFlag(FLAGS_seed);
  options.faults = absl::GetFlag(FLAGS_faults);
  options.max_request_bytes =
      static_cast<int64_t>(absl::GetFlag(FLAGS_max_request_mib) * 1048576);
  options.deadline = absl::Seconds(absl::GetFlag(FLAGS_deadline_s));
  options.max_attempts = absl::GetFlag(FLAGS_max_attempts);
  if (options.faults) {
    // A ring with a dead peer fails within this instead of the default 60 s.
    options.coordinator_flags = {"--ring_timeout_seconds=10"};
  }
  if (options.workers < 1 || options.clients < 1 ||
      options.max_request_bytes < 1 << 16 || options.max_attempts < 1 ||
      options.max_attempts > ClientOptions::kMostAttempts) {
    std::fprintf(stderr,
                 "load_run: --workers and --clients must be >= 1, "
                 "--max_request_mib >= 0.0625, --max_attempts in [1, %d]\n",
                 ClientOptions::kMostAttempts);
    return 2;
  }
  std::printf("load_run: %d clients, %d %s workers, %.0f s, seed %u%s\n",
              options.clients, options.workers, options.cuda ? "CUDA" : "CPU",
              absl::ToDoubleSeconds(options.duration), options.seed,
              options.faults ? ", workers killed at random" : "");
  std::fflush(stdout);
  absl::StatusOr<LoadReport> report = RunLoad(options);
  if (!report.ok()) {
    std::fprintf(stderr, "load_run: %s\n", report.status().ToString().c_str());
    return 2;
  }
  std::printf("%s", report->ToString().c_str());
  const bool pass = report->wrong == 0 && report->hangs == 0;
  std::printf("%s\n", pass ? "PASS: no wrong results, no hangs"
                           : "FAIL: wrong results or hangs");
  std::fflush(stdout);
  // Hung calls, if any, are still blocked on their threads: leave at once.
  std::_Exit(pass ? 0 : 1);
}

}  // namespace
}  // namespace ringattn

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return ringattn::Main();
}
