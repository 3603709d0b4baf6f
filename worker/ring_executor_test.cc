// The ring executor with one thread per rank, each with its own Gloo TCP
// device on 127.0.0.1 and its own context, meeting in a shared HashStore:
// the distributed algorithm over real sockets, against the float64 reference.
// Inputs are fresh uniform random values in [-1, 1); fp32 tolerance: |O -
// O_ref| <= 2e-5 * (1 + |O_ref|) per element, the same for the LSE, and rows
// that see no key exactly O = 0, LSE = -inf. Fault tests: ranks that never
// join, stall, or fail mid-way make the others fail within the timeout. K/V
// blocks held in bf16 are checked against the reference on bf16 inputs.

#include "worker/ring_executor.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "core/dtype.h"
#include "core/hilbert.h"
#include "core/random_tensor.h"
#include "core/typed_tensor.h"
#include "gloo/rendezvous/hash_store.h"
#include "gtest/gtest.h"
#include "kernels/cpu/reference_attention.h"
#include "kernels/cpu/reference_checks.h"
#include "worker/gloo_communicator.h"

namespace ringattn {
namespace {

constexpr double kTolerance = 2e-5;

// A request's tensors in the caller's order, its reference output, and the
// masking order (order[t]: the caller's row at masking position t).
struct Problem {
  AttentionSpec spec;
  DType kv_dtype = DType::kFloat32;  // of the ring's K/V blocks
  Tensor<float> q, k, v;
  Tensor<double> o_ref, lse_ref;
  std::vector<int64_t> q_order, kv_order;
};

Problem MakeProblem(const AttentionSpec& spec, uint32_t seed,
                    DType kv_dtype = DType::kFloat32) {
  Problem in;
  in.spec = spec;
  in.kv_dtype = kv_dtype;
  in.q =
      RandomTensor({spec.batch, spec.q_len, spec.q_heads, spec.head_dim}, seed);
  in.k = RandomTensor({spec.batch, spec.kv_len, spec.kv_heads, spec.head_dim},
                      seed + 1);
  in.v = RandomTensor({spec.batch, spec.kv_len, spec.kv_heads, spec.head_dim},
                      seed + 2);
  if (kv_dtype == DType::kBFloat16) {
    for (Tensor<float>* t : {&in.k, &in.v}) {
      for (float& x : t->values()) x = BFloat16ToFloat(FloatToBFloat16(x));
    }
  }
  in.o_ref = Tensor<double>(in.q.shape());
  in.lse_ref = Tensor<double>({spec.batch, spec.q_len, spec.q_heads, 1});
  ReferenceAttention(spec, in.q.view(), in.k.view(), in.v.view(),
                     in.o_ref.view(), in.lse_ref.view());
  in.q_order.resize(spec.q_len);
  in.kv_order.resize(spec.kv_len);
  std::iota(in.q_order.begin(), in.q_order.end(), 0);
  std::iota(in.kv_order.begin(), in.kv_order.end(), 0);
  if (spec.hilbert.has_value()) {
    in.q_order = in.kv_order =
        HilbertOrder(spec.hilbert->height, spec.hilbert->width);
  }
  return in;
}

// Copies the rows of `full` at the masking positions `chunks` cover into
// `shard`, in chunk order, converted to its dtype.
void Gather(View<const float> full, const std::vector<Range>& chunks,
            const std::vector<int64_t>& order, TypedView shard) {
  const int64_t values = full.shape().heads * full.shape().dim;
  int64_t row = 0;
  for (const Range& c : chunks) {
    for (int64_t t = c.begin; t < c.end; ++t, ++row) {
      for (int64_t b = 0; b < full.shape().batch; ++b) {
        ConvertDType(DType::kFloat32, full.Row(b, order[t], 0), shard.dtype(),
                     shard.Row(b, row), values);
      }
    }
  }
}

void Scatter(View<const float> shard, const std::vector<Range>& chunks,
             const std::vector<int64_t>& order, View<float> full) {
  int64_t row = 0;
  for (const Range& c : chunks) {
    for (int64_t t = c.begin; t < c.end; ++t, ++row) {
      CopyView(shard.Slice(row, row + 1), full.Slice(order[t], order[t] + 1));
    }
  }
}

// Wraps what one rank's thread does with its communicator before the run
// (e.g. to inject a failure); identity by default.
using CommunicatorWrapper = std::function<std::unique_ptr<RingCommunicator>(
    std::unique_ptr<RingCommunicator>)>;

struct RankRun {
  absl::Status status;
  RingOutput output;
  absl::Duration elapsed;
};

std::string NextPrefix() {
  static std::atomic<int> counter{0};
  return absl::StrCat("ring-test-", counter++);
}

// Runs the whole ring with p ranks as threads; ranks in `absent` never join.
// `on_finished(rank)` runs on each rank's thread once it is done.
std::vector<RankRun> RunRanks(
    const Problem& in, int p, const RingOptions& options,
    absl::Duration connect_timeout, const std::vector<int>& absent = {},
    const CommunicatorWrapper& wrap = nullptr,
    const std::function<void(int)>& on_finished = nullptr) {
  gloo::rendezvous::HashStore store;
  const std::string prefix = NextPrefix();
  std::vector<RankRun> runs(static_cast<size_t>(p));
  std::vector<std::thread> threads;
  for (int r = 0; r < p; ++r) {
    if (std::find(absent.begin(), absent.end(), r) != absent.end()) continue;
    threads.emplace_back([&, r] {
      const absl::Time start = absl::Now();
      RankRun& run = runs[r];
      auto finish = [&](absl::Status status) {
        run.status = std::move(status);
        run.elapsed = absl::Now() - start;
        if (on_finished) on_finished(r);
      };
      absl::StatusOr<std::shared_ptr<gloo::transport::Device>> device =
          CreateGlooTcpDevice("127.0.0.1");
      if (!device.ok()) return finish(device.status());
      absl::StatusOr<std::unique_ptr<GlooCommunicator>> gloo =
          GlooCommunicator::Connect(store, prefix, r, p, *device,
                                    connect_timeout);
      if (!gloo.ok()) return finish(gloo.status());
      std::unique_ptr<RingCommunicator> communicator = std::move(*gloo);
      if (wrap) communicator = wrap(std::move(communicator));
      absl::StatusOr<std::unique_ptr<RingExecutor>> executor =
          RingExecutor::Create(in.spec, r, p, std::nullopt, in.kv_dtype);
      if (!executor.ok()) return finish(executor.status());
      RingExecutor& e = **executor;
      Gather(in.q.view(), e.q_layout().Chunks(r), in.q_order, TypedView(e.q()));
      Gather(in.k.view(), e.kv_layout().Chunks(r), in.kv_order, e.k());
      Gather(in.v.view(), e.kv_layout().Chunks(r), in.kv_order, e.v());
      absl::StatusOr<RingOutput> output = e.Run(*communicator, options);
      if (!output.ok()) return finish(output.status());
      run.output = std::move(*output);
      finish(absl::OkStatus());
    });
  }
  for (std::thread& t : threads) t.join();
  return runs;
}

RingOptions TestOptions() {
  RingOptions options;
  options.step_timeout = absl::Seconds(20);
  return options;
}

void ExpectMatchesReference(const Problem& in, int p) {
  SCOPED_TRACE(absl::StrCat("ranks=", p));
  const std::vector<RankRun> runs =
      RunRanks(in, p, TestOptions(), absl::Seconds(20));
  const AttentionSpec& spec = in.spec;
  const ShardLayout q_layout = QueryLayoutFor(spec, p);
  Tensor<float> o(in.q.shape());
  Tensor<float> lse({spec.batch, spec.q_len, spec.q_heads, 1});
  for (int r = 0; r < p; ++r) {
    ASSERT_TRUE(runs[r].status.ok()) << "rank " << r << ": " << runs[r].status;
    Scatter(runs[r].output.o.floats(), q_layout.Chunks(r), in.q_order,
            o.view());
    Scatter(runs[r].output.lse.view(), q_layout.Chunks(r), in.q_order,
            lse.view());
  }
  ExpectCloseToReference(o, lse, in.o_ref, in.lse_ref, kTolerance);
}

AttentionSpec Spec(int64_t n, int64_t hq, int64_t hkv, int64_t d, bool causal) {
  AttentionSpec spec;
  spec.q_len = spec.kv_len = n;
  spec.q_heads = hq;
  spec.kv_heads = hkv;
  spec.head_dim = d;
  spec.causal = causal;
  return spec;
}

TEST(RingExecutor, DenseMatchesReference) {
  const Problem in = MakeProblem(Spec(67, 4, 4, 64, false), 1);
  for (int p : {1, 2, 3, 4}) ExpectMatchesReference(in, p);
}

TEST(RingExecutor, CausalZigzagWithPrimeLengthMatchesReference) {
  const Problem in = MakeProblem(Spec(101, 4, 1, 64, true), 2);
  for (int p : {1, 2, 3, 4}) ExpectMatchesReference(in, p);
}

TEST(RingExecutor, GqaWithHeadDim80AndBatch) {
  AttentionSpec spec = Spec(97, 8, 2, 80, true);
  spec.batch = 2;
  ExpectMatchesReference(MakeProblem(spec, 3), 3);
  spec.causal = false;
  ExpectMatchesReference(MakeProblem(spec, 4), 2);
}

TEST(RingExecutor, CausalContinuationOfShortQueryBatch) {
  AttentionSpec spec = Spec(77, 2, 1, 64, true);
  spec.q_len = 5;
  ExpectMatchesReference(MakeProblem(spec, 5), 3);
}

// A causal batch of q_len * kShortQueryRatio <= kv_len rows is one run per
// worker (QueryLayoutFor), several rows each.
TEST(RingExecutor, ContiguousShortCausalBatchMatchesReference) {
  AttentionSpec spec = Spec(701, 2, 1, 64, true);
  spec.q_len = 10;
  for (int p : {3, 4}) {
    ASSERT_EQ(QueryLayoutFor(spec, p).Chunks(0).size(), 1u);
    ExpectMatchesReference(MakeProblem(spec, 6), p);
  }
}

TEST(RingExecutor, DilatedLseAndHeadGroupsMatchReference) {
  AttentionSpec spec = Spec(200, 4, 2, 64, true);
  spec.dilated = {{50, 1}, {120, 2}};
  for (DilatedCombine combine :
       {DilatedCombine::kLse, DilatedCombine::kHeadGroups}) {
    spec.combine = combine;
    SCOPED_TRACE(combine == DilatedCombine::kLse ? "LSE" : "HEAD_GROUPS");
    ExpectMatchesReference(MakeProblem(spec, 6), 3);
  }
}

TEST(RingExecutor, BlockSparseMatchesReference) {
  AttentionSpec spec = Spec(150, 2, 1, 64, false);
  BlockSparseRules rules;
  rules.block_size = 16;
  rules.local = 1;
  rules.global = 1;
  rules.random = 1;
  rules.seed = 7;
  spec.block_sparse = rules;
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "dense");
    spec.causal = causal;
    const Problem in = MakeProblem(spec, 7);
    ExpectMatchesReference(in, 2);
    ExpectMatchesReference(in, 4);
  }
}

TEST(RingExecutor, HilbertMatchesReference) {
  AttentionSpec spec = Spec(9 * 11, 2, 1, 64, true);
  spec.hilbert = HilbertGrid{9, 11};
  ExpectMatchesReference(MakeProblem(spec, 8), 3);
}

TEST(RingExecutor, FewerPositionsThanRanksLeavesShardsEmpty) {
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "dense");
    const Problem in = MakeProblem(Spec(3, 2, 1, 64, causal), 9);
    ExpectMatchesReference(in, 4);
  }
}

TEST(RingExecutor, ReportsTransfersAndFallingMemory) {
  const Problem in = MakeProblem(Spec(128, 2, 1, 32, true), 10);
  int64_t previous_peak = 0;
  for (int p : {1, 2, 4}) {
    const std::vector<RankRun> runs =
        RunRanks(in, p, TestOptions(), absl::Seconds(20));
    int64_t peak = 0;
    double flops = 0;
    for (int r = 0; r < p; ++r) {
      ASSERT_TRUE(runs[r].status.ok()) << runs[r].status;
      const RingRunStats& stats = runs[r].output.stats;
      EXPECT_EQ(stats.steps, p);
      EXPECT_EQ(stats.transfers, p - 1) << "rank " << r;
      // One CPU kernel launch per task.
      EXPECT_GT(stats.tasks, 0) << "rank " << r;
      EXPECT_EQ(stats.launches.cpu_block + stats.launches.cpu_decode,
                stats.tasks)
          << "rank " << r;
      peak = std::max(peak, stats.peak_bytes);
      flops += stats.flops;
    }
    // Causal N x N: N (N + 1) / 2 visible pairs, 4 D FLOPs per pair and head.
    EXPECT_DOUBLE_EQ(flops, 4.0 * 32 * 2 * (128 * 129 / 2));
    if (previous_peak != 0) {
      EXPECT_LE(peak, previous_peak / 2 + 4096);
    }
    previous_peak = peak;
  }
}

// Blocks in bf16 travel half the bytes and give the reference's result on the
// same bf16 values: dense, causal zigzag, GQA at D=80, block-sparse.
TEST(RingExecutor, Bf16BlocksMatchReferenceWithHalfTheBytes) {
  AttentionSpec spec = Spec(97, 8, 2, 80, true);
  spec.batch = 2;
  for (bool causal : {true, false}) {
    SCOPED_TRACE(causal ? "causal" : "dense");
    spec.causal = causal;
    ExpectMatchesReference(MakeProblem(spec, 30, DType::kBFloat16), 3);
  }
  AttentionSpec sparse = Spec(150, 2, 1, 64, true);
  sparse.block_sparse = BlockSparseRules{.block_size = 16, .local = 1};
  ExpectMatchesReference(MakeProblem(sparse, 31, DType::kBFloat16), 2);

  const AttentionSpec small = Spec(64, 2, 1, 32, false);
  int64_t sent[2] = {};
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    const std::vector<RankRun> runs = RunRanks(
        MakeProblem(small, 32, dtype), 2, TestOptions(), absl::Seconds(20));
    ASSERT_TRUE(runs[0].status.ok()) << runs[0].status;
    sent[dtype == DType::kBFloat16] = runs[0].output.stats.bytes_sent;
  }
  EXPECT_EQ(sent[1] * 2, sent[0]);
}

TEST(RingExecutor, RunsOnlyOnce) {
  const Problem in = MakeProblem(Spec(8, 1, 1, 16, false), 11);
  absl::StatusOr<std::unique_ptr<RingExecutor>> executor =
      RingExecutor::Create(in.spec, 0, 1);
  ASSERT_TRUE(executor.ok());
  absl::StatusOr<std::shared_ptr<gloo::transport::Device>> device =
      CreateGlooTcpDevice("127.0.0.1");
  ASSERT_TRUE(device.ok()) << device.status();
  gloo::rendezvous::HashStore store;
  absl::StatusOr<std::unique_ptr<GlooCommunicator>> communicator =
      GlooCommunicator::Connect(store, "once", 0, 1, *device, absl::Seconds(5));
  ASSERT_TRUE(communicator.ok()) << communicator.status();
  ASSERT_TRUE((*executor)->Run(**communicator, RingOptions()).ok());
  EXPECT_EQ((*executor)->Run(**communicator, RingOptions()).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(RingExecutor, RejectsBadRank) {
  const AttentionSpec spec = Spec(8, 1, 1, 16, false);
  EXPECT_EQ(RingExecutor::Create(spec, 2, 2).status().code(),
            absl::StatusCode::kInvalidArgument);
  AttentionSpec bad = spec;
  bad.head_dim = 0;
  EXPECT_EQ(RingExecutor::Create(bad, 0, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RingExecutor::Create(spec, 0, 1, std::nullopt, DType::kFloat16)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  AttentionSpec dilated = spec;
  dilated.dilated = {DilatedBranch{8, 2}};
  EXPECT_EQ(RingExecutor::Create(dilated, 0, 1, std::nullopt, DType::kBFloat16)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// Fault tests.

TEST(RingExecutorFaults, RankThatNeverJoinsFailsTheOthersWithinTimeout) {
  const Problem in = MakeProblem(Spec(30, 1, 1, 16, false), 12);
  const absl::Duration timeout = absl::Seconds(1);
  const std::vector<RankRun> runs =
      RunRanks(in, 3, TestOptions(), timeout, /*absent=*/{2});
  for (int r : {0, 1}) {
    EXPECT_EQ(runs[r].status.code(), absl::StatusCode::kDeadlineExceeded)
        << runs[r].status;
    EXPECT_NE(runs[r].status.message().find("rank 2 did not join"),
              std::string::npos)
        << runs[r].status;
    EXPECT_LT(runs[r].elapsed, timeout + absl::Seconds(4));
  }
}

// Fails (as a crashed process would, closing its connections) at its
// `fail_at`-th wait.
class FailingCommunicator final : public RingCommunicator {
 public:
  FailingCommunicator(std::unique_ptr<RingCommunicator> inner, int fail_at)
      : inner_(std::move(inner)),
        rank_(inner_->rank()),
        world_size_(inner_->world_size()),
        fail_at_(fail_at) {}

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  absl::Status StartSend(const void* data, int64_t bytes, int peer) override {
    return inner_->StartSend(data, bytes, peer);
  }
  absl::Status StartReceive(void* data, int64_t bytes, int peer) override {
    return inner_->StartReceive(data, bytes, peer);
  }
  absl::Status Wait(absl::Time deadline) override {
    if (++waits_ < fail_at_) return inner_->Wait(deadline);
    inner_.reset();
    return absl::UnavailableError("injected failure");
  }
  void Abort() override {}

 private:
  std::unique_ptr<RingCommunicator> inner_;
  const int rank_;
  const int world_size_;
  const int fail_at_;
  int waits_ = 0;
};

// Rank 1 fails at its first wait, after starting its transfers. Rank 2 needs
// a block rank 1 never sent, so it must fail; ranks further along may or may
// not have received everything they need by then, but none may hang.
TEST(RingExecutorFaults, RankFailingMidwayFailsItsSuccessorWithinTimeout) {
  const Problem in = MakeProblem(Spec(120, 2, 1, 32, false), 13);
  RingOptions options;
  options.step_timeout = absl::Seconds(3);
  const std::vector<RankRun> runs = RunRanks(
      in, 4, options, absl::Seconds(20), {},
      [](std::unique_ptr<RingCommunicator> inner)
          -> std::unique_ptr<RingCommunicator> {
        if (inner->rank() != 1) return inner;
        return std::make_unique<FailingCommunicator>(std::move(inner), 1);
      });
  EXPECT_EQ(runs[1].status.message(), "injected failure");
  EXPECT_FALSE(runs[2].status.ok());
  for (int r : {0, 2, 3}) {
    const absl::StatusCode code = runs[r].status.code();
    EXPECT_TRUE(code == absl::StatusCode::kOk ||
                code == absl::StatusCode::kUnavailable ||
                code == absl::StatusCode::kDeadlineExceeded)
        << "rank " << r << ": " << runs[r].status;
    EXPECT_LT(runs[r].elapsed, options.step_timeout + absl::Seconds(4))
        << "rank " << r;
  }
}

// Joins the group, then does nothing until released: a stalled process.
class StalledCommunicator final : public RingCommunicator {
 public:
  StalledCommunicator(std::unique_ptr<RingCommunicator> inner,
                      absl::Notification& release)
      : inner_(std::move(inner)), release_(release) {}

  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  absl::Status StartSend(const void*, int64_t, int) override { return Stall(); }
  absl::Status StartReceive(void*, int64_t, int) override { return Stall(); }
  absl::Status Wait(absl::Time) override { return Stall(); }
  void Abort() override {}

 private:
  absl::Status Stall() {
    release_.WaitForNotification();
    return absl::CancelledError("released");
  }

  std::unique_ptr<RingCommunicator> inner_;
  absl::Notification& release_;
};

TEST(RingExecutorFaults, StalledRankTimesOutTheOthers) {
  const Problem in = MakeProblem(Spec(60, 1, 1, 16, false), 14);
  RingOptions options;
  options.step_timeout = absl::Seconds(1);
  // Rank 0 stalls until both other ranks have given up on it.
  absl::Notification release;
  std::atomic<int> finished{0};
  const std::vector<RankRun> runs = RunRanks(
      in, 3, options, absl::Seconds(20), {},
      [&](std::unique_ptr<RingCommunicator> inner)
          -> std::unique_ptr<RingCommunicator> {
        if (inner->rank() != 0) return inner;
        return std::make_unique<StalledCommunicator>(std::move(inner), release);
      },
      [&](int rank) {
        if (rank != 0 && ++finished == 2) release.Notify();
      });
  for (int r : {1, 2}) {
    EXPECT_TRUE(runs[r].status.code() == absl::StatusCode::kDeadlineExceeded ||
                runs[r].status.code() == absl::StatusCode::kUnavailable)
        << "rank " << r << ": " << runs[r].status;
    EXPECT_LT(runs[r].elapsed, options.step_timeout + absl::Seconds(4));
  }
}

TEST(RingExecutorFaults, CancelledRunStops) {
  const Problem in = MakeProblem(Spec(40, 1, 1, 16, false), 15);
  std::atomic<bool> cancelled{true};
  RingOptions options = TestOptions();
  options.cancelled = &cancelled;
  const std::vector<RankRun> runs = RunRanks(in, 2, options, absl::Seconds(20));
  // A rank that is still joining when its peer has already stopped sees the
  // connection close instead.
  int cancelled_ranks = 0;
  for (int r : {0, 1}) {
    EXPECT_TRUE(runs[r].status.code() == absl::StatusCode::kCancelled ||
                runs[r].status.code() == absl::StatusCode::kUnavailable)
        << runs[r].status;
    cancelled_ranks += runs[r].status.code() == absl::StatusCode::kCancelled;
  }
  EXPECT_GE(cancelled_ranks, 1);
}

}  // namespace
}  // namespace ringattn
