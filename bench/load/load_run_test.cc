// A short fault run: 20 s of mixed concurrent requests while workers are
// killed and replaced, with clients that send each call once and with clients
// that send a refused call again (ClientOptions::max_attempts); every result
// that comes back must be exact, and every call must end (with a status)
// within its deadline bound.

#include <cstdlib>
#include <string>

#include "bench/load/load_runner.h"
#include "gtest/gtest.h"

namespace ringattn {
namespace {

std::string Runfile(const std::string& path) {
  const char* root = std::getenv("TEST_SRCDIR");
  return std::string(root != nullptr ? root : ".") + "/ringattn/" + path;
}

class LoadRun : public ::testing::TestWithParam<int> {};

TEST_P(LoadRun, FaultRunHasNoWrongResultsAndNoHangs) {
  LoadOptions options;
  options.max_attempts = GetParam();
  options.coordinator_binary = Runfile("server/ringattn-coordinator");
  options.worker_binary = Runfile("worker/ringattn-worker");
  options.workers = 3;
  options.clients = 8;
  options.duration = absl::Seconds(20);
  options.max_request_bytes = 1 << 20;
  options.deadline = absl::Seconds(30);
  options.faults = true;
  options.kill_min = absl::Seconds(3);
  options.kill_max = absl::Seconds(6);
  options.coordinator_flags = {"--ring_timeout_seconds=10"};
  absl::StatusOr<LoadReport> report = RunLoad(options);
  ASSERT_TRUE(report.ok()) << report.status();
  const absl::Status outcome = CheckFaultRun(*report, /*min_kills=*/2);
  EXPECT_TRUE(outcome.ok()) << outcome << "\n" << report->ToString();
  std::printf("%s", report->ToString().c_str());
}

INSTANTIATE_TEST_SUITE_P(Attempts, LoadRun, ::testing::Values(1, 5),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return info.param == 1 ? "ClientsSendOnce"
                                                  : "ClientsSendAgain";
                         });

}  // namespace
}  // namespace ringattn
