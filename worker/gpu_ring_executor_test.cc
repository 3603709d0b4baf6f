// GpuRingExecutor against the float64 reference
// (kernels/cpu/reference_attention.h) computed from the same 16-bit-rounded
// inputs: on one GPU (world size 1; dense and causal, GQA, odd lengths, head
// dims 64 / 80 / 128, bf16 and fp16, small tiles that force many LSE merges,
// unequal query and key lengths), as a two-rank NCCL ring with one thread
// per GPU (prime N, N < 2, causal zigzag), and as rings of two to five ranks
// sharing one GPU (OneGpuRing); block-sparse masks of every rule
// (local, global, dilated, random, explicit pairs leaving rows with no key),
// causal or not, odd lengths and block sizes, on one GPU and two. Fault tests:
// a rank whose peer stops taking part, or whose run is cancelled, fails within
// its timeout. Pass-Q (CreatePassQ) against the same reference on one GPU and
// two: dense and causal, prime N, N < 2, D = 80 and 128, Hq != Hkv,
// block-sparse and dilated, K/V read in place from resident context pieces of
// uneven sizes, and agreeing with pass-KV and broadcast-Q on the same inputs
// (each within the tolerance below of the other). Every run's output is
// poisoned with NaN on the device first, and no row may keep it.
// Tolerances: |O - O_ref| <= tol * (1 + |O_ref|) with tol 2e-2 (bf16) or
// 1e-2 (fp16), |LSE - LSE_ref| <= 1e-2 * (1 + |LSE_ref|), and rows that see
// no key exactly O = 0, LSE = -inf. Skips, saying why, where there are too
// few GPUs.

#include "worker/gpu_ring_executor.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "core/dtype.h"
#include "core/ring_plan.h"
#include "core/shard_layout.h"
#include "core/status_macros.h"
#include "gtest/gtest.h"
#include "kernels/cpu/merge_with_lse.h"
#include "kernels/cuda/device_buffer.h"
#include "worker/compute_dtype.h"
#include "worker/device.h"
#include "worker/device_context_store.h"
#include "worker/gpu_ring_testing.h"
#include "worker/gpu_test_skip.h"
#include "worker/nccl_communicator.h"
#include "worker/one_gpu_ring.h"
#include "worker/solo_communicator.h"

namespace ringattn {
namespace {

struct Case {
  std::string name;
  int64_t batch = 1;
  int64_t q_len = 0;
  int64_t kv_len = 0;
  int64_t q_heads = 4;
  int64_t kv_heads = 4;
  int64_t head_dim = 64;
  bool causal = false;
  DeviceDType dtype = DeviceDType::kBFloat16;
  int64_t tile_q = 16384;
  int64_t tile_kv = 16384;
  // Rows of the reference to check; 0: all of them.
  int64_t sampled_rows = 0;
  std::optional<BlockSparseRules> block_sparse;
  std::vector<DilatedBranch> dilated;
  DilatedCombine combine = DilatedCombine::kLse;
  // Pass-Q (CreatePassQ) rather than pass-KV.
  bool pass_q = false;
  // Tiles cuDNN would take run on our Hopper kernel (prefer_own_kernel).
  bool own_kernel = false;
  // How block-sparse tasks run.
  BlockSparseRoute route = BlockSparseRoute::kAuto;
  // Where set, every rank's K/V positions (a resident context's pieces), read
  // in place from device memory (resident_kv).
  std::optional<std::vector<std::vector<Range>>> resident_pieces;
  // Every rank on GPU 0, blocks handed between them by OneGpuRing, rather
  // than one GPU per rank over NCCL.
  bool one_gpu = false;
};

ReferenceProblem MakeProblem(const Case& c) {
  AttentionSpec spec;
  spec.batch = c.batch;
  spec.q_len = c.q_len;
  spec.kv_len = c.kv_len;
  spec.q_heads = c.q_heads;
  spec.kv_heads = c.kv_heads;
  spec.head_dim = c.head_dim;
  spec.causal = c.causal;
  spec.block_sparse = c.block_sparse;
  spec.dilated = c.dilated;
  spec.combine = c.combine;
  return MakeReferenceProblem(spec, c.dtype, c.sampled_rows);
}

struct RankResult {
  absl::Status status;
  Tensor<float> o;
  Tensor<float> lse;
  GpuRingStats stats;
  absl::Duration elapsed;
};

GpuRingConfig ConfigOf(const Case& c, int device) {
  GpuRingConfig config;
  config.device = device;
  config.dtype = c.dtype;
  config.tile_q_rows = c.tile_q;
  config.tile_kv_rows = c.tile_kv;
  config.resident_kv = c.resident_pieces.has_value();
  config.block_sparse_route = c.route;
  config.prefer_own_kernel = c.own_kernel;
  return config;
}

// `t` narrowed to `dtype` in a new device buffer (at least 2 bytes).
absl::StatusOr<DeviceBuffer> ToDevice(const Tensor<float>& t,
                                      DeviceDType dtype) {
  const int64_t count = t.shape().NumElements();
  std::vector<uint16_t> bits(static_cast<size_t>(std::max<int64_t>(count, 1)));
  ConvertFromFloat(HostDTypeOf(dtype), t.values().data(), bits.data(), count);
  absl::StatusOr<DeviceBuffer> buffer =
      DeviceBuffer::Allocate(sizeof(uint16_t) * bits.size());
  if (!buffer.ok()) return buffer.status();
  RINGATTN_RETURN_IF_ERROR(
      CudaStatus(cudaMemcpy(buffer->as<void>(), bits.data(),
                            sizeof(uint16_t) * count, cudaMemcpyHostToDevice),
                 "copying a test tensor to the device"));
  return buffer;
}

// Puts the rank's shard on the device: Upload, or for a resident context its
// K/V rows in device buffers of their own (UseResidentKv) and Q copied
// straight into device_q().
absl::Status LoadShard(const ReferenceProblem& p, const Case& c, int rank,
                       GpuRingExecutor& e) {
  const Tensor<float> q = GatherChunks(p.q, e.q_layout().Chunks(rank));
  const Tensor<float> k = GatherChunks(p.k, e.kv_layout().Chunks(rank));
  const Tensor<float> v = GatherChunks(p.v, e.kv_layout().Chunks(rank));
  if (!c.resident_pieces.has_value()) {
    return e.Upload(q.view(), k.view(), v.view());
  }
  absl::StatusOr<DeviceBuffer> device_q = ToDevice(q, c.dtype);
  if (!device_q.ok()) return device_q.status();
  RINGATTN_RETURN_IF_ERROR(
      CudaStatus(cudaMemcpy(e.device_q(), device_q->as<void>(),
                            sizeof(uint16_t) * q.shape().NumElements(),
                            cudaMemcpyDeviceToDevice),
                 "copying Q"));
  absl::StatusOr<DeviceBuffer> device_k = ToDevice(k, c.dtype);
  if (!device_k.ok()) return device_k.status();
  absl::StatusOr<DeviceBuffer> device_v = ToDevice(v, c.dtype);
  if (!device_v.ok()) return device_v.status();
  ResidentKv kv;
  kv.dtype = c.dtype;
  kv.k = device_k->as<void>();
  kv.v = device_v->as<void>();
  kv.rows = k.shape().seq;
  kv.batch_stride = k.shape().seq * k.shape().heads * k.shape().dim;
  kv.keep_alive = std::make_shared<std::pair<DeviceBuffer, DeviceBuffer>>(
      *std::move(device_k), *std::move(device_v));
  return e.UseResidentKv(std::move(kv));
}

// Loads rank `rank`'s shard of `p`, runs it over `communicator` and
// downloads the output.
RankResult RunRank(const ReferenceProblem& p, const Case& c, int rank,
                   int world_size, RingCommunicator& communicator,
                   const RingOptions& options) {
  RankResult result;
  const absl::Time start = absl::Now();
  const int device = c.one_gpu ? 0 : rank;
  std::optional<ShardLayout> kv_layout;
  if (c.resident_pieces.has_value()) {
    kv_layout = ShardLayout::FromChunks(c.kv_len, *c.resident_pieces);
  }
  absl::StatusOr<std::unique_ptr<GpuRingExecutor>> executor =
      c.pass_q ? GpuRingExecutor::CreatePassQ(p.spec, rank, world_size,
                                              ConfigOf(c, device), kv_layout)
               : GpuRingExecutor::Create(p.spec, rank, world_size,
                                         ConfigOf(c, device), kv_layout);
  if (!executor.ok()) {
    result.status = executor.status();
    return result;
  }
  GpuRingExecutor& e = **executor;
  result.status = LoadShard(p, c, rank, e);
  if (result.status.ok()) result.status = PoisonOutput(e);
  if (!result.status.ok()) return result;
  absl::StatusOr<GpuRingStats> stats = e.Run(communicator, options);
  result.elapsed = absl::Now() - start;
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

RingOptions TestOptions() {
  RingOptions options;
  options.step_timeout = absl::Seconds(60);
  return options;
}

// Runs the ring of `world_size` ranks, one thread and GPU each (all on GPU 0
// where c.one_gpu).
std::vector<RankResult> RunRing(const ReferenceProblem& p, const Case& c,
                                int world_size) {
  std::vector<RankResult> results(static_cast<size_t>(world_size));
  if (world_size == 1) {
    SoloCommunicator solo;
    results[0] = RunRank(p, c, 0, 1, solo, TestOptions());
    return results;
  }
  if (c.one_gpu) {
    OneGpuRing ring(world_size, /*device=*/0);
    std::vector<std::thread> threads;
    for (int rank = 0; rank < world_size; ++rank) {
      threads.emplace_back([&, rank] {
        results[rank] =
            RunRank(p, c, rank, world_size, ring.Rank(rank), TestOptions());
      });
    }
    for (std::thread& t : threads) t.join();
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
      results[rank] =
          RunRank(p, c, rank, world_size, **communicator, TestOptions());
    });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

// Runs `c` on `world_size` ranks and gathers every rank's rows into `o` and
// `lse` (of the full query shapes).
void RunAndAssemble(const ReferenceProblem& p, const Case& c, int world_size,
                    Tensor<float>& o, Tensor<float>& lse) {
  const std::vector<RankResult> results = RunRing(p, c, world_size);
  const ShardLayout q_layout = QueryLayoutFor(p.spec, world_size);
  o = Tensor<float>(p.q.shape());
  lse = Tensor<float>({c.batch, c.q_len, c.q_heads, 1});
  for (int r = 0; r < world_size; ++r) {
    ASSERT_TRUE(results[r].status.ok())
        << "rank " << r << ": " << results[r].status;
    ASSERT_EQ(FirstNaN(results[r].o, results[r].lse), "")
        << "rank " << r << " left it unwritten";
    ScatterChunks(results[r].o, q_layout.Chunks(r), o);
    ScatterChunks(results[r].lse, q_layout.Chunks(r), lse);
    const GpuRingStats& s = results[r].stats;
    std::printf(
        "  rank %d: %lld steps, %lld transfers, %lld tiles cuDNN, "
        "%lld ours, %lld work-list launches, %.3f ms computing, %.0f MiB "
        "pool\n",
        r, static_cast<long long>(s.ring.steps),
        static_cast<long long>(s.ring.transfers),
        static_cast<long long>(s.tiles.cudnn),
        static_cast<long long>(s.tiles.flash + s.tiles.hopper),
        static_cast<long long>(s.lists.total()), s.ring.compute_seconds * 1e3,
        s.ring.peak_bytes / 1048576.0);
    // A forced route is the only one block-sparse tasks take.
    if (c.block_sparse.has_value() && c.route == BlockSparseRoute::kWorkList) {
      EXPECT_EQ(s.tiles.total(), 0) << "rank " << r;
    }
    if (c.route == BlockSparseRoute::kRectangles) {
      EXPECT_EQ(s.lists.total(), 0) << "rank " << r;
    }
  }
}

double ToleranceOf(const Case& c) {
  return c.dtype == DeviceDType::kBFloat16 ? 2e-2 : 1e-2;
}

void ExpectMatchesReference(const Case& c, int world_size) {
  SCOPED_TRACE(absl::StrCat(c.name, c.pass_q ? " (pass-Q)" : "", ", ",
                            DeviceDTypeName(c.dtype), ", ", world_size,
                            " rank(s)"));
  const ReferenceProblem p = MakeProblem(c);
  Tensor<float> o;
  Tensor<float> lse;
  ASSERT_NO_FATAL_FAILURE(RunAndAssemble(p, c, world_size, o, lse));
  const double tol = ToleranceOf(c);
  ReferenceError error;
  ASSERT_NO_FATAL_FAILURE(CompareWithReference(p, o, lse, &error));
  EXPECT_LE(error.worst, tol) << error.where;
  std::printf("  worst |O - O_ref| / (1 + |O_ref|) = %.2e (tolerance %.0e)\n",
              error.worst, tol);
}

Case Make(std::string name, int64_t q_len, int64_t kv_len, bool causal) {
  Case c;
  c.name = std::move(name);
  c.q_len = q_len;
  c.kv_len = kv_len;
  c.causal = causal;
  return c;
}

// ExpectMatchesReference for each case in bf16 and in fp16.
void ExpectMatchesReferenceInBothDtypes(const std::vector<Case>& cases,
                                        int world_size) {
  for (const Case& base : cases) {
    for (const DeviceDType dtype :
         {DeviceDType::kBFloat16, DeviceDType::kFloat16}) {
      Case c = base;
      c.dtype = dtype;
      ExpectMatchesReference(c, world_size);
    }
  }
}

// Causal GQA of 4099 tokens at D=128 cut into many small tiles.
Case TiledGqa(std::string name) {
  Case c = Make(std::move(name), 4099, 4099, true);
  c.q_heads = 8;
  c.kv_heads = 2;
  c.head_dim = 128;
  c.tile_q = 512;
  c.tile_kv = 700;
  c.sampled_rows = 300;
  return c;
}

std::vector<Case> OneGpuCases() {
  std::vector<Case> cases;
  cases.push_back(Make("dense", 257, 257, false));
  Case causal = Make("causal_d128", 257, 257, true);
  causal.head_dim = 128;
  cases.push_back(causal);
  Case gqa = Make("causal_gqa_d128", 300, 300, true);
  gqa.q_heads = 8;
  gqa.kv_heads = 2;
  gqa.head_dim = 128;
  cases.push_back(gqa);
  Case d80 = Make("dense_mqa_d80", 131, 131, false);
  d80.q_heads = 4;
  d80.kv_heads = 1;
  d80.head_dim = 80;
  cases.push_back(d80);
  Case tiled = Make("causal_tiled_batch2", 1001, 1001, true);
  tiled.batch = 2;
  tiled.tile_q = 128;
  tiled.tile_kv = 96;
  cases.push_back(tiled);
  Case dense_tiled = Make("dense_tiled", 999, 999, false);
  dense_tiled.tile_q = 200;
  dense_tiled.tile_kv = 333;
  cases.push_back(dense_tiled);
  Case continuation = Make("causal_fewer_queries", 100, 333, true);
  continuation.tile_q = 64;
  continuation.tile_kv = 64;
  cases.push_back(continuation);
  Case more_queries = Make("causal_more_queries", 333, 100, true);
  more_queries.tile_q = 64;
  more_queries.tile_kv = 64;
  cases.push_back(more_queries);
  cases.push_back(Make("one_token", 1, 1, true));
  Case one_tile = Make("causal_one_tile_of_16k", 16384, 16384, true);
  one_tile.q_heads = one_tile.kv_heads = 2;
  one_tile.head_dim = 128;
  one_tile.sampled_rows = 64;
  cases.push_back(one_tile);
  Case long_case = Make("causal_default_tiles", 20000, 20000, true);
  long_case.q_heads = long_case.kv_heads = 2;
  long_case.sampled_rows = 64;
  cases.push_back(long_case);
  return cases;
}

BlockSparseRules Rules(int64_t block_size) {
  BlockSparseRules rules;
  rules.block_size = block_size;
  return rules;
}

Case Sparse(std::string name, int64_t n, bool causal, BlockSparseRules rules) {
  Case c = Make(std::move(name), n, n, causal);
  c.block_sparse = std::move(rules);
  return c;
}

std::vector<Case> OneGpuBlockSparseCases() {
  std::vector<Case> cases;
  BlockSparseRules local = Rules(64);  // 1001 = 15 * 64 + 41
  local.local = 1;
  Case local_causal =
      Sparse("sparse_local_causal_gqa_tiled", 1001, true, local);
  local_causal.q_heads = 8;
  local_causal.kv_heads = 2;
  local_causal.head_dim = 128;
  local_causal.tile_q = 128;
  local_causal.tile_kv = 96;
  cases.push_back(local_causal);
  BlockSparseRules global_random = Rules(37);
  global_random.global = 1;
  global_random.random = 2;
  global_random.seed = 42;
  Case dense = Sparse("sparse_global_random_batch2", 999, false, global_random);
  dense.batch = 2;
  cases.push_back(dense);
  BlockSparseRules dilated = Rules(33);
  dilated.dilated = 3;
  Case strided = Sparse("sparse_dilated_rule_causal", 513, true, dilated);
  strided.tile_q = strided.tile_kv = 64;
  cases.push_back(strided);
  // Query blocks 1, 3 and 4 allow no key block, and causal hides (2, 4):
  // their rows must come out O = 0, LSE = -inf.
  BlockSparseRules pairs = Rules(50);
  pairs.pairs = {{0, 0}, {2, 1}, {2, 4}, {5, 5}, {5, 0}};
  cases.push_back(Sparse("sparse_pairs_causal_empty_rows", 300, true, pairs));
  cases.push_back(Sparse("sparse_pairs_dense_empty_rows", 300, false, pairs));
  BlockSparseRules band = Rules(16);
  band.local = 2;
  Case mqa = Sparse("sparse_local_mqa_d80", 131, false, band);
  mqa.kv_heads = 1;
  mqa.head_dim = 80;
  cases.push_back(mqa);
  BlockSparseRules big_blocks = Rules(2048);
  big_blocks.local = 1;
  big_blocks.global = 1;
  Case long_case =
      Sparse("sparse_local_global_default_tiles", 20000, true, big_blocks);
  long_case.q_heads = long_case.kv_heads = 2;
  long_case.sampled_rows = 64;
  cases.push_back(long_case);
  return cases;
}

// Each case through both routes of block-sparse tasks.
std::vector<Case> OnBothRoutes(const std::vector<Case>& cases) {
  std::vector<Case> out;
  for (const BlockSparseRoute route :
       {BlockSparseRoute::kWorkList, BlockSparseRoute::kRectangles}) {
    for (Case c : cases) {
      c.route = route;
      c.name += route == BlockSparseRoute::kWorkList ? "_lists" : "_rectangles";
      out.push_back(std::move(c));
    }
  }
  return out;
}

TEST(GpuRingExecutorTest, OneGpuBlockSparseMatchesReferenceOnBothRoutes) {
  SKIP_WITHOUT_GPUS(1);
  ExpectMatchesReferenceInBothDtypes(OnBothRoutes(OneGpuBlockSparseCases()), 1);
}

// The load run's request that ran into its deadline (thirty-first session): a
// causal pattern of 16-row blocks over 5789 tokens at D=57, which our Hopper
// kernel does not take, is 21663 rectangle tiles, which the executor used to
// join pairwise for about 40 s before computing. It plans at once now.
TEST(GpuRingExecutorTest, BlockSparseOfManySmallBlocksMatchesReference) {
  SKIP_WITHOUT_GPUS(1);
  BlockSparseRules rules = Rules(16);
  rules.local = 2;
  rules.dilated = 3;
  rules.random = 2;
  rules.seed = 4004344075u;
  Case c = Sparse("sparse_many_small_blocks_d57", 5789, true, rules);
  c.q_heads = c.kv_heads = 1;
  c.head_dim = 57;
  c.sampled_rows = 64;
  ExpectMatchesReference(c, 1);
}

// Block-sparse cases both ring strategies run on two GPUs: a causal local
// band over a prime length, and explicit block pairs with small tiles.
std::vector<Case> TwoGpuBlockSparseCases() {
  std::vector<Case> cases;
  BlockSparseRules local = Rules(61);
  local.local = 1;
  cases.push_back(Sparse("sparse_local_causal_prime", 997, true, local));
  BlockSparseRules pairs = Rules(40);  // 11 blocks, the last of 1 position
  pairs.pairs = {{0, 0}, {3, 1}, {3, 2}, {6, 9}, {9, 6}, {10, 0}, {10, 10}};
  Case explicit_pairs = Sparse("sparse_pairs_causal_tiled", 401, true, pairs);
  explicit_pairs.tile_q = 64;
  explicit_pairs.tile_kv = 48;
  cases.push_back(explicit_pairs);
  return cases;
}

TEST(GpuRingExecutorTest, TwoGpuRingBlockSparseMatchesReferenceOnBothRoutes) {
  SKIP_WITHOUT_GPUS(2);
  std::vector<Case> cases = TwoGpuBlockSparseCases();
  BlockSparseRules random = Rules(50);
  random.global = 1;
  random.random = 3;
  random.seed = 9;
  cases.push_back(Sparse("sparse_global_random_prime", 997, false, random));
  BlockSparseRules mixed = Rules(128);
  mixed.local = 2;
  mixed.dilated = 5;
  Case gqa = Sparse("sparse_local_dilated_gqa_tiled", 4099, true, mixed);
  gqa.q_heads = 8;
  gqa.kv_heads = 2;
  gqa.head_dim = 128;
  gqa.tile_q = 512;
  gqa.tile_kv = 700;
  gqa.sampled_rows = 300;
  cases.push_back(gqa);
  ExpectMatchesReferenceInBothDtypes(OnBothRoutes(cases), 2);
}

TEST(GpuRingExecutorTest, OneGpuMatchesReference) {
  SKIP_WITHOUT_GPUS(1);
  ExpectMatchesReferenceInBothDtypes(OneGpuCases(), 1);
}

TEST(GpuRingExecutorTest, TwoGpuRingMatchesReference) {
  SKIP_WITHOUT_GPUS(2);
  std::vector<Case> cases;
  cases.push_back(Make("dense_prime", 997, 997, false));
  cases.push_back(Make("causal_prime", 997, 997, true));
  cases.push_back(Make("dense_one_token", 1, 1, false));
  cases.push_back(Make("causal_one_token", 1, 1, true));
  cases.push_back(TiledGqa("causal_gqa_tiled"));
  Case continuation = Make("causal_fewer_queries", 301, 1000, true);
  continuation.head_dim = 128;
  cases.push_back(continuation);
  Case big = Make("causal_default_tiles", 40000, 40000, true);
  big.q_heads = big.kv_heads = 2;
  big.head_dim = 128;
  big.sampled_rows = 64;
  cases.push_back(big);
  ExpectMatchesReferenceInBothDtypes(cases, 2);
}

// Rings of two to five ranks sharing one GPU, so that a one-GPU machine
// checks the multi-rank ring loop: each step's kernels enqueued behind the
// last step's, a receive into a block buffer only once the step computing on
// it is done (three ranks and more), the first tile of each row storing into
// accumulators never cleared (zigzag causal, dense), and the clear where that
// cannot be (rows that see no key).
TEST(GpuRingExecutorTest, RanksSharingOneGpuMatchReference) {
  SKIP_WITHOUT_GPUS(1);
  struct Ring {
    Case c;
    int world_size;
  };
  std::vector<Ring> rings;
  rings.push_back({Make("causal_prime", 997, 997, true), 3});
  rings.push_back({Make("dense_prime", 997, 997, false), 4});
  rings.push_back({Make("causal_fewer_queries", 301, 1000, true), 5});
  rings.push_back({Make("causal_more_queries", 1000, 301, true), 2});
  Case small_tiles = Make("causal_small_tiles", 4099, 4099, true);
  small_tiles.tile_q = small_tiles.tile_kv = 512;
  rings.push_back({small_tiles, 3});
  // Rings on our Hopper kernel (own_kernel): `q_heads` on `kv_heads` at
  // `head_dim`, square tiles of `tile` rows.
  const auto own_kernel = [](std::string name, int64_t len, bool causal,
                             int64_t head_dim, int64_t q_heads,
                             int64_t kv_heads, int64_t tile) {
    Case c = Make(std::move(name), len, len, causal);
    c.head_dim = head_dim;
    c.q_heads = q_heads;
    c.kv_heads = kv_heads;
    c.own_kernel = true;
    c.tile_q = c.tile_kv = tile;
    return c;
  };
  rings.push_back(
      {own_kernel("causal_own_kernel", 3001, true, 128, 4, 4, 1024), 2});
  rings.push_back(
      {own_kernel("causal_own_kernel_d64", 3001, true, 64, 4, 4, 1024), 3});
  rings.push_back(
      {own_kernel("dense_own_kernel_gqa", 2503, false, 128, 8, 2, 1024), 3});
  rings.push_back(
      {own_kernel("causal_own_kernel_gqa_d96", 2999, true, 96, 8, 2, 1024), 3});
  rings.push_back(
      {own_kernel("dense_own_kernel_d80", 2011, false, 80, 4, 4, 768), 2});
  for (Ring& ring : rings) {
    ring.c.one_gpu = true;
    ExpectMatchesReferenceInBothDtypes({ring.c}, ring.world_size);
  }
}

// Query rows of more than two tiles on our kernel, cut in whole waves of
// thread blocks (on 132 SMs with 4 heads: at D=128 tiles of 4224 rows, 4224,
// 4224 and 553 of 9001; at D=64, of three consumers' 192 rows, 6336, 6336 and
// 2329 of 15001; other SM counts cut otherwise, or evenly).
TEST(GpuRingExecutorTest, WholeWaveTilesMatchReference) {
  SKIP_WITHOUT_GPUS(1);
  std::vector<Case> cases = {Make("causal_whole_waves", 9001, 9001, true),
                             Make("dense_whole_waves", 9001, 9001, false)};
  for (Case& c : cases) {
    c.head_dim = 128;
    c.tile_q = 4224;
  }
  Case d64 = Make("causal_whole_waves_d64", 15001, 15001, true);
  d64.tile_q = 6336;
  cases.push_back(d64);
  for (Case& c : cases) {
    c.own_kernel = true;
    c.sampled_rows = 64;
  }
  ExpectMatchesReferenceInBothDtypes(cases, 1);
}

// A causal request of 64K tokens, 32 heads, D=128.
AttentionSpec CausalD128Request() {
  AttentionSpec spec;
  spec.q_len = spec.kv_len = 1 << 16;
  spec.q_heads = spec.kv_heads = 32;
  spec.head_dim = 128;
  spec.causal = true;
  return spec;
}

TEST(TunedRingConfig, OurKernelOnLargeTilesForDenseAndCausalAtItsHeadDims) {
  const AttentionSpec spec = CausalD128Request();
  AttentionSpec d64 = spec;
  d64.head_dim = 64;
  d64.causal = false;
  AttentionSpec d80 = spec;
  d80.head_dim = 80;
  AttentionSpec d96 = spec;
  d96.head_dim = 96;
  d96.causal = false;
  for (const AttentionSpec& taken : {spec, d64, d80, d96}) {
    const GpuRingConfig tuned = TunedRingConfig(taken, GpuRingConfig());
    EXPECT_TRUE(tuned.prefer_own_kernel);
    EXPECT_EQ(tuned.tile_q_rows, 32768);
    EXPECT_EQ(tuned.tile_kv_rows, 131072);
  }
  AttentionSpec d112 = spec;
  d112.head_dim = 112;
  AttentionSpec sparse = spec;
  sparse.block_sparse = BlockSparseRules{.block_size = 4096, .local = 1};
  AttentionSpec dilated_d64 = d64;
  dilated_d64.dilated = {{4096, 1}};
  for (const AttentionSpec& other : {d112, sparse, dilated_d64}) {
    const GpuRingConfig kept = TunedRingConfig(other, GpuRingConfig());
    EXPECT_FALSE(kept.prefer_own_kernel);
    EXPECT_EQ(kept.tile_q_rows, GpuRingConfig().tile_q_rows);
    EXPECT_EQ(kept.tile_kv_rows, GpuRingConfig().tile_kv_rows);
  }
}

TEST(TunedRingConfig, OurKernelOnDefaultTilesForDilatedAtD128) {
  AttentionSpec spec = CausalD128Request();
  spec.dilated = {{4096, 1}, {16384, 4}};
  const GpuRingConfig tuned = TunedRingConfig(spec, GpuRingConfig());
  EXPECT_TRUE(tuned.prefer_own_kernel);
  EXPECT_EQ(tuned.tile_q_rows, GpuRingConfig().tile_q_rows);
  EXPECT_EQ(tuned.tile_kv_rows, GpuRingConfig().tile_kv_rows);
}

// The ring as the worker runs dense and causal D=128 requests: our Hopper
// kernel on every tile, merged by LSE across tiles and ranks.
TEST(GpuRingExecutorTest, TwoGpuRingOnOurKernelMatchesReference) {
  SKIP_WITHOUT_GPUS(2);
  std::vector<Case> cases = {TiledGqa("causal_gqa_tiled_own"),
                             Make("dense_prime_own", 997, 997, false),
                             Make("causal_fewer_queries_own", 301, 1000, true)};
  for (Case& c : cases) {
    c.head_dim = 128;
    c.own_kernel = true;
  }
  ExpectMatchesReferenceInBothDtypes(cases, 2);
}

TEST(GpuRingExecutorTest, TakesDilatedAndBlockSparseSpecs) {
  // NOT_FOUND where there is no GPU; never UNIMPLEMENTED.
  AttentionSpec spec;
  spec.q_len = spec.kv_len = 64;
  spec.q_heads = spec.kv_heads = 1;
  spec.head_dim = 64;
  spec.dilated = {{16, 2}};
  EXPECT_NE(
      GpuRingExecutor::Create(spec, 0, 1, GpuRingConfig()).status().code(),
      absl::StatusCode::kUnimplemented);
  spec.dilated.clear();
  BlockSparseRules rules;
  rules.block_size = 16;
  rules.local = 1;
  spec.block_sparse = rules;
  EXPECT_NE(
      GpuRingExecutor::Create(spec, 0, 1, GpuRingConfig()).status().code(),
      absl::StatusCode::kUnimplemented);
}

// Dispatchers made ahead serve the next executors, which give them back.
TEST(GpuRingExecutorTest, PreparedDispatchersServeTheNextExecutors) {
  SKIP_WITHOUT_GPUS(1);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  const int idle = PrepareDispatchers(0, 2);
  EXPECT_GE(idle, 2);
  EXPECT_EQ(PrepareDispatchers(0, 1), idle);
  AttentionSpec spec;
  spec.q_len = spec.kv_len = 64;
  spec.q_heads = spec.kv_heads = 1;
  spec.head_dim = 64;
  {
    absl::StatusOr<std::unique_ptr<GpuRingExecutor>> executor =
        GpuRingExecutor::Create(spec, 0, 1, GpuRingConfig());
    ASSERT_TRUE(executor.ok()) << executor.status();
    EXPECT_EQ(PrepareDispatchers(0, 0), idle - 1);
  }
  EXPECT_EQ(PrepareDispatchers(0, 0), idle);
}

// Rank 1 joins the communicator but leaves without taking part in the ring:
// rank 0 must fail within its step timeout instead of hanging.
TEST(GpuRingExecutorTest, PeerThatLeavesFailsTheOtherRankInTime) {
  SKIP_WITHOUT_GPUS(2);
  Case c = Make("dense", 4096, 4096, false);
  const ReferenceProblem p = MakeProblem(c);
  const absl::StatusOr<ncclUniqueId> id = NewNcclUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  RingOptions options;
  options.step_timeout = absl::Seconds(3);
  RankResult rank0;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      absl::StatusOr<std::unique_ptr<NcclCommunicator>> communicator =
          NcclCommunicator::Create(*id, rank, 2, rank, absl::Seconds(60));
      if (rank == 1) {
        if (communicator.ok()) (*communicator)->Abort();
        return;  // the communicator goes away, aborted
      }
      if (!communicator.ok()) {
        rank0.status = communicator.status();
        return;
      }
      rank0 = RunRank(p, c, 0, 2, **communicator, options);
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_FALSE(rank0.status.ok());
  EXPECT_TRUE(absl::IsDeadlineExceeded(rank0.status) ||
              absl::IsUnavailable(rank0.status))
      << rank0.status;
  EXPECT_LT(rank0.elapsed, absl::Seconds(3 + 10));
}

// A run whose cancel flag is already set stops with CANCELLED.
void ExpectCancelledRunStops(Case c) {
  c.tile_q = c.tile_kv = 256;
  const ReferenceProblem p = MakeProblem(c);
  std::atomic<bool> cancelled{true};
  RingOptions options = TestOptions();
  options.cancelled = &cancelled;
  SoloCommunicator solo;
  const RankResult result = RunRank(p, c, 0, 1, solo, options);
  EXPECT_EQ(result.status.code(), absl::StatusCode::kCancelled)
      << result.status;
}

TEST(GpuRingExecutorTest, CancelledRunStops) {
  SKIP_WITHOUT_GPUS(1);
  ExpectCancelledRunStops(Make("causal", 2048, 2048, true));
}

// --- Pass-Q (CreatePassQ) ---

Case PassQ(Case c) {
  c.pass_q = true;
  return c;
}

Case WithHeads(Case c, int64_t q_heads, int64_t kv_heads, int64_t head_dim) {
  c.q_heads = q_heads;
  c.kv_heads = kv_heads;
  c.head_dim = head_dim;
  return c;
}

void ExpectPassQMatchesReference(const std::vector<Case>& cases,
                                 int world_size) {
  std::vector<Case> pass_q;
  for (const Case& base : cases) pass_q.push_back(PassQ(base));
  ExpectMatchesReferenceInBothDtypes(pass_q, world_size);
}

TEST(GpuPassQTest, GpuPassQMatchesReferenceOnOneGpu) {
  SKIP_WITHOUT_GPUS(1);
  std::vector<Case> cases;
  cases.push_back(
      WithHeads(Make("dense_prime_d80_gqa", 257, 257, false), 8, 2, 80));
  cases.push_back(
      WithHeads(Make("causal_prime_d128_mqa", 257, 257, true), 4, 1, 128));
  Case tiled = Make("causal_tiled_batch2", 1001, 1001, true);
  tiled.batch = 2;
  tiled.tile_q = 128;
  tiled.tile_kv = 96;
  cases.push_back(tiled);
  Case continuation =
      WithHeads(Make("causal_fewer_queries_d80", 100, 333, true), 8, 2, 80);
  continuation.tile_q = continuation.tile_kv = 64;
  cases.push_back(continuation);
  cases.push_back(Make("one_token", 1, 1, true));
  ExpectPassQMatchesReference(cases, 1);
}

TEST(GpuPassQTest, GpuPassQMatchesReferenceForPrimeLengthOnTwoGpus) {
  SKIP_WITHOUT_GPUS(2);
  std::vector<Case> cases;
  cases.push_back(
      WithHeads(Make("dense_prime_d80_gqa", 997, 997, false), 8, 2, 80));
  cases.push_back(
      WithHeads(Make("causal_prime_d128_gqa", 997, 997, true), 8, 2, 128));
  cases.push_back(
      WithHeads(Make("causal_prime_d80_mqa", 331, 331, true), 4, 1, 80));
  // Fewer positions than ranks: one rank's query block is empty and never
  // travels.
  cases.push_back(Make("dense_one_token", 1, 1, false));
  cases.push_back(Make("causal_one_token", 1, 1, true));
  Case gqa = WithHeads(Make("causal_gqa_tiled", 4099, 4099, true), 8, 2, 128);
  gqa.tile_q = 512;
  gqa.tile_kv = 700;
  gqa.sampled_rows = 300;
  cases.push_back(gqa);
  Case continuation =
      WithHeads(Make("causal_fewer_queries", 301, 1000, true), 8, 2, 128);
  continuation.tile_q = continuation.tile_kv = 64;
  cases.push_back(continuation);
  Case more = Make("dense_more_queries_batch2", 333, 101, false);
  more.batch = 2;
  cases.push_back(more);
  ExpectPassQMatchesReference(cases, 2);
}

TEST(GpuPassQTest, GpuPassQRunsBlockSparseOnBothRoutesAndDilatedOnTwoGpus) {
  SKIP_WITHOUT_GPUS(2);
  std::vector<Case> cases = OnBothRoutes(TwoGpuBlockSparseCases());
  Case dilated = Make("dilated_lse_causal_prime", 1009, 1009, true);
  dilated.dilated = {{64, 1}, {256, 2}};
  cases.push_back(dilated);
  Case groups =
      WithHeads(Make("dilated_head_groups_dense", 1001, 1001, false), 6, 2, 64);
  groups.dilated = {{128, 1}, {512, 4}};
  groups.combine = DilatedCombine::kHeadGroups;
  cases.push_back(groups);
  ExpectPassQMatchesReference(cases, 2);
}

// A resident context held in pieces of uneven sizes (rank 0 holds two
// non-adjacent pieces, one a single row), read in place by pass-Q and copied
// into the ring's blocks by pass-KV; causal continuations and a dense query.
TEST(GpuPassQTest, GpuPassQReadsUnevenResidentContextPiecesInPlace) {
  SKIP_WITHOUT_GPUS(1);
  const int world_size = CudaDeviceCount() >= 2 ? 2 : 1;
  const int64_t kv_len = 2003;
  std::vector<std::vector<Range>> pieces =
      world_size == 2
          ? std::vector<std::vector<Range>>{{Range{0, 700}, Range{1500, 1501}},
                                            {Range{700, 1500},
                                             Range{1501, kv_len}}}
          : std::vector<std::vector<Range>>{{Range{0, kv_len}}};
  std::vector<Case> cases;
  cases.push_back(
      WithHeads(Make("context_causal_300_d80", 300, kv_len, true), 8, 2, 80));
  cases.push_back(
      WithHeads(Make("context_causal_17_d128", 17, kv_len, true), 8, 2, 128));
  cases.push_back(
      WithHeads(Make("context_dense_64_d128", 64, kv_len, false), 4, 1, 128));
  for (Case c : cases) {
    c.resident_pieces = pieces;
    for (const bool pass_q : {true, false}) {
      c.pass_q = pass_q;
      ExpectMatchesReference(c, world_size);
    }
  }
}

// Broadcast-Q on `world_size` ranks, one GPU each in turn: every rank's
// partial (O, LSE) over its K/V, merged by LSE on the host.
void RunBroadcastAndMerge(const ReferenceProblem& p, const Case& c,
                          int world_size, Tensor<float>& o,
                          Tensor<float>& lse) {
  o = Tensor<float>(p.q.shape());
  lse = Tensor<float>({c.batch, c.q_len, c.q_heads, 1});
  std::fill(o.values().begin(), o.values().end(), 0.0f);
  std::fill(lse.values().begin(), lse.values().end(), -INFINITY);
  for (int r = 0; r < world_size; ++r) {
    absl::StatusOr<std::unique_ptr<GpuRingExecutor>> executor =
        GpuRingExecutor::CreateBroadcast(p.spec, r, world_size, ConfigOf(c, r));
    ASSERT_TRUE(executor.ok()) << executor.status();
    GpuRingExecutor& e = **executor;
    const Tensor<float> k = GatherChunks(p.k, e.kv_layout().Chunks(0));
    const Tensor<float> v = GatherChunks(p.v, e.kv_layout().Chunks(0));
    ASSERT_TRUE(e.Upload(p.q.view(), k.view(), v.view()).ok());
    ASSERT_TRUE(PoisonOutput(e).ok());
    SoloCommunicator solo;
    const absl::StatusOr<GpuRingStats> stats = e.Run(solo, TestOptions());
    ASSERT_TRUE(stats.ok()) << stats.status();
    Tensor<float> part_o(p.q.shape());
    Tensor<float> part_lse({c.batch, c.q_len, c.q_heads, 1});
    ASSERT_TRUE(e.Download(part_o.view(), part_lse.view()).ok());
    ASSERT_EQ(FirstNaN(part_o, part_lse), "") << "rank " << r;
    MergeWithLse(o.view(), lse.view(), part_o.view(), part_lse.view());
  }
}

// |a - b| <= tol * (1 + |b|) for O and LSE; rows b leaves without a key are
// so in a too.
void ExpectAgree(const std::string& what, const Tensor<float>& o,
                 const Tensor<float>& lse, const Tensor<float>& o_other,
                 const Tensor<float>& lse_other, double tol) {
  SCOPED_TRACE(what);
  for (size_t i = 0; i < lse.values().size(); ++i) {
    const double want = lse_other.values()[i];
    if (std::isinf(want)) {
      ASSERT_EQ(lse.values()[i], -INFINITY) << "row " << i;
      continue;
    }
    ASSERT_NEAR(lse.values()[i], want, tol * (1 + std::fabs(want)))
        << "LSE row " << i;
  }
  double worst = 0;
  for (size_t i = 0; i < o.values().size(); ++i) {
    const double want = o_other.values()[i];
    ASSERT_FALSE(std::isnan(o.values()[i])) << i;
    worst = std::max(worst,
                     std::fabs(o.values()[i] - want) / (1 + std::fabs(want)));
  }
  EXPECT_LE(worst, tol);
  std::printf("  %s: worst relative difference %.2e\n", what.c_str(), worst);
}

TEST(GpuPassQTest, GpuPassQAgreesWithPassKvAndBroadcastQ) {
  SKIP_WITHOUT_GPUS(1);
  const int world_size = CudaDeviceCount() >= 2 ? 2 : 1;
  std::vector<Case> cases;
  cases.push_back(
      WithHeads(Make("causal_continuation_d128", 333, 1009, true), 8, 2, 128));
  cases.push_back(
      WithHeads(Make("dense_prime_d80_mqa", 257, 257, false), 4, 1, 80));
  for (const Case& base : cases) {
    SCOPED_TRACE(absl::StrCat(base.name, ", ", world_size, " rank(s)"));
    const ReferenceProblem p = MakeProblem(base);
    Tensor<float> o_q, lse_q, o_kv, lse_kv, o_b, lse_b;
    ASSERT_NO_FATAL_FAILURE(
        RunAndAssemble(p, PassQ(base), world_size, o_q, lse_q));
    ASSERT_NO_FATAL_FAILURE(RunAndAssemble(p, base, world_size, o_kv, lse_kv));
    ASSERT_NO_FATAL_FAILURE(
        RunBroadcastAndMerge(p, base, world_size, o_b, lse_b));
    ExpectAgree("pass-Q vs pass-KV", o_q, lse_q, o_kv, lse_kv,
                ToleranceOf(base));
    ExpectAgree("pass-Q vs broadcast-Q", o_q, lse_q, o_b, lse_b,
                ToleranceOf(base));
  }
}

TEST(GpuPassQTest, GpuPassQCancelledRunStops) {
  SKIP_WITHOUT_GPUS(1);
  ExpectCancelledRunStops(PassQ(Make("causal", 2048, 2048, true)));
}

TEST(GpuPassQTest, PassQPoolHoldsTwoQueryBlocksAndOnlyTheOwnKv) {
  // Pass-Q moves query blocks, not K/V: for a short query batch against a
  // long context its pool is far smaller than pass-KV's, and reading a
  // resident context in place it holds no K/V at all.
  AttentionSpec spec;
  spec.q_len = 512;
  spec.kv_len = 1 << 20;
  spec.q_heads = 32;
  spec.kv_heads = 8;
  spec.head_dim = 128;
  spec.causal = true;
  GpuRingConfig config;
  const int64_t pass_kv =
      GpuRingExecutor::DeviceBytesNeeded(spec, 0, 2, config);
  const int64_t pass_q =
      GpuRingExecutor::PassQDeviceBytesNeeded(spec, 0, 2, config);
  // pass-KV: two K/V blocks of 512K rows; pass-Q: one.
  EXPECT_LT(pass_q, pass_kv * 6 / 10);
  config.resident_kv = true;
  const int64_t in_place =
      GpuRingExecutor::PassQDeviceBytesNeeded(spec, 0, 2, config);
  // Two blocks of 256 rows [Q | O | LSE] and one tile's scratch.
  const int64_t row_heads = 256 * 32;
  EXPECT_LE(in_place, 2 * row_heads * (2 * 128 + 4 * 128 + 4) +
                          row_heads * (2 * 128 + 4) + 16 * 256);
}

}  // namespace
}  // namespace ringattn
