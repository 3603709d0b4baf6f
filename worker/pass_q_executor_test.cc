// The pass-Q executor with one thread per rank, each with its own Gloo TCP
// device on 127.0.0.1, meeting in a shared HashStore: query blocks and their
// accumulators travel real sockets, checked against the float64 reference.
// Inputs are fresh uniform random values in [-1, 1); fp32 tolerance: |O -
// O_ref| <= 2e-5 * (1 + |O_ref|) per element, the same for the LSE, and rows
// that see no key exactly O = 0, LSE = -inf. K and V held in bf16 are rounded
// to bf16 for the reference too.

#include "worker/pass_q_executor.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/dtype.h"
#include "core/random_tensor.h"
#include "core/typed_tensor.h"
#include "gloo/rendezvous/hash_store.h"
#include "gtest/gtest.h"
#include "kernels/cpu/reference_attention.h"
#include "kernels/cpu/reference_checks.h"
#include "worker/gloo_communicator.h"
#include "worker/resident_rows_testing.h"

namespace ringattn {
namespace {

constexpr double kTolerance = 2e-5;

struct Problem {
  AttentionSpec spec;
  CpuKvHolding kv_holding;  // how the executors hold K and V
  Tensor<float> q, k, v;
  Tensor<double> o_ref, lse_ref;
};

// The values of `t` rounded to bf16, in place.
void RoundToBFloat16(Tensor<float>& t) {
  for (float& x : t.values()) x = BFloat16ToFloat(FloatToBFloat16(x));
}

Problem MakeProblem(const AttentionSpec& spec, uint32_t seed,
                    CpuKvHolding kv_holding = {}) {
  Problem in;
  in.spec = spec;
  in.kv_holding = kv_holding;
  in.q =
      RandomTensor({spec.batch, spec.q_len, spec.q_heads, spec.head_dim}, seed);
  in.k = RandomTensor({spec.batch, spec.kv_len, spec.kv_heads, spec.head_dim},
                      seed + 1);
  in.v = RandomTensor({spec.batch, spec.kv_len, spec.kv_heads, spec.head_dim},
                      seed + 2);
  if (kv_holding.dtype == DType::kBFloat16) {
    RoundToBFloat16(in.k);
    RoundToBFloat16(in.v);
  }
  in.o_ref = Tensor<double>(in.q.shape());
  in.lse_ref = Tensor<double>({spec.batch, spec.q_len, spec.q_heads, 1});
  ReferenceAttention(spec, in.q.view(), in.k.view(), in.v.view(),
                     in.o_ref.view(), in.lse_ref.view());
  return in;
}

// Copies the rows of `full` at the positions `chunks` cover into `shard`, in
// chunk order, converted to its dtype.
void Gather(View<const float> full, const std::vector<Range>& chunks,
            TypedView shard) {
  const int64_t values = full.shape().heads * full.shape().dim;
  int64_t row = 0;
  for (const Range& c : chunks) {
    for (int64_t b = 0; b < full.shape().batch; ++b) {
      for (int64_t n = 0; n < c.size(); ++n) {
        ConvertDType(DType::kFloat32, full.Row(b, c.begin + n, 0),
                     shard.dtype(), shard.Row(b, row + n), values);
      }
    }
    row += c.size();
  }
}

void Scatter(View<const float> shard, const std::vector<Range>& chunks,
             View<float> full) {
  int64_t row = 0;
  for (const Range& c : chunks) {
    CopyView(shard.Slice(row, row + c.size()), full.Slice(c.begin, c.end));
    row += c.size();
  }
}

struct RankRun {
  absl::Status status;
  RingOutput output;
  absl::Duration elapsed;  // in Run
};

std::string NextPrefix() {
  static std::atomic<int> counter{0};
  return absl::StrCat("pass-q-test-", counter++);
}

RingOptions TestOptions() {
  RingOptions options;
  options.step_timeout = absl::Seconds(20);
  return options;
}

// Wraps what one rank's thread does with its communicator before the run
// (e.g. to inject a failure); identity when empty.
using CommunicatorWrapper = std::function<std::unique_ptr<RingCommunicator>(
    std::unique_ptr<RingCommunicator>)>;

// Runs p ranks as threads; K/V sharded as `kv_layout` if given.
std::vector<RankRun> RunRanks(const Problem& in, int p,
                              const RingOptions& options,
                              const std::optional<ShardLayout>& kv_layout,
                              const CommunicatorWrapper& wrap = nullptr) {
  gloo::rendezvous::HashStore store;
  const std::string prefix = NextPrefix();
  std::vector<RankRun> runs(static_cast<size_t>(p));
  std::vector<std::thread> threads;
  for (int r = 0; r < p; ++r) {
    threads.emplace_back([&, r] {
      RankRun& run = runs[r];
      absl::StatusOr<std::shared_ptr<gloo::transport::Device>> device =
          CreateGlooTcpDevice("127.0.0.1");
      if (!device.ok()) {
        run.status = device.status();
        return;
      }
      absl::StatusOr<std::unique_ptr<GlooCommunicator>> communicator =
          GlooCommunicator::Connect(store, prefix, r, p, *device,
                                    absl::Seconds(20));
      if (!communicator.ok()) {
        run.status = communicator.status();
        return;
      }
      std::unique_ptr<RingCommunicator> ring = std::move(*communicator);
      if (wrap) ring = wrap(std::move(ring));
      absl::StatusOr<std::unique_ptr<PassQExecutor>> executor =
          PassQExecutor::Create(in.spec, r, p, kv_layout, in.kv_holding);
      if (!executor.ok()) {
        run.status = executor.status();
        return;
      }
      PassQExecutor& e = **executor;
      Gather(in.q.view(), e.q_layout().Chunks(r), TypedView(e.q()));
      if (in.kv_holding.resident) {
        run.status = e.UseResidentRows(ResidentRowsOf(
            in.k, in.v, e.kv_layout().Chunks(r), in.kv_holding.dtype));
        if (!run.status.ok()) return;
      } else {
        Gather(in.k.view(), e.kv_layout().Chunks(r), e.k());
        Gather(in.v.view(), e.kv_layout().Chunks(r), e.v());
      }
      const absl::Time start = absl::Now();
      absl::StatusOr<RingOutput> output = e.Run(*ring, options);
      run.elapsed = absl::Now() - start;
      if (!output.ok()) {
        run.status = output.status();
        return;
      }
      run.output = std::move(*output);
    });
  }
  for (std::thread& t : threads) t.join();
  return runs;
}

void ExpectMatchesReference(
    const Problem& in, int p,
    const std::optional<ShardLayout>& kv_layout = std::nullopt) {
  SCOPED_TRACE(absl::StrCat("ranks=", p));
  const std::vector<RankRun> runs = RunRanks(in, p, TestOptions(), kv_layout);
  const AttentionSpec& spec = in.spec;
  const ShardLayout q_layout = QueryLayoutFor(spec, p);
  Tensor<float> o(in.q.shape());
  Tensor<float> lse({spec.batch, spec.q_len, spec.q_heads, 1});
  for (int r = 0; r < p; ++r) {
    ASSERT_TRUE(runs[r].status.ok()) << "rank " << r << ": " << runs[r].status;
    Scatter(runs[r].output.o.floats(), q_layout.Chunks(r), o.view());
    Scatter(runs[r].output.lse.view(), q_layout.Chunks(r), lse.view());
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

TEST(PassQExecutor, DenseWithPrimeLengthMatchesReference) {
  const Problem in = MakeProblem(Spec(67, 4, 4, 64, false), 1);
  for (int p : {1, 2, 3, 4}) ExpectMatchesReference(in, p);
}

TEST(PassQExecutor, CausalZigzagWithPrimeLengthMatchesReference) {
  const Problem in = MakeProblem(Spec(101, 4, 4, 64, true), 2);
  for (int p : {1, 2, 3, 5}) ExpectMatchesReference(in, p);
}

TEST(PassQExecutor, GqaAndMqaWithHeadDim80AndBatch) {
  for (int64_t kv_heads : {2, 1}) {
    SCOPED_TRACE(absl::StrCat("kv_heads=", kv_heads));
    AttentionSpec spec = Spec(97, 8, kv_heads, 80, true);
    spec.batch = 2;
    ExpectMatchesReference(MakeProblem(spec, 3), 3);
    spec.causal = false;
    ExpectMatchesReference(MakeProblem(spec, 4), 2);
  }
}

TEST(PassQExecutor, ShortQueryBatchesContinueTheContextCausally) {
  // 1, 3 and 6 rows are laid out contiguously (QueryLayoutFor), 17 and 300
  // zigzag.
  for (int64_t q_len : {1, 3, 6, 17, 300}) {
    SCOPED_TRACE(absl::StrCat("q_len=", q_len));
    AttentionSpec spec = Spec(401, 4, 2, 64, true);
    spec.q_len = q_len;
    ExpectMatchesReference(MakeProblem(spec, 5), 4);
  }
}

TEST(PassQExecutor, ResidentContextPiecesAsKvLayout) {
  // K/V in uneven appended pieces, as a resident context holds them; Q in the
  // usual zigzag over the same ranks.
  AttentionSpec spec = Spec(90, 2, 1, 64, true);
  spec.q_len = 17;
  const ShardLayout pieces = ShardLayout::FromChunks(
      90, {{Range{0, 40}, Range{85, 90}}, {Range{40, 41}}, {Range{41, 85}}});
  ExpectMatchesReference(MakeProblem(spec, 6), 3, pieces);
}

TEST(PassQExecutor, FewerPositionsThanRanksLeavesShardsEmpty) {
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "dense");
    ExpectMatchesReference(MakeProblem(Spec(3, 2, 1, 64, causal), 7), 4);
    AttentionSpec spec = Spec(2, 2, 1, 64, causal);
    spec.q_len = 1;
    ExpectMatchesReference(MakeProblem(spec, 8), 5);
  }
}

TEST(PassQExecutor, Bf16KeysAndValuesMatchReference) {
  AttentionSpec spec = Spec(211, 8, 2, 80, true);
  for (int64_t q_len : {1, 17, 211}) {
    SCOPED_TRACE(absl::StrCat("q_len=", q_len));
    spec.q_len = q_len;
    ExpectMatchesReference(
        MakeProblem(spec, 15, CpuKvHolding{DType::kBFloat16}), 3);
  }
  BlockSparseRules rules;
  rules.block_size = 16;
  rules.local = 1;
  rules.random = 1;
  spec.block_sparse = rules;
  ExpectMatchesReference(MakeProblem(spec, 16, CpuKvHolding{DType::kBFloat16}),
                         2);
}

// K and V read where a resident context holds them, in its uneven pieces, in
// fp32 and bf16.
TEST(PassQExecutor, ResidentRowsMatchReference) {
  AttentionSpec spec = Spec(90, 8, 2, 80, true);
  spec.batch = 2;
  const ShardLayout pieces = ShardLayout::FromChunks(
      90, {{Range{0, 40}, Range{40, 41}}, {Range{41, 85}}, {Range{85, 90}}});
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    for (int64_t q_len : {1, 17, 90}) {
      SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " q_len=", q_len));
      spec.q_len = q_len;
      ExpectMatchesReference(
          MakeProblem(spec, 17, CpuKvHolding{dtype, /*resident=*/true}), 3,
          pieces);
    }
  }
}

TEST(PassQExecutor, RefusesBf16ForDilatedAndFp16) {
  AttentionSpec spec = Spec(64, 2, 1, 64, true);
  EXPECT_EQ(PassQExecutor::Create(spec, 0, 2, std::nullopt,
                                  CpuKvHolding{DType::kFloat16})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  spec.dilated = {{32, 2}};
  EXPECT_EQ(PassQExecutor::Create(spec, 0, 2, std::nullopt,
                                  CpuKvHolding{DType::kBFloat16})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(PassQExecutor, BlockSparseMatchesReference) {
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
    const Problem in = MakeProblem(spec, 9);
    ExpectMatchesReference(in, 2);
    ExpectMatchesReference(in, 4);
  }
}

TEST(PassQExecutor, DilatedLseAndHeadGroupsMatchReference) {
  AttentionSpec spec = Spec(200, 4, 2, 64, true);
  spec.dilated = {{50, 1}, {120, 2}};
  for (DilatedCombine combine :
       {DilatedCombine::kLse, DilatedCombine::kHeadGroups}) {
    spec.combine = combine;
    SCOPED_TRACE(combine == DilatedCombine::kLse ? "LSE" : "HEAD_GROUPS");
    ExpectMatchesReference(MakeProblem(spec, 10), 3);
  }
}

TEST(PassQExecutor, EveryNonEmptyBlockTravelsTheWholeRing) {
  const Problem in = MakeProblem(Spec(128, 2, 1, 32, true), 11);
  for (int p : {1, 2, 4}) {
    const std::vector<RankRun> runs =
        RunRanks(in, p, TestOptions(), std::nullopt);
    double flops = 0;
    for (int r = 0; r < p; ++r) {
      ASSERT_TRUE(runs[r].status.ok()) << runs[r].status;
      const RingRunStats& stats = runs[r].output.stats;
      EXPECT_EQ(stats.steps, p);
      // p hops bring every block home; a world of one sends nothing.
      EXPECT_EQ(stats.transfers, p == 1 ? 0 : p) << "rank " << r;
      // One CPU kernel launch per task.
      EXPECT_GT(stats.tasks, 0) << "rank " << r;
      EXPECT_EQ(stats.launches.cpu_block + stats.launches.cpu_decode,
                stats.tasks)
          << "rank " << r;
      flops += stats.flops;
    }
    // Causal N x N: N (N + 1) / 2 visible pairs, 4 D FLOPs per pair and head.
    EXPECT_DOUBLE_EQ(flops, 4.0 * 32 * 2 * (128 * 129 / 2));
  }
}

TEST(PassQExecutor, MemoryFallsWithRanks) {
  const AttentionSpec spec = Spec(4096, 4, 1, 64, true);
  const int64_t one = PassQExecutor::BytesNeeded(spec, 0, 1);
  const int64_t four = PassQExecutor::BytesNeeded(spec, 0, 4);
  EXPECT_LE(four, one / 4 + 4096);
}

TEST(PassQExecutor, RunsOnlyOnce) {
  const Problem in = MakeProblem(Spec(8, 1, 1, 16, false), 12);
  absl::StatusOr<std::unique_ptr<PassQExecutor>> executor =
      PassQExecutor::Create(in.spec, 0, 1);
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

TEST(PassQExecutor, RejectsBadRankAndLayout) {
  const AttentionSpec spec = Spec(8, 1, 1, 16, false);
  EXPECT_EQ(PassQExecutor::Create(spec, 2, 2).status().code(),
            absl::StatusCode::kInvalidArgument);
  const ShardLayout short_layout =
      ShardLayout::FromChunks(7, {{Range{0, 3}}, {Range{3, 7}}});
  EXPECT_EQ(PassQExecutor::Create(spec, 0, 2, short_layout).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(PassQExecutor, CancelledRunStops) {
  const Problem in = MakeProblem(Spec(40, 1, 1, 16, false), 13);
  std::atomic<bool> cancelled{true};
  RingOptions options = TestOptions();
  options.cancelled = &cancelled;
  const std::vector<RankRun> runs = RunRanks(in, 2, options, std::nullopt);
  // A rank still joining when its peer has stopped sees the connection close.
  int cancelled_ranks = 0;
  for (int r : {0, 1}) {
    EXPECT_TRUE(runs[r].status.code() == absl::StatusCode::kCancelled ||
                runs[r].status.code() == absl::StatusCode::kUnavailable)
        << runs[r].status;
    cancelled_ranks += runs[r].status.code() == absl::StatusCode::kCancelled;
  }
  EXPECT_GE(cancelled_ranks, 1);
}

// Fails (as a crashed process would, closing its connections) at its first
// wait.
class FailingCommunicator final : public RingCommunicator {
 public:
  explicit FailingCommunicator(std::unique_ptr<RingCommunicator> inner)
      : inner_(std::move(inner)),
        rank_(inner_->rank()),
        world_size_(inner_->world_size()) {}

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  absl::Status StartSend(const void* data, int64_t bytes, int peer) override {
    return inner_->StartSend(data, bytes, peer);
  }
  absl::Status StartReceive(void* data, int64_t bytes, int peer) override {
    return inner_->StartReceive(data, bytes, peer);
  }
  absl::Status Wait(absl::Time) override {
    inner_.reset();
    return absl::UnavailableError("injected failure");
  }
  void Abort() override {}

 private:
  std::unique_ptr<RingCommunicator> inner_;
  const int rank_;
  const int world_size_;
};

// Every block passes every rank, so a rank that fails makes every other rank
// fail too, each within the step timeout, none hanging.
TEST(PassQExecutorFaults, RankFailingMidwayFailsEveryRankWithinTimeout) {
  const Problem in = MakeProblem(Spec(120, 2, 1, 32, false), 14);
  RingOptions options;
  options.step_timeout = absl::Seconds(3);
  const std::vector<RankRun> runs =
      RunRanks(in, 4, options, std::nullopt,
               [](std::unique_ptr<RingCommunicator> inner)
                   -> std::unique_ptr<RingCommunicator> {
                 if (inner->rank() != 1) return inner;
                 return std::make_unique<FailingCommunicator>(std::move(inner));
               });
  EXPECT_EQ(runs[1].status.message(), "injected failure");
  for (int r : {0, 2, 3}) {
    const absl::StatusCode code = runs[r].status.code();
    EXPECT_TRUE(code == absl::StatusCode::kUnavailable ||
                code == absl::StatusCode::kDeadlineExceeded)
        << "rank " << r << ": " << runs[r].status;
    // Bounded, not hung: the ring's join is not timed (it is slow on a loaded
    // machine), a rank's own run is.
    EXPECT_LT(runs[r].elapsed, options.step_timeout + absl::Seconds(4))
        << "rank " << r;
  }
}

}  // namespace
}  // namespace ringattn
