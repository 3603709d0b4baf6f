// The coordinator's ring warm-up (server/ring_warm_up.h) on CPU workers: a
// newly formed cluster makes its kept ring communicator before the first
// request, so that request reuses it; a cluster that re-forms is warmed up
// again; with --warm_up_ring=false the first request makes it. Requests
// computed at once ring over kept communicators of their own slots, each made
// by the warm-up.

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/attention_checks.h"
#include "tests/test_cluster.h"

namespace ringattn {
namespace {

constexpr char kWarmUpsOk[] = "ringattn_ring_warm_ups_total{result=\"ok\"}";
constexpr char kWarmUpsFailed[] =
    "ringattn_ring_warm_ups_total{result=\"failed\"}";

std::string Communicators(const char* kind) {
  return absl::StrCat("ringattn_ring_communicators_total{communicator=\"", kind,
                      "\"}");
}

// Waits until the coordinator has counted `count` successful warm-ups.
void AwaitWarmUps(const TestCluster& cluster, double count) {
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  std::string metrics;
  while (absl::Now() < deadline) {
    metrics = cluster.Metrics().value_or("");
    if (SeriesValue(metrics, kWarmUpsOk) >= count) return;
    // Polls: the warm-up runs on the coordinator's own schedule.
    absl::SleepFor(absl::Milliseconds(50));
  }
  FAIL() << "no " << count << " warm-ups in 30 s:\n" << metrics;
}

// Runs a pass-KV request (a ring over the kept communicator) and checks it.
void RingMatchesReference(const TestCluster& cluster, int64_t n,
                          uint32_t seed) {
  const AttentionSpec spec = SelfAttentionSpec(n, 4, 2, 80, /*causal=*/true);
  const RandomInputs in = MakeRandomInputs(spec, seed);
  v1::AttentionSpec request = RequestSpec(spec);
  request.set_strategy(v1::PASS_KV);
  absl::StatusOr<AttendResult> result = cluster.NewClient()->Attend(
      request, in.q.view(), in.k.view(), in.v.view());
  ASSERT_TRUE(result.ok()) << result.status();
  ExpectMatchesReference(spec, in, *result);
}

TEST(RingWarmUp, FirstRequestReusesTheCommunicatorTheWarmUpMade) {
  absl::StatusOr<std::unique_ptr<TestCluster>> cluster =
      TestCluster::Start({.workers = 3});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  AwaitWarmUps(**cluster, 1);
  RingMatchesReference(**cluster, 101, 1);
  const std::string metrics = (*cluster)->Metrics().value_or("");
  EXPECT_EQ(SeriesValue(metrics, kWarmUpsFailed), 0) << metrics;
  EXPECT_EQ(SeriesValue(metrics, Communicators("reused")), 1) << metrics;
  EXPECT_EQ(SeriesValue(metrics, Communicators("new")), 0) << metrics;
  // The warm-up's own requests are not the users'.
  EXPECT_EQ(SeriesValue(metrics,
                        "ringattn_strategy_requests_total{strategy="
                        "\"PASS_KV\"}"),
            1)
      << metrics;
}

// A warm-up that starts before the coordinator has noticed the dead worker
// fails, harmlessly; the re-formed cluster's warm-up succeeds.
TEST(RingWarmUp, ReformedClusterIsWarmedUpAgain) {
  absl::StatusOr<std::unique_ptr<TestCluster>> cluster =
      TestCluster::Start({.workers = 2});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  AwaitWarmUps(**cluster, 1);
  (*cluster)->KillWorker(1);
  ASSERT_TRUE((*cluster)->WaitReady(false, absl::Seconds(10)).ok());
  ASSERT_TRUE((*cluster)->StartWorker().ok());
  ASSERT_TRUE((*cluster)->WaitReady(true, absl::Seconds(20)).ok());
  AwaitWarmUps(**cluster, 2);
  RingMatchesReference(**cluster, 2, 2);  // one row per worker
  const std::string metrics = (*cluster)->Metrics().value_or("");
  EXPECT_EQ(SeriesValue(metrics, Communicators("reused")), 1) << metrics;
  EXPECT_EQ(SeriesValue(metrics, Communicators("new")), 0) << metrics;
}

// Two clients sending rings at once, as many as the coordinator computes at
// once (--max_concurrent_requests, 2 by default): each admitted request holds
// a slot whose communicator the warm-up made, so none makes one.
TEST(RingWarmUp, ConcurrentRequestsRingOverKeptCommunicators) {
  absl::StatusOr<std::unique_ptr<TestCluster>> cluster =
      TestCluster::Start({.workers = 3});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  AwaitWarmUps(**cluster, 1);
  std::vector<std::thread> clients;
  for (uint32_t c = 0; c < 2; ++c) {
    clients.emplace_back([&cluster, c] {
      for (uint32_t i = 0; i < 6; ++i) {
        RingMatchesReference(**cluster, 301 + 2 * i, 10 * c + i);
      }
    });
  }
  for (std::thread& client : clients) client.join();
  const std::string metrics = (*cluster)->Metrics().value_or("");
  EXPECT_EQ(SeriesValue(metrics, Communicators("own")), 0) << metrics;
  EXPECT_EQ(SeriesValue(metrics, Communicators("new")), 0) << metrics;
  EXPECT_EQ(SeriesValue(metrics, Communicators("reused")), 12) << metrics;
}

// A ring admitted while another holds the first slot rings over the second
// slot's communicator, which the warm-up made too.
TEST(RingWarmUp, EverySlotsCommunicatorIsMadeBeforeTheFirstRequest) {
  absl::StatusOr<std::unique_ptr<TestCluster>> cluster = TestCluster::Start(
      {.workers = 3, .coordinator_flags = {"--max_concurrent_requests=2"}});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  AwaitWarmUps(**cluster, 1);
  const AttentionSpec long_spec =
      SelfAttentionSpec(1201, 4, 2, 64, /*causal=*/true);
  const RandomInputs long_in = MakeRandomInputs(long_spec, 21);
  v1::AttentionSpec long_request = RequestSpec(long_spec);
  long_request.set_strategy(v1::PASS_KV);
  // The second ring starts once half of the first one's upload is out: the
  // first holds its slot from before its upload until its end.
  std::thread second;
  ClientOptions options;
  options.chunk_bytes = 64 << 10;
  options.progress = [&](const Progress& progress) {
    if (progress.phase == Progress::Phase::kUpload &&
        progress.bytes_done * 2 >= progress.bytes_total && !second.joinable()) {
      second =
          std::thread([&cluster] { RingMatchesReference(**cluster, 211, 22); });
    }
  };
  absl::StatusOr<AttendResult> first = (*cluster)->NewClient(options)->Attend(
      long_request, long_in.q.view(), long_in.k.view(), long_in.v.view());
  ASSERT_TRUE(second.joinable());
  second.join();
  ASSERT_TRUE(first.ok()) << first.status();
  ExpectMatchesReference(long_spec, long_in, *first);
  const std::string metrics = (*cluster)->Metrics().value_or("");
  EXPECT_EQ(SeriesValue(metrics, Communicators("reused")), 2) << metrics;
  EXPECT_EQ(SeriesValue(metrics, Communicators("new")), 0) << metrics;
  EXPECT_EQ(SeriesValue(metrics, Communicators("own")), 0) << metrics;
}

TEST(RingWarmUp, WithoutWarmUpTheFirstRequestMakesTheCommunicator) {
  absl::StatusOr<std::unique_ptr<TestCluster>> cluster = TestCluster::Start(
      {.workers = 2, .coordinator_flags = {"--warm_up_ring=false"}});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  RingMatchesReference(**cluster, 37, 3);
  RingMatchesReference(**cluster, 37, 4);
  const std::string metrics = (*cluster)->Metrics().value_or("");
  EXPECT_EQ(SeriesValue(metrics, Communicators("new")), 1) << metrics;
  EXPECT_EQ(SeriesValue(metrics, Communicators("reused")), 1) << metrics;
  EXPECT_EQ(SeriesValue(metrics, kWarmUpsOk), 0) << metrics;
}

}  // namespace
}  // namespace ringattn
