// Faults and load: a worker killed mid-request, and many concurrent clients.

#include <signal.h>

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/attention_checks.h"
#include "tests/test_cluster.h"

namespace ringattn {
namespace {

AttentionSpec Spec(int64_t n, bool causal) {
  AttentionSpec spec;
  spec.q_len = spec.kv_len = n;
  spec.q_heads = 4;
  spec.kv_heads = 2;
  spec.head_dim = 64;
  spec.causal = causal;
  return spec;
}

TEST(Faults, KilledWorkerFailsTheRequestAndTheClusterHeals) {
  absl::StatusOr<std::unique_ptr<TestCluster>> cluster = TestCluster::Start(
      {.workers = 3, .coordinator_flags = {"--ring_timeout_seconds=10"}});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const AttentionSpec spec = Spec(6000, false);
  const RandomInputs in = MakeRandomInputs(spec, 7);

  // Kill worker 1 once half of the upload is out: the request is in flight.
  std::atomic<bool> killed{false};
  ClientOptions options;
  options.chunk_bytes = 64 << 10;
  options.progress = [&](const Progress& progress) {
    if (progress.phase == Progress::Phase::kUpload &&
        progress.bytes_done * 2 >= progress.bytes_total &&
        !killed.exchange(true)) {
      (*cluster)->KillWorker(1);
    }
  };
  const absl::Time start = absl::Now();
  absl::StatusOr<AttendResult> result = (*cluster)->NewClient(options)->Attend(
      RequestSpec(spec), in.q.view(), in.k.view(), in.v.view());
  const absl::Duration took = absl::Now() - start;
  ASSERT_TRUE(killed);
  ASSERT_EQ(result.status().code(), absl::StatusCode::kUnavailable)
      << result.status();
  EXPECT_NE(result.status().message().find("worker"), std::string::npos);
  EXPECT_LT(took, absl::Seconds(20)) << "failure must not wait out a hang";

  ASSERT_TRUE((*cluster)->WaitReady(false, absl::Seconds(10)).ok());
  absl::StatusOr<AttendResult> refused = (*cluster)->NewClient()->Attend(
      RequestSpec(Spec(10, true)), in.q.view().Slice(0, 10),
      in.k.view().Slice(0, 10), in.v.view().Slice(0, 10));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(refused.status().message().find("not ready"), std::string::npos);

  ASSERT_TRUE((*cluster)->StartWorker().ok());
  ASSERT_TRUE((*cluster)->WaitReady(true, absl::Seconds(20)).ok());
  const AttentionSpec small = Spec(500, true);
  const RandomInputs again = MakeRandomInputs(small, 8);
  absl::StatusOr<AttendResult> healed = (*cluster)->NewClient()->Attend(
      RequestSpec(small), again.q.view(), again.k.view(), again.v.view());
  ASSERT_TRUE(healed.ok()) << healed.status();
  ExpectMatchesReference(small, again, *healed);
}

// Heartbeats would take a minute here: the cluster must learn of the dead
// worker from the first request that fails on it, so that the next requests
// are told the cluster is not ready rather than each failing on the dead
// worker in turn (and cancelling work on the live ones).
TEST(Faults, WorkerKilledBetweenRequestsIsEvictedByTheFirstRequestToFail) {
  absl::StatusOr<std::unique_ptr<TestCluster>> cluster = TestCluster::Start(
      {.workers = 3,
       .coordinator_flags = {"--heartbeat_timeout_seconds=60",
                             "--ring_timeout_seconds=10"}});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const AttentionSpec spec = Spec(700, true);
  const RandomInputs in = MakeRandomInputs(spec, 13);
  absl::StatusOr<AttendResult> before = (*cluster)->NewClient()->Attend(
      RequestSpec(spec), in.q.view(), in.k.view(), in.v.view());
  ASSERT_TRUE(before.ok()) << before.status();

  (*cluster)->KillWorker(2);
  const absl::Time start = absl::Now();
  absl::StatusOr<AttendResult> failed = (*cluster)->NewClient()->Attend(
      RequestSpec(spec), in.q.view(), in.k.view(), in.v.view());
  ASSERT_EQ(failed.status().code(), absl::StatusCode::kUnavailable)
      << failed.status();
  absl::StatusOr<AttendResult> refused = (*cluster)->NewClient()->Attend(
      RequestSpec(spec), in.q.view(), in.k.view(), in.v.view());
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kUnavailable)
      << refused.status();
  EXPECT_NE(refused.status().message().find("not ready"), std::string::npos)
      << refused.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(30))
      << "the eviction must not wait for the heartbeats";
  absl::StatusOr<std::string> metrics = (*cluster)->Metrics();
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_EQ(SeriesValue(*metrics, "ringattn_workers_evicted_total"), 1);

  ASSERT_TRUE((*cluster)->StartWorker().ok());
  ASSERT_TRUE((*cluster)->WaitReady(true, absl::Seconds(20)).ok());
  absl::StatusOr<AttendResult> healed = (*cluster)->NewClient()->Attend(
      RequestSpec(spec), in.q.view(), in.k.view(), in.v.view());
  ASSERT_TRUE(healed.ok()) << healed.status();
  ExpectMatchesReference(spec, in, *healed);
}

// The coordinator's refusal while its cluster is not ready reaches the client
// before any output, marked unchanged, so a client with max_attempts sends
// the call again, a query with new rows too; the coordinator counts every
// attempt.
TEST(Faults, ClientTriesAgainWhileTheClusterIsNotReady) {
  absl::StatusOr<std::unique_ptr<TestCluster>> cluster =
      TestCluster::Start({.workers = 2});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const AttentionSpec spec = Spec(300, true);
  const RandomInputs in = MakeRandomInputs(spec, 14);
  ClientOptions options;
  options.max_attempts = 3;
  std::unique_ptr<Client> client = (*cluster)->NewClient(options);
  ASSERT_TRUE(client->CreateContext("doc", in.k.view(), in.v.view()).ok());
  (*cluster)->KillWorker(1);
  ASSERT_TRUE((*cluster)->WaitReady(false, absl::Seconds(10)).ok());

  absl::StatusOr<AttendResult> refused =
      client->Attend(RequestSpec(spec), in.q.view(), in.k.view(), in.v.view());
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kUnavailable)
      << refused.status();
  EXPECT_NE(refused.status().message().find("not ready"), std::string::npos)
      << refused.status();
  v1::AttentionSpec step = RequestSpec(spec);
  step.set_q_len(1);
  step.set_kv_len(0);
  absl::StatusOr<AttendResult> step_refused =
      client->Query("doc", step, in.q.view().Slice(0, 1),
                    in.k.view().Slice(0, 1), in.v.view().Slice(0, 1));
  ASSERT_EQ(step_refused.status().code(), absl::StatusCode::kUnavailable)
      << step_refused.status();
  absl::StatusOr<std::string> metrics = (*cluster)->Metrics();
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  for (const char* method : {"Attend", "Query"}) {
    EXPECT_EQ(
        SeriesValue(*metrics, absl::StrCat("ringattn_requests_total{method=\"",
                                           method, "\",code=\"UNAVAILABLE\"}")),
        3)
        << method << "\n"
        << *metrics;
  }

  ASSERT_TRUE((*cluster)->StartWorker().ok());
  ASSERT_TRUE((*cluster)->WaitReady(true, absl::Seconds(20)).ok());
  absl::StatusOr<AttendResult> served = (*cluster)->NewClient(options)->Attend(
      RequestSpec(spec), in.q.view(), in.k.view(), in.v.view());
  ASSERT_TRUE(served.ok()) << served.status();
  ExpectMatchesReference(spec, in, *served);
}

TEST(Faults, StalledWorkerFailsTheRequestWithUnavailableAndRejoins) {
  absl::StatusOr<std::unique_ptr<TestCluster>> cluster = TestCluster::Start(
      {.workers = 3, .coordinator_flags = {"--ring_timeout_seconds=3"}});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const AttentionSpec spec = Spec(6000, false);
  const RandomInputs in = MakeRandomInputs(spec, 11);

  // Stop (not kill) worker 1 once half of the upload is out: its connections
  // stay open but nothing answers, as when its network link is cut.
  std::atomic<bool> stopped{false};
  ClientOptions options;
  options.chunk_bytes = 64 << 10;
  options.deadline = absl::Seconds(60);
  options.progress = [&](const Progress& progress) {
    if (progress.phase == Progress::Phase::kUpload &&
        progress.bytes_done * 2 >= progress.bytes_total &&
        !stopped.exchange(true)) {
      (*cluster)->SignalWorker(1, SIGSTOP);
    }
  };
  const absl::Time start = absl::Now();
  absl::StatusOr<AttendResult> result = (*cluster)->NewClient(options)->Attend(
      RequestSpec(spec), in.q.view(), in.k.view(), in.v.view());
  const absl::Duration took = absl::Now() - start;
  ASSERT_TRUE(stopped);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable)
      << result.status();
  // Keepalive finds the stall in about two heartbeat timeouts (4-6 s on an
  // idle machine); half the call's deadline leaves room for a loaded one.
  EXPECT_LT(took, options.deadline / 2) << "failure must not wait out a hang";

  (*cluster)->SignalWorker(1, SIGCONT);
  ASSERT_TRUE((*cluster)->WaitReady(true, absl::Seconds(20)).ok());
  const AttentionSpec small = Spec(500, true);
  const RandomInputs again = MakeRandomInputs(small, 12);
  absl::StatusOr<AttendResult> healed = (*cluster)->NewClient()->Attend(
      RequestSpec(small), again.q.view(), again.k.view(), again.v.view());
  ASSERT_TRUE(healed.ok()) << healed.status();
  ExpectMatchesReference(small, again, *healed);
}

TEST(Faults, DeadlineReachesTheWorkersAndTheClusterServesOn) {
  absl::StatusOr<std::unique_ptr<TestCluster>> cluster =
      TestCluster::Start({.workers = 2});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const AttentionSpec spec = Spec(8000, false);
  const RandomInputs in = MakeRandomInputs(spec, 9);
  ClientOptions options;
  options.deadline = absl::Milliseconds(300);
  absl::StatusOr<AttendResult> late = (*cluster)->NewClient(options)->Attend(
      RequestSpec(spec), in.q.view(), in.k.view(), in.v.view());
  EXPECT_EQ(late.status().code(), absl::StatusCode::kDeadlineExceeded)
      << late.status();
  // The cluster serves the next request.
  const AttentionSpec small = Spec(300, true);
  const RandomInputs next = MakeRandomInputs(small, 10);
  absl::StatusOr<AttendResult> result = (*cluster)->NewClient()->Attend(
      RequestSpec(small), next.q.view(), next.k.view(), next.v.view());
  ASSERT_TRUE(result.ok()) << result.status();
  ExpectMatchesReference(small, next, *result);
}

TEST(Load, SixteenConcurrentClientsWithMixedSizesAllGetExactResults) {
  // A small in-flight budget so that admission control must queue requests.
  absl::StatusOr<std::unique_ptr<TestCluster>> cluster = TestCluster::Start(
      {.workers = 3, .coordinator_flags = {"--max_inflight_bytes=2000000"}});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  constexpr int kClients = 16;
  std::vector<AttentionSpec> specs;
  std::vector<RandomInputs> inputs;
  for (int i = 0; i < kClients; ++i) {
    specs.push_back(Spec(37 + 41 * i, i % 2 == 0));
    inputs.push_back(MakeRandomInputs(specs.back(), 100 + i));
  }
  std::vector<absl::StatusOr<AttendResult>> results(
      kClients, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      results[i] = (*cluster)->NewClient()->Attend(
          RequestSpec(specs[i]), inputs[i].q.view(), inputs[i].k.view(),
          inputs[i].v.view());
    });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kClients; ++i) {
    SCOPED_TRACE("client " + std::to_string(i));
    ASSERT_TRUE(results[i].ok()) << results[i].status();
    ExpectMatchesReference(specs[i], inputs[i], *results[i]);
  }
}

}  // namespace
}  // namespace ringattn
