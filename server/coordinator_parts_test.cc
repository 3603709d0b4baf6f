// Unit tests of the coordinator's parts that need no network.

#include <algorithm>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "server/admission_control.h"
#include "server/cluster.h"
#include "server/context_registry.h"
#include "server/metrics.h"
#include "server/rendezvous_store.h"
#include "server/request_layout.h"
#include "server/row_coverage.h"

namespace ringattn {
namespace {

TEST(RowCoverage, ReportsDuplicateAndMissingRuns) {
  RowCoverage coverage(10);
  EXPECT_FALSE(coverage.Mark(2, 5).has_value());
  const std::optional<Range> twice = coverage.Mark(4, 8);
  ASSERT_TRUE(twice.has_value());
  EXPECT_EQ(*twice, (Range{4, 5}));
  EXPECT_EQ(*coverage.FirstMissing(), (Range{0, 2}));
  EXPECT_FALSE(coverage.Mark(0, 2).has_value());
  EXPECT_EQ(*coverage.FirstMissing(), (Range{5, 10}));
  EXPECT_FALSE(coverage.Mark(5, 10).has_value());
  EXPECT_FALSE(coverage.FirstMissing().has_value());
}

// Random marks against a row-by-row model: the same duplicates reported, the
// same rows missing after every step.
TEST(RowCoverage, AgreesWithARowByRowModel) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t rows = 1 + static_cast<int64_t>(rng() % 60);
    RowCoverage coverage(rows);
    std::vector<bool> seen(static_cast<size_t>(rows), false);
    for (int step = 0; step < 12; ++step) {
      const int64_t begin = static_cast<int64_t>(rng() % rows);
      const int64_t end =
          begin + 1 + static_cast<int64_t>(rng() % (rows - begin));
      std::optional<Range> want;
      for (int64_t r = begin; r < end && !want; ++r) {
        if (!seen[r]) continue;
        int64_t last = r;
        while (last + 1 < end && seen[last + 1]) ++last;
        want = Range{r, last + 1};
      }
      if (!want) {
        for (int64_t r = begin; r < end; ++r) seen[r] = true;
      }
      EXPECT_EQ(coverage.Mark(begin, end), want)
          << "trial " << trial << " [" << begin << ", " << end << ")";
      std::optional<Range> missing;
      for (int64_t r = 0; r < rows && !missing; ++r) {
        if (seen[r]) continue;
        int64_t last = r;
        while (last + 1 < rows && !seen[last + 1]) ++last;
        missing = Range{r, last + 1};
      }
      EXPECT_EQ(coverage.FirstMissing(), missing) << "trial " << trial;
    }
  }
}

AttentionSpec Spec(int64_t n, bool causal) {
  AttentionSpec spec;
  spec.q_len = spec.kv_len = n;
  spec.q_heads = spec.kv_heads = 1;
  spec.head_dim = 4;
  spec.causal = causal;
  return spec;
}

TEST(RequestLayout, RoutesRunsToTheWorkersThatOwnThem) {
  const RequestLayout layout(Spec(10, /*causal=*/false), 3);  // 4, 3, 3 tokens
  const std::vector<RequestLayout::Piece> pieces = layout.Route(true, 2, 6);
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(pieces[0].worker, 0);
  EXPECT_EQ(pieces[0].positions, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(pieces[1].worker, 1);
  EXPECT_EQ(pieces[1].first_token, 2);
  EXPECT_EQ(pieces[1].positions, (std::vector<int64_t>{4, 5, 6}));
  EXPECT_TRUE(pieces[1].contiguous);
  EXPECT_EQ(pieces[2].worker, 2);
  EXPECT_EQ(layout.TokenAt(7), 7);
}

TEST(RequestLayout, HilbertOrderRoutesByCurvePosition) {
  AttentionSpec spec = Spec(6, false);
  spec.hilbert = HilbertGrid{2, 3};
  const RequestLayout layout(spec, 2);
  std::vector<int> seen(6, 0);
  for (const RequestLayout::Piece& piece : layout.Route(false, 0, 6)) {
    for (size_t i = 0; i < piece.positions.size(); ++i) {
      const int64_t token = piece.first_token + static_cast<int64_t>(i);
      EXPECT_EQ(layout.TokenAt(piece.positions[i]), token);
      EXPECT_EQ(piece.worker, piece.positions[i] < 3 ? 0 : 1);
      ++seen[piece.positions[i]];
    }
  }
  EXPECT_EQ(seen, std::vector<int>(6, 1));
}

TEST(Cluster, ReadyOnlyWhenEveryRankIsHeld) {
  Cluster cluster(3, std::chrono::hours(1));
  v1::RegisterRequest request;
  for (const char* address : {"a:1", "b:1"}) {
    request.set_address(address);
    ASSERT_TRUE(cluster.Register(request).ok());
  }
  absl::StatusOr<std::vector<Cluster::Member>> members = cluster.ReadyMembers();
  ASSERT_EQ(members.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(members.status().message().find("missing rank 2"),
            std::string::npos);
  request.set_address("c:1");
  absl::StatusOr<v1::RegisterResponse> third = cluster.Register(request);
  ASSERT_TRUE(third.ok());
  EXPECT_EQ(third->rank(), 2);
  EXPECT_TRUE(cluster.Ready());
  request.set_address("d:1");
  EXPECT_EQ(cluster.Register(request).status().code(),
            absl::StatusCode::kResourceExhausted);

  cluster.MarkDead(1, "b:1");
  EXPECT_FALSE(cluster.Ready());
  EXPECT_FALSE(cluster.Heartbeat(1, "b:1"));
  absl::StatusOr<v1::RegisterResponse> back = cluster.Register(request);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->rank(), 1) << "the free rank goes to the next worker";
  EXPECT_TRUE(cluster.Ready());
}

TEST(AdmissionControl, RefusesWhatCanNeverFitAndQueuesTheRest) {
  AdmissionControl admission(10, 4);
  EXPECT_EQ(admission.Admit(11, absl::InfiniteFuture()).status().code(),
            absl::StatusCode::kResourceExhausted);
  absl::StatusOr<AdmissionControl::Ticket> first =
      admission.Admit(8, absl::InfiniteFuture());
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(
      admission.Admit(5, absl::Now() + absl::Milliseconds(20)).status().code(),
      absl::StatusCode::kDeadlineExceeded);
  std::optional<absl::StatusOr<AdmissionControl::Ticket>> second;
  std::thread waiter(
      [&] { second.emplace(admission.Admit(5, absl::InfiniteFuture())); });
  // The waiter holds the head of the line, so a small request that would fit
  // must still wait behind it.
  while (admission.waiting() == 0) std::this_thread::yield();
  EXPECT_EQ(
      admission.Admit(1, absl::Now() + absl::Milliseconds(20)).status().code(),
      absl::StatusCode::kDeadlineExceeded);
  *first = AdmissionControl::Ticket();  // release 8
  waiter.join();
  ASSERT_TRUE(second->ok());
  EXPECT_EQ(admission.in_use(), 5);
}

TEST(AdmissionControl, BoundsRequestsInFlight) {
  AdmissionControl admission(100, 2);
  absl::StatusOr<AdmissionControl::Ticket> a =
      admission.Admit(1, absl::InfiniteFuture());
  absl::StatusOr<AdmissionControl::Ticket> b =
      admission.Admit(1, absl::InfiniteFuture());
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(
      admission.Admit(1, absl::Now() + absl::Milliseconds(20)).status().code(),
      absl::StatusCode::kDeadlineExceeded);
  *a = AdmissionControl::Ticket();
  EXPECT_TRUE(admission.Admit(1, absl::Now() + absl::Seconds(5)).ok());
}

TEST(RendezvousStore, GetWaitsForKeysAndNamesTheMissingOne) {
  RendezvousStore store;
  std::thread setter([&] {
    store.Set("r/1", "one");
    store.Set("r/2", "two");
  });
  absl::StatusOr<std::vector<std::string>> values =
      store.Get({"r/2", "r/1"}, absl::InfiniteFuture());
  setter.join();
  ASSERT_TRUE(values.ok());
  EXPECT_EQ(*values, (std::vector<std::string>{"two", "one"}));
  absl::StatusOr<std::vector<std::string>> missing =
      store.Get({"r/1", "r/3"}, absl::Now() + absl::Milliseconds(10));
  ASSERT_EQ(missing.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(missing.status().message().find("r/3"), std::string::npos);
  store.Set("s/1", "x");
  store.EraseWithPrefix("r/");
  EXPECT_EQ(store.size(), 1u);
}

TEST(BalancedRuns, KeepsEveryWorkerWithinOneOfAnEvenShare) {
  std::vector<int64_t> held = {0, 0, 0};
  int64_t length = 0;
  for (int64_t count : {100, 37, 1, 1, 1, 169, 5}) {
    const std::vector<Range> runs = BalancedRuns(held, length, count);
    int64_t next = length;
    for (size_t w = 0; w < runs.size(); ++w) {
      EXPECT_EQ(runs[w].begin, next) << "runs are consecutive";
      next = runs[w].end;
      held[w] += runs[w].size();
    }
    EXPECT_EQ(next, length + count);
    length += count;
    const auto [low, high] = std::minmax_element(held.begin(), held.end());
    EXPECT_LE(*high - *low, 1) << "after appending " << count;
  }
}

// Decode-sized appends extend the last worker's run until it is `slack`
// above an even share, then the next worker's: runs stay few and long, and
// no worker is ever more than the slack (plus one) above the others.
TEST(BalancedRuns, SmallAppendsExtendTheLastRunWithinTheSlack) {
  const int64_t slack = 8;
  std::vector<std::vector<Range>> chunks = {{{0, 50}}, {{50, 100}}};
  int64_t length = 100;
  for (int step = 0; step < 100; ++step) {
    std::vector<int64_t> held;
    int64_t last = -1;
    for (size_t w = 0; w < chunks.size(); ++w) {
      int64_t rows = 0;
      for (const Range& c : chunks[w]) rows += c.size();
      held.push_back(rows);
      if (chunks[w].back().end == length) last = static_cast<int64_t>(w);
    }
    const std::vector<Range> runs = BalancedRuns(held, length, 1, last, slack);
    int64_t added = 0;
    for (size_t w = 0; w < runs.size(); ++w) {
      if (runs[w].empty()) continue;
      EXPECT_EQ(runs[w], (Range{length, length + 1}));
      if (chunks[w].back().end == runs[w].begin) {
        chunks[w].back().end = runs[w].end;
      } else {
        chunks[w].push_back(runs[w]);
      }
      held[w] += runs[w].size();
      added += runs[w].size();
    }
    EXPECT_EQ(added, 1);
    ++length;
    const auto [low, high] = std::minmax_element(held.begin(), held.end());
    EXPECT_LE(*high - *low, 2 * slack + 1) << "after step " << step;
  }
  // 100 one-row appends cut into runs of about 2 * slack rows, not 100.
  EXPECT_LE(chunks[0].size() + chunks[1].size(), 2 + 100 / slack);
}

TEST(Metrics, RendersPrometheusText) {
  Metrics metrics;
  metrics.Declare("calls_total", "Calls.", Metrics::Kind::kCounter);
  metrics.Declare("latency_seconds", "Latency.", Metrics::Kind::kHistogram,
                  {0.1, 1});
  metrics.Add("calls_total", {{"code", "OK"}}, 2);
  metrics.Observe("latency_seconds", {}, 0.5);
  metrics.Observe("latency_seconds", {}, 5);
  const std::string text = metrics.Render();
  EXPECT_NE(text.find("# TYPE calls_total counter"), std::string::npos);
  EXPECT_NE(text.find("calls_total{code=\"OK\"} 2\n"), std::string::npos);
  EXPECT_NE(text.find("latency_seconds_bucket{le=\"0.10000000000000001\"} 0"),
            std::string::npos);
  EXPECT_NE(text.find("latency_seconds_bucket{le=\"1\"} 1\n"),
            std::string::npos);
  EXPECT_NE(text.find("latency_seconds_bucket{le=\"+Inf\"} 2\n"),
            std::string::npos);
  EXPECT_NE(text.find("latency_seconds_count 2\n"), std::string::npos);
}

}  // namespace
}  // namespace ringattn
