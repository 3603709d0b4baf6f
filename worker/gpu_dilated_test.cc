// Dilated (LongNet) attention through GpuRingExecutor against the float64
// reference (kernels/cpu/reference_attention.h) computed from the same
// 16-bit-rounded inputs: both combines (LSE, HEAD_GROUPS), causal or not,
// several branches, prime lengths (short last segments), GQA and MQA, head
// dims 7, 64, 80 and 128, bf16 and fp16, tiny tiles that cut segments and split
// batches, a batch of 2; on one GPU (world of one) and as a two-rank NCCL ring
// whose segments span the shard boundary. Outputs are poisoned with NaN on
// the device before each run. Tolerances as gpu_ring_executor_test: |O - O_ref|
// <= tol * (1 + |O_ref|) with tol 2e-2 (bf16) or 1e-2 (fp16), |LSE - LSE_ref|
// <= 1e-2 * (1 + |LSE_ref|), and rows that see no key exactly O = 0, LSE =
// -inf. Skips, saying why, where there are too few GPUs.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/attention_spec.h"
#include "core/dtype.h"
#include "core/ring_plan.h"
#include "core/shard_layout.h"
#include "core/tensor.h"
#include "gtest/gtest.h"
#include "kernels/cuda/hopper_attention.h"
#include "worker/device.h"
#include "worker/gpu_ring_executor.h"
#include "worker/gpu_ring_testing.h"
#include "worker/gpu_test_skip.h"
#include "worker/nccl_communicator.h"
#include "worker/solo_communicator.h"

namespace ringattn {
namespace {

struct Case {
  std::string name;
  int64_t batch = 1;
  int64_t n = 0;
  int64_t q_heads = 8;
  int64_t kv_heads = 2;
  int64_t head_dim = 128;
  bool causal = false;
  std::vector<DilatedBranch> branches = {{64, 1}, {128, 2}, {512, 4}};
  DilatedCombine combine = DilatedCombine::kLse;
  DeviceDType dtype = DeviceDType::kBFloat16;
  int64_t tile_q = 16384;
  int64_t tile_kv = 16384;
  // Rows of the reference to check; 0: all of them.
  int64_t sampled_rows = 0;
  // GpuRingConfig::prefer_own_kernel: the calls cuDNN would take run on our
  // Hopper kernel where the GPU is one.
  bool own_kernel = false;
};

std::string Describe(const Case& c) {
  std::string branches;
  for (const DilatedBranch& b : c.branches) {
    absl::StrAppend(&branches, "(", b.segment_length, ",", b.dilation, ")");
  }
  return absl::StrCat(
      c.name, ": N ", c.n, " B ", c.batch, " Hq ", c.q_heads, " Hkv ",
      c.kv_heads, " D ", c.head_dim, c.causal ? " causal" : " dense",
      c.combine == DilatedCombine::kLse ? " LSE" : " HEAD_GROUPS", " branches ",
      branches, " tiles ", c.tile_q, "x", c.tile_kv, " ",
      DeviceDTypeName(c.dtype));
}

ReferenceProblem MakeProblem(const Case& c) {
  AttentionSpec spec;
  spec.batch = c.batch;
  spec.q_len = spec.kv_len = c.n;
  spec.q_heads = c.q_heads;
  spec.kv_heads = c.kv_heads;
  spec.head_dim = c.head_dim;
  spec.causal = c.causal;
  spec.dilated = c.branches;
  spec.combine = c.combine;
  return MakeReferenceProblem(spec, c.dtype, c.sampled_rows);
}

struct RankResult {
  absl::Status status;
  Tensor<float> o;
  Tensor<float> lse;
  GpuRingStats stats;
};

// Loads rank `rank`'s shard of `p`, runs it over `communicator` and
// downloads the output, poisoned with NaN on the device before the run.
RankResult RunRank(const ReferenceProblem& p, const Case& c, int rank,
                   int world_size, RingCommunicator& communicator) {
  RankResult result;
  GpuRingConfig config;
  config.device = rank;
  config.dtype = c.dtype;
  config.tile_q_rows = c.tile_q;
  config.tile_kv_rows = c.tile_kv;
  config.prefer_own_kernel = c.own_kernel;
  absl::StatusOr<std::unique_ptr<GpuRingExecutor>> executor =
      GpuRingExecutor::Create(p.spec, rank, world_size, config);
  if (!executor.ok()) {
    result.status = executor.status();
    return result;
  }
  GpuRingExecutor& e = **executor;
  const Tensor<float> q = GatherChunks(p.q, e.q_layout().Chunks(rank));
  const Tensor<float> k = GatherChunks(p.k, e.kv_layout().Chunks(rank));
  const Tensor<float> v = GatherChunks(p.v, e.kv_layout().Chunks(rank));
  result.status = e.Upload(q.view(), k.view(), v.view());
  if (result.status.ok()) result.status = PoisonOutput(e);
  if (!result.status.ok()) return result;
  RingOptions options;
  options.step_timeout = absl::Seconds(60);
  absl::StatusOr<GpuRingStats> stats = e.Run(communicator, options);
  if (!stats.ok()) {
    result.status = stats.status();
    return result;
  }
  result.stats = *stats;
  result.o = Tensor<float>(e.q_shape());
  Shape lse_shape = e.q_shape();
  lse_shape.dim = 1;
  result.lse = Tensor<float>(lse_shape);
  result.status = e.Download(result.o.view(), result.lse.view());
  return result;
}

// Runs the ring of `world_size` ranks, one thread and GPU each.
std::vector<RankResult> RunRing(const ReferenceProblem& p, const Case& c,
                                int world_size) {
  std::vector<RankResult> results(static_cast<size_t>(world_size));
  if (world_size == 1) {
    SoloCommunicator solo;
    results[0] = RunRank(p, c, 0, 1, solo);
    return results;
  }
  const absl::StatusOr<ncclUniqueId> id = NewNcclUniqueId();
  if (!id.ok()) {
    for (RankResult& r : results) r.status = id.status();
    return results;
  }
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world_size; ++rank) {
    threads.emplace_back([&, rank] {
      absl::StatusOr<std::unique_ptr<NcclCommunicator>> communicator =
          NcclCommunicator::Create(*id, rank, world_size, rank,
                                   absl::Seconds(60));
      if (!communicator.ok()) {
        results[rank].status = communicator.status();
        return;
      }
      results[rank] = RunRank(p, c, rank, world_size, **communicator);
    });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

void ExpectMatchesReference(const Case& c, int world_size) {
  const std::string what =
      absl::StrCat(Describe(c), ", ", world_size, " rank(s)");
  SCOPED_TRACE(what);
  std::printf("%s\n", what.c_str());
  // Out before the ranks start: an abort in a two-rank run (seen once, ninth
  // session) should name its case.
  std::fflush(stdout);
  const ReferenceProblem p = MakeProblem(c);
  ASSERT_TRUE(p.spec.Validate().ok()) << p.spec.Validate();
  const std::vector<RankResult> results = RunRing(p, c, world_size);
  const ShardLayout q_layout = LayoutFor(p.spec, c.n, world_size);
  Tensor<float> o(p.q.shape());
  Tensor<float> lse({c.batch, c.n, c.q_heads, 1});
  for (int r = 0; r < world_size; ++r) {
    ASSERT_TRUE(results[r].status.ok())
        << "rank " << r << ": " << results[r].status;
    ASSERT_EQ(FirstNaN(results[r].o, results[r].lse), "")
        << "rank " << r << " left it unwritten";
    ScatterChunks(results[r].o, q_layout.Chunks(r), o);
    ScatterChunks(results[r].lse, q_layout.Chunks(r), lse);
    const GpuRingStats& s = results[r].stats;
    std::printf(
        "  rank %d: %lld steps, %lld transfers, launches: %lld cuDNN, %lld "
        "flash, %lld hopper, %lld decode; %.3f ms computing\n",
        r, static_cast<long long>(s.ring.steps),
        static_cast<long long>(s.ring.transfers),
        static_cast<long long>(s.tiles.cudnn),
        static_cast<long long>(s.tiles.flash),
        static_cast<long long>(s.tiles.hopper),
        static_cast<long long>(s.tiles.decode), s.ring.compute_seconds * 1e3);
    if (c.own_kernel && HopperAttentionAvailable(c.head_dim)) {
      EXPECT_EQ(s.tiles.cudnn, 0) << "rank " << r;
      EXPECT_GT(s.tiles.hopper, 0) << "rank " << r;
    }
  }
  const double tol = c.dtype == DeviceDType::kBFloat16 ? 2e-2 : 1e-2;
  ReferenceError error;
  ASSERT_NO_FATAL_FAILURE(CompareWithReference(p, o, lse, &error));
  EXPECT_LE(error.worst, tol) << error.where;
  std::printf("  worst |O - O_ref| / (1 + |O_ref|) = %.2e (tolerance %.0e)\n",
              error.worst, tol);
}

Case Make(std::string name, int64_t n, bool causal, DilatedCombine combine) {
  Case c;
  c.name = std::move(name);
  c.n = n;
  c.causal = causal;
  c.combine = combine;
  return c;
}

// Runs every case in both 16-bit dtypes.
void ExpectAllMatch(const std::vector<Case>& cases, int world_size) {
  for (const Case& base : cases) {
    for (const DeviceDType dtype :
         {DeviceDType::kBFloat16, DeviceDType::kFloat16}) {
      Case c = base;
      c.dtype = dtype;
      ExpectMatchesReference(c, world_size);
    }
  }
}

// Both combines, causal and not.
std::vector<Case> BothCombines(const Case& base) {
  std::vector<Case> cases;
  for (const DilatedCombine combine :
       {DilatedCombine::kLse, DilatedCombine::kHeadGroups}) {
    for (const bool causal : {false, true}) {
      Case c = base;
      c.combine = combine;
      c.causal = causal;
      cases.push_back(c);
    }
  }
  return cases;
}

TEST(GpuDilatedTest, OneGpuMatchesReference) {
  SKIP_WITHOUT_GPUS(1);
  std::vector<Case> cases;
  // N prime: every branch ends with a short segment.
  Case gqa = Make("three_branches_gqa_d128", 1009, false, DilatedCombine::kLse);
  for (const Case& c : BothCombines(gqa)) cases.push_back(c);
  Case d80 = gqa;
  d80.name = "three_branches_gqa_d80";
  d80.head_dim = 80;
  for (const Case& c : BothCombines(d80)) cases.push_back(c);
  // Tiny tiles: segments cut into tiles, batches of segments split; batch 2.
  Case tiled = Make("tiled_batch2", 1009, true, DilatedCombine::kLse);
  tiled.batch = 2;
  tiled.tile_q = 16;
  tiled.tile_kv = 24;
  for (const Case& c : BothCombines(tiled)) cases.push_back(c);
  // MQA, a dilation that does not divide the segment, one segment as long
  // as the sequence.
  Case mqa = Make("mqa_d64", 1000, true, DilatedCombine::kHeadGroups);
  mqa.q_heads = 4;
  mqa.kv_heads = 1;
  mqa.head_dim = 64;
  mqa.branches = {{100, 3}, {1000, 7}};
  for (const Case& c : BothCombines(mqa)) cases.push_back(c);
  // Shorter than every segment.
  Case short_seq =
      Make("shorter_than_segments", 101, true, DilatedCombine::kLse);
  short_seq.head_dim = 64;
  cases.push_back(short_seq);
  // An odd head dim (our kernel's element-wise path, the merge's single
  // values).
  Case odd_dim = Make("odd_head_dim", 257, true, DilatedCombine::kLse);
  odd_dim.q_heads = odd_dim.kv_heads = 3;
  odd_dim.head_dim = 7;
  odd_dim.branches = {{16, 1}, {64, 4}};
  cases.push_back(odd_dim);
  // LongNet-sized segments at the default tiles.
  Case longnet =
      Make("longnet_default_tiles", 16411, true, DilatedCombine::kLse);
  longnet.q_heads = longnet.kv_heads = 4;
  longnet.branches = {{2048, 1}, {4096, 2}, {8192, 4}};
  longnet.sampled_rows = 64;
  cases.push_back(longnet);
  // The same strided, segment-batched calls on our Hopper kernel.
  for (Case c : {gqa, d80, tiled, longnet}) {
    c.name += "_own_kernel";
    c.own_kernel = true;
    cases.push_back(c);
  }
  ExpectAllMatch(cases, 1);
}

TEST(GpuDilatedTest, TwoGpuRingMatchesReference) {
  SKIP_WITHOUT_GPUS(2);
  std::vector<Case> cases;
  // Shards of 505 and 504 rows: segments [448, 512) and [0, 512) of the
  // branches span the boundary.
  Case gqa = Make("three_branches_gqa_d128", 1009, false, DilatedCombine::kLse);
  for (const Case& c : BothCombines(gqa)) cases.push_back(c);
  Case tiled =
      Make("tiled_batch2_d80", 1009, true, DilatedCombine::kHeadGroups);
  tiled.batch = 2;
  tiled.head_dim = 80;
  tiled.tile_q = 40;
  tiled.tile_kv = 24;
  cases.push_back(tiled);
  // Segments no shard boundary cuts (1024 = 2 x 512): no ring traffic.
  Case aligned = Make("aligned_segments", 1024, true, DilatedCombine::kLse);
  aligned.branches = {{64, 1}, {256, 2}, {512, 4}};
  cases.push_back(aligned);
  Case longnet =
      Make("longnet_default_tiles", 16411, true, DilatedCombine::kHeadGroups);
  longnet.q_heads = longnet.kv_heads = 4;
  longnet.branches = {{2048, 1}, {4096, 2}, {8192, 4}};
  longnet.sampled_rows = 64;
  cases.push_back(longnet);
  ExpectAllMatch(cases, 2);
}

}  // namespace
}  // namespace ringattn
