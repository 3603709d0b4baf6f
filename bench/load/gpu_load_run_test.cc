// The load run and the fault run on CUDA workers (one per GPU, at most two):
// mixed concurrent requests of every pattern, odd lengths and head dims, wire
// dtypes and resident contexts, each result checked against the float64
// reference within the GPU tolerance (request_mix.h). Skips, saying why,
// without a GPU.

#include <cstdio>
#include <cstdlib>
#include <string>

#include "bench/load/load_runner.h"
#include "gtest/gtest.h"
#include "worker/device.h"

namespace ringattn {
namespace {

std::string Runfile(const std::string& path) {
  const char* root = std::getenv("TEST_SRCDIR");
  return std::string(root != nullptr ? root : ".") + "/ringattn/" + path;
}

LoadOptions GpuLoad() {
  LoadOptions options;
  options.coordinator_binary = Runfile("server/ringattn-coordinator");
  options.worker_binary = Runfile("worker/ringattn-worker");
  options.cuda = true;
  options.workers = CudaDeviceCount() >= 2 ? 2 : 1;
  options.clients = 8;
  options.duration = absl::Seconds(30);
  options.max_request_bytes = 4 << 20;
  options.deadline = absl::Seconds(30);
  return options;
}

TEST(GpuLoadRun, EveryCallSucceedsWithinTheGpuTolerance) {
  if (CudaDeviceCount() == 0) {
    GTEST_SKIP() << "no CUDA device here; runs on a GPU machine";
  }
  absl::StatusOr<LoadReport> report = RunLoad(GpuLoad());
  ASSERT_TRUE(report.ok()) << report.status();
  const std::string text = report->ToString();
  EXPECT_TRUE(report->failed.empty()) << text;
  EXPECT_EQ(report->wrong, 0) << text;
  EXPECT_EQ(report->hangs, 0) << text;
  EXPECT_GT(report->checked, 0) << text;
  std::printf("%s", text.c_str());
}

TEST(GpuLoadRun, KilledGpuWorkersCauseNoWrongResultsAndNoHangs) {
  if (CudaDeviceCount() == 0) {
    GTEST_SKIP() << "no CUDA device here; runs on a GPU machine";
  }
  LoadOptions options = GpuLoad();
  options.faults = true;
  options.kill_min = absl::Seconds(4);
  options.kill_max = absl::Seconds(8);
  options.coordinator_flags = {"--ring_timeout_seconds=10"};
  absl::StatusOr<LoadReport> report = RunLoad(options);
  ASSERT_TRUE(report.ok()) << report.status();
  const absl::Status outcome = CheckFaultRun(*report, /*min_kills=*/2);
  EXPECT_TRUE(outcome.ok()) << outcome << "\n" << report->ToString();
  std::printf("%s", report->ToString().c_str());
}

}  // namespace
}  // namespace ringattn
