// Broadcast-Q's LSE reduction as a binomial tree over Gloo, one thread per
// rank: for world sizes 1, 2, 3 and 5 (not a power of two) and 1, 3, 17 and
// 300 query rows (GQA, D = 80, a causal continuation: Nk > Nq) on fresh random
// inputs, rank 0's reduced output must agree with the coordinator's merge of
// the same partials to within 1e-6 * (1 + |x|) (only the merge order differs)
// and with the float64 reference to within 2e-5 * (1 + |ref|). A peer that
// goes away mid-tree and a cancelled request must fail the reduction in time.

#include "worker/partial_reduction.h"

#include <atomic>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/random_tensor.h"
#include "gloo/rendezvous/hash_store.h"
#include "gtest/gtest.h"
#include "kernels/cpu/merge_with_lse.h"
#include "kernels/cpu/reference_attention.h"
#include "kernels/cpu/reference_checks.h"
#include "worker/broadcast_executor.h"
#include "worker/gloo_communicator.h"

namespace ringattn {
namespace {

constexpr double kReferenceTolerance = 2e-5;
constexpr double kMergeOrderTolerance = 1e-6;

std::string NextPrefix() {
  static std::atomic<int> counter{0};
  return absl::StrCat("reduction-test-", counter++);
}

RingOptions TestOptions() {
  RingOptions options;
  options.step_timeout = absl::Seconds(20);
  return options;
}

AttentionSpec ContinuationSpec(int64_t nq) {
  AttentionSpec spec;
  spec.q_len = nq;
  spec.kv_len = nq + 237;
  spec.q_heads = 6;
  spec.kv_heads = 2;
  spec.head_dim = 80;
  spec.causal = true;
  return spec;
}

struct Problem {
  AttentionSpec spec;
  Tensor<float> q, k, v;
};

Problem RandomProblem(const AttentionSpec& spec, uint32_t seed) {
  const Shape q_shape{spec.batch, spec.q_len, spec.q_heads, spec.head_dim};
  const Shape kv_shape{spec.batch, spec.kv_len, spec.kv_heads, spec.head_dim};
  return Problem{spec, RandomTensor(q_shape, seed),
                 RandomTensor(kv_shape, seed + 1),
                 RandomTensor(kv_shape, seed + 2)};
}

// Every rank's broadcast-Q partial (O, LSE) of `in` over `p` ranks.
std::vector<RingOutput> Partials(const Problem& in, int p) {
  std::vector<RingOutput> partials;
  for (int rank = 0; rank < p; ++rank) {
    absl::StatusOr<std::unique_ptr<BroadcastExecutor>> executor =
        BroadcastExecutor::Create(in.spec, rank, p);
    EXPECT_TRUE(executor.ok()) << executor.status();
    if (!executor.ok()) return {};
    BroadcastExecutor& e = **executor;
    CopyView(in.q.view(), e.q());
    int64_t row = 0;
    for (const Range& chunk : e.kv_layout().Chunks(rank)) {
      CopyView(in.k.view().Slice(chunk.begin, chunk.end),
               e.k().floats().Slice(row, row + chunk.size()));
      CopyView(in.v.view().Slice(chunk.begin, chunk.end),
               e.v().floats().Slice(row, row + chunk.size()));
      row += chunk.size();
    }
    absl::StatusOr<RingOutput> part = e.Run(/*cancelled=*/nullptr);
    EXPECT_TRUE(part.ok()) << part.status();
    if (!part.ok()) return {};
    partials.push_back(std::move(*part));
  }
  return partials;
}

struct RankResult {
  absl::StatusOr<ReductionStats> stats = absl::UnknownError("did not run");
  absl::Duration elapsed;
};

// Reduces `partials` (one per rank) over Gloo, one thread per rank.
// `before_reduce(rank, communicator)` runs on each rank's thread once it is
// connected; returning false makes that rank leave (drop its communicator)
// without reducing.
std::vector<RankResult> ReduceOverGloo(
    std::vector<RingOutput>& partials, const RingOptions& options,
    const std::function<bool(int, RingCommunicator&)>& before_reduce =
        nullptr) {
  const int p = static_cast<int>(partials.size());
  gloo::rendezvous::HashStore store;
  const std::string prefix = NextPrefix();
  std::vector<RankResult> results(static_cast<size_t>(p));
  std::vector<std::thread> threads;
  for (int r = 0; r < p; ++r) {
    threads.emplace_back([&, r] {
      RankResult& result = results[r];
      absl::StatusOr<std::shared_ptr<gloo::transport::Device>> device =
          CreateGlooTcpDevice("127.0.0.1");
      if (!device.ok()) {
        result.stats = device.status();
        return;
      }
      absl::StatusOr<std::unique_ptr<GlooCommunicator>> communicator =
          GlooCommunicator::Connect(store, prefix, r, p, *device,
                                    absl::Seconds(20));
      if (!communicator.ok()) {
        result.stats = communicator.status();
        return;
      }
      if (before_reduce && !before_reduce(r, **communicator)) {
        result.stats = absl::AbortedError("left before the reduction");
        return;
      }
      HostPartials buffers(partials[r].o.floats(), partials[r].lse.view());
      const absl::Time start = absl::Now();
      result.stats = ReduceToRankZero(**communicator, buffers, options);
      result.elapsed = absl::Now() - start;
    });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

uint32_t FreshSeed() { return std::random_device()(); }

class TreeReductionTest
    : public ::testing::TestWithParam<std::tuple<int, int64_t>> {};

TEST_P(TreeReductionTest, RankZeroMatchesCoordinatorMergeAndFloat64Reference) {
  const auto [p, nq] = GetParam();
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat("p = ", p, ", Nq = ", nq, ", seed = ", seed));
  const Problem in = RandomProblem(ContinuationSpec(nq), seed);
  std::vector<RingOutput> partials = Partials(in, p);
  ASSERT_EQ(partials.size(), static_cast<size_t>(p));

  // What the coordinator computes: every partial merged in rank order.
  const Shape q_shape{1, nq, in.spec.q_heads, in.spec.head_dim};
  Tensor<float> coordinator_o(q_shape);
  Tensor<float> coordinator_lse(Shape{1, nq, in.spec.q_heads, 1});
  std::fill(coordinator_lse.values().begin(), coordinator_lse.values().end(),
            -INFINITY);
  for (const RingOutput& part : partials) {
    MergeWithLse(coordinator_o.view(), coordinator_lse.view(), part.o.floats(),
                 part.lse.view());
  }

  const std::vector<RankResult> results =
      ReduceOverGloo(partials, TestOptions());
  int64_t transfers = 0;
  for (int r = 0; r < p; ++r) {
    ASSERT_TRUE(results[r].stats.ok())
        << "rank " << r << ": " << results[r].stats.status();
    transfers += results[r].stats->transfers;
    EXPECT_EQ(results[r].stats->transfers, r == 0 ? 0 : 1) << "rank " << r;
  }
  EXPECT_EQ(transfers, p - 1);
  EXPECT_EQ(results[0].stats->rounds, p == 1 ? 0 : std::ceil(std::log2(p)));

  Tensor<float> o(q_shape);
  CopyView(View<const float>(partials[0].o.floats()), o.view());
  const Tensor<float>& lse = partials[0].lse;
  for (size_t i = 0; i < o.values().size(); ++i) {
    ASSERT_NEAR(
        o.values()[i], coordinator_o.values()[i],
        kMergeOrderTolerance * (1 + std::abs(coordinator_o.values()[i])))
        << "O element " << i;
  }
  for (size_t i = 0; i < lse.values().size(); ++i) {
    ASSERT_NEAR(
        lse.values()[i], coordinator_lse.values()[i],
        kMergeOrderTolerance * (1 + std::abs(coordinator_lse.values()[i])))
        << "LSE element " << i;
  }
  Tensor<double> o_ref(q_shape);
  Tensor<double> lse_ref(Shape{1, nq, in.spec.q_heads, 1});
  ReferenceAttention(in.spec, in.q.view(), in.k.view(), in.v.view(),
                     o_ref.view(), lse_ref.view());
  ExpectCloseToReference(o, lse, o_ref, lse_ref, kReferenceTolerance);
}

INSTANTIATE_TEST_SUITE_P(
    WorldSizesAndQueryRows, TreeReductionTest,
    ::testing::Combine(::testing::Values(1, 2, 3, 5),
                       ::testing::Values<int64_t>(1, 3, 17, 300)),
    [](const ::testing::TestParamInfo<std::tuple<int, int64_t>>& info) {
      return absl::StrCat("p", std::get<0>(info.param), "_nq",
                          std::get<1>(info.param));
    });

TEST(TreeReductionFailureTest, PeerThatLeavesMidTreeFailsItsParentInTime) {
  const Problem in = RandomProblem(ContinuationSpec(17), FreshSeed());
  std::vector<RingOutput> partials = Partials(in, 3);
  RingOptions options;
  options.step_timeout = absl::Seconds(10);
  // Rank 1 goes away instead of sending; rank 0 waits on it first.
  const std::vector<RankResult> results = ReduceOverGloo(
      partials, options, [](int rank, RingCommunicator&) { return rank != 1; });
  ASSERT_FALSE(results[0].stats.ok());
  EXPECT_TRUE(absl::IsUnavailable(results[0].stats.status()) ||
              absl::IsDeadlineExceeded(results[0].stats.status()))
      << results[0].stats.status();
  EXPECT_LT(results[0].elapsed, options.step_timeout + absl::Seconds(5));
}

TEST(TreeReductionFailureTest, CancelledRequestStopsEveryRank) {
  const Problem in = RandomProblem(ContinuationSpec(3), FreshSeed());
  std::vector<RingOutput> partials = Partials(in, 2);
  std::atomic<bool> cancelled{true};
  RingOptions options = TestOptions();
  options.cancelled = &cancelled;
  const std::vector<RankResult> results = ReduceOverGloo(partials, options);
  for (const RankResult& result : results) {
    EXPECT_TRUE(absl::IsCancelled(result.stats.status()))
        << result.stats.status();
  }
}

TEST(TreeReductionFailureTest, AbortedCommunicatorEndsAWaitAtOnce) {
  const Problem in = RandomProblem(ContinuationSpec(3), FreshSeed());
  std::vector<RingOutput> partials = Partials(in, 2);
  // Rank 1 never sends: it aborts rank 0's wait from its own thread (as a
  // cancelled stream's OnCancel does) after a moment.
  std::atomic<RingCommunicator*> rank0{nullptr};
  const std::vector<RankResult> results = ReduceOverGloo(
      partials, TestOptions(), [&](int rank, RingCommunicator& c) {
        if (rank == 0) {
          rank0 = &c;
          return true;
        }
        while (rank0.load() == nullptr) absl::SleepFor(absl::Milliseconds(1));
        absl::SleepFor(absl::Milliseconds(200));
        rank0.load()->Abort();
        return false;
      });
  EXPECT_TRUE(absl::IsCancelled(results[0].stats.status()) ||
              absl::IsUnavailable(results[0].stats.status()))
      << results[0].stats.status();
  EXPECT_LT(results[0].elapsed, absl::Seconds(10));
}

}  // namespace
}  // namespace ringattn
