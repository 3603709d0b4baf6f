// Ring attention on 1..G GPUs of this machine in one process: a thread per
// GPU, each rank a GpuRingExecutor, the ring over NCCL. bf16, batch 1, Hq =
// Hkv = 32 heads unless --heads and --kv_heads say otherwise (GQA), head_dim
// 128, dense and causal, the lengths asked for.
// Prints a markdown table: time of one attention (the slowest rank, median
// over the timed runs), TFLOP/s per GPU (4 * N^2 * H * D per dense attention,
// half of it causal, divided by the GPUs), the executor's device pool per GPU
// and the device memory in use per GPU (pool, cuDNN workspace, NCCL buffers
// and the CUDA context), the share of tiles cuDNN computed, and the step time
// not spent computing (transfers not hidden behind compute, launch gaps).
// With --skip_transfers every multi-GPU case runs a second time with each
// transfer replaced by a copy on the rank's own GPU (same tiles, real data):
// the difference is what communication costs the ring.
// With --ranks_alone a GPU count above this machine's runs as such local
// copies too, each rank in turn alone on cuda:0: what every GPU of that ring
// would compute with its transfers hidden, measured on one GPU.
//
//   ring_bench [--gpus=1,2] [--lengths=65536,262144] [--masks=dense,causal]
//              [--long_lengths=1M] [--skip_transfers] [--ranks_alone]
//              [--iterations=3] [--seconds=20]

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "client/cli_request.h"
#include "core/attention_spec.h"
#include "core/dtype.h"
#include "kernels/cuda/device_buffer.h"
#include "worker/communicator.h"
#include "worker/device.h"
#include "worker/gpu_ring_executor.h"
#include "worker/nccl_communicator.h"

ABSL_FLAG(std::vector<std::string>, gpus, (std::vector<std::string>{"1", "2"}),
          "GPU counts to run the ring on; counts above this machine's are "
          "reported and skipped");
ABSL_FLAG(std::vector<std::string>, lengths,
          (std::vector<std::string>{"65536", "262144"}),
          "sequence lengths N (queries = keys = N); suffixes K and M allowed");
ABSL_FLAG(std::vector<std::string>, masks,
          (std::vector<std::string>{"dense", "causal"}),
          "dense, causal, sparse (causal block-sparse: a window of "
          "tile-sized blocks and the first block) and/or dilated (causal "
          "LongNet branches, --dilated, LSE-merged)");
ABSL_FLAG(std::string, dilated, "4096:1,16384:4,65536:16",
          "the dilated mask's branches as W:R,W:R,... (segment length W, "
          "dilation R), as for `ringattn attend --dilated`");
ABSL_FLAG(int32_t, heads, 32, "query heads");
ABSL_FLAG(std::optional<int32_t>, kv_heads, std::nullopt,
          "key/value heads, dividing --heads (GQA; default: --heads)");
ABSL_FLAG(int32_t, head_dim, 128, "head dimension");
ABSL_FLAG(std::optional<int64_t>, tile_q, std::nullopt,
          "query rows per tile (default: TunedRingConfig's)");
ABSL_FLAG(std::optional<int64_t>, tile_kv, std::nullopt,
          "key rows per tile (default: TunedRingConfig's)");
ABSL_FLAG(int64_t, sparse_block, 16384,
          "block size of the sparse mask in tokens");
ABSL_FLAG(std::optional<bool>, own_kernel, std::nullopt,
          "run the tiles cuDNN would take on our Hopper kernel where it "
          "takes them (true) or on cuDNN (false); default: TunedRingConfig's "
          "choice");
ABSL_FLAG(bool, skip_transfers, false,
          "also run every multi-GPU case without its transfers");
ABSL_FLAG(bool, ranks_alone, false,
          "run GPU counts above this machine's one rank at a time on cuda:0, "
          "with local copies in place of transfers");
ABSL_FLAG(std::vector<std::string>, long_lengths, {},
          "lengths run causal only, timed once each, after the others");
ABSL_FLAG(int32_t, iterations, 3, "timed runs per case, at most");
ABSL_FLAG(double, seconds, 20,
          "stop timing a case after this many seconds (at least one run)");
ABSL_FLAG(double, step_timeout_seconds, 300,
          "the longest one ring step may wait for its transfers");

namespace ringattn {
namespace {

constexpr int64_t kPatternValues = int64_t{16} << 20;  // 32 MiB of bf16
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// A communicator whose transfers stay on the rank's own GPU: a send is copied
// into the receive started with it, on a stream of its own (a copy engine, no
// kernel), so no NCCL kernel runs and nothing crosses NVLink while the data
// the ring computes on stays real (the rank's own block in place of its
// neighbour's, the same values' statistics). Computing on buffers never
// written would flatter this run: GPUs clock higher on zeros than on random
// values.
class LocalCopies final : public RingCommunicator {
 public:
  LocalCopies(int rank, int world_size, CudaStream stream)
      : rank_(rank), world_size_(world_size), stream_(std::move(stream)) {}
  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  absl::Status StartReceive(void* data, int64_t bytes, int) override {
    receive_ = data;
    receive_bytes_ = bytes;
    return absl::OkStatus();
  }
  absl::Status StartSend(const void* data, int64_t bytes, int) override {
    if (receive_ == nullptr) return absl::OkStatus();
    const absl::Status copied = CudaStatus(
        cudaMemcpyAsync(receive_, data,
                        static_cast<size_t>(std::min(bytes, receive_bytes_)),
                        cudaMemcpyDeviceToDevice, stream_.get()),
        "copying a block in place of a transfer");
    receive_ = nullptr;
    return copied;
  }
  absl::Status Wait(absl::Time) override {
    receive_ = nullptr;
    return CudaStatus(cudaStreamSynchronize(stream_.get()),
                      "copying a block in place of a transfer");
  }
  void Abort() override {}

 private:
  const int rank_;
  const int world_size_;
  CudaStream stream_;
  void* receive_ = nullptr;
  int64_t receive_bytes_ = 0;
};

// A barrier for a fixed number of threads, usable again and again.
class Barrier {
 public:
  explicit Barrier(int count) : count_(count) {}
  void Wait() {
    absl::MutexLock lock(&mutex_);
    const int64_t generation = generation_;
    if (++arrived_ == count_) {
      arrived_ = 0;
      ++generation_;
      all_arrived_.SignalAll();
      return;
    }
    while (generation_ == generation) all_arrived_.Wait(&mutex_);
  }

 private:
  const int count_;
  absl::Mutex mutex_;
  absl::CondVar all_arrived_;
  int arrived_ = 0;
  int64_t generation_ = 0;
};

struct Case {
  int64_t n = 0;
  bool causal = false;
  // Causal and block-sparse: blocks of --sparse_block tokens, each
  // query block seeing itself, kSparseLocalBlocks before it and the first
  // block.
  bool sparse = false;
  // Non-empty: causal and dilated (LongNet) with these branches, merged by
  // LSE.
  std::vector<DilatedBranch> dilated;
  bool transfers = true;
  int max_runs = 1;  // timed runs at most
};

// What one rank measured for one case.
struct RankMeasure {
  absl::Status status;
  std::vector<double> seconds;  // one per timed run
  GpuRingStats stats;           // of the last run
  int64_t used_bytes = 0;       // device memory in use after the runs
  std::string cudnn;            // why cuDNN is not used, if it is not
};

absl::StatusOr<int64_t> ParseLength(const std::string& text) {
  int64_t scale = 1;
  std::string digits = text;
  if (!digits.empty() && (digits.back() == 'K' || digits.back() == 'k')) {
    scale = 1024;
    digits.pop_back();
  } else if (!digits.empty() &&
             (digits.back() == 'M' || digits.back() == 'm')) {
    scale = 1024 * 1024;
    digits.pop_back();
  }
  int64_t value = 0;
  if (!absl::SimpleAtoi(digits, &value) || value < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--lengths: ", text, " is not a positive length"));
  }
  return value * scale;
}

// `count` bf16 values on the device: a random pattern repeated.
absl::Status FillPattern(void* device, int64_t count,
                         const DeviceBuffer& pattern, cudaStream_t stream) {
  for (int64_t at = 0; at < count; at += kPatternValues) {
    const int64_t n = std::min(kPatternValues, count - at);
    absl::Status s =
        CudaStatus(cudaMemcpyAsync(static_cast<uint16_t*>(device) + at,
                                   pattern.as<uint16_t>(), n * sizeof(uint16_t),
                                   cudaMemcpyDeviceToDevice, stream),
                   "filling an input");
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<DeviceBuffer> MakePattern(int rank) {
  std::vector<uint16_t> host(static_cast<size_t>(kPatternValues));
  std::mt19937 rng(1234 + rank);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (uint16_t& x : host) x = FloatToBFloat16(normal(rng));
  absl::StatusOr<DeviceBuffer> pattern =
      DeviceBuffer::Allocate(host.size() * sizeof(uint16_t));
  if (!pattern.ok()) return pattern;
  absl::Status s = CudaStatus(
      cudaMemcpy(pattern->as<void>(), host.data(),
                 host.size() * sizeof(uint16_t), cudaMemcpyHostToDevice),
      "uploading the pattern");
  if (!s.ok()) return s;
  return pattern;
}

constexpr int64_t kSparseLocalBlocks = 2;
// "(W,R)" for each branch.
std::string BranchesText(const std::vector<DilatedBranch>& branches) {
  std::string text;
  for (const DilatedBranch& b : branches) {
    absl::StrAppend(&text, "(", b.segment_length, ",", b.dilation, ")");
  }
  return text;
}

// The tile sizes and kernel the flags force, or TunedRingConfig's.
std::string TilesNote() {
  const std::optional<int64_t> q = absl::GetFlag(FLAGS_tile_q);
  const std::optional<int64_t> kv = absl::GetFlag(FLAGS_tile_kv);
  const std::optional<bool> own = absl::GetFlag(FLAGS_own_kernel);
  AttentionSpec dense;
  dense.head_dim = 128;
  const GpuRingConfig tuned = TunedRingConfig(dense, GpuRingConfig());
  const GpuRingConfig untuned;
  return absl::StrCat(q ? absl::StrCat(*q) : "tuned", " x ",
                      kv ? absl::StrCat(*kv) : "tuned", ", ",
                      own ? (*own ? "our kernel" : "cuDNN") : "tuned kernel",
                      " (TunedRingConfig: our kernel on ", tuned.tile_q_rows,
                      " x ", tuned.tile_kv_rows,
                      " for dense and causal at D=64, 80, 96 and 128, and on ",
                      untuned.tile_q_rows, " x ", untuned.tile_kv_rows,
                      " for dilated at D=128; else the dispatcher's choice on "
                      "those)");
}

int KvHeads() {
  return absl::GetFlag(FLAGS_kv_heads).value_or(absl::GetFlag(FLAGS_heads));
}

AttentionSpec SpecOf(const Case& c) {
  AttentionSpec spec;
  spec.q_len = spec.kv_len = c.n;
  spec.q_heads = absl::GetFlag(FLAGS_heads);
  spec.kv_heads = KvHeads();
  spec.head_dim = absl::GetFlag(FLAGS_head_dim);
  spec.causal = c.causal;
  if (c.sparse) {
    BlockSparseRules rules;
    rules.block_size = absl::GetFlag(FLAGS_sparse_block);
    rules.local = kSparseLocalBlocks;
    rules.global = 1;
    spec.block_sparse = rules;
  }
  if (!c.dilated.empty()) {
    spec.dilated = c.dilated;
    spec.combine = DilatedCombine::kLse;
  }
  return spec;
}

// The FLOPs of the dense or causal mask (block-sparse and dilated runs count
// what their ranks computed instead).
double FlopsOf(const Case& c) {
  const double n = static_cast<double>(c.n);
  return 4.0 * n * n * absl::GetFlag(FLAGS_heads) *
         absl::GetFlag(FLAGS_head_dim) * (c.causal ? 0.5 : 1.0);
}

// What the ranks of one run of cases share: `threads` of them at a time,
// all of them together or (ranks alone) one.
struct Shared {
  Shared(int world_size, int threads)
      : barrier(threads),
        failed(static_cast<size_t>(world_size), 0),
        measures(static_cast<size_t>(world_size)) {}

  Barrier barrier;
  std::vector<int> failed;  // per rank, for AllOk
  int leader = 0;           // the rank that decides when a case's runs end
  bool stop = false;        // the leader's decision
  std::vector<std::vector<RankMeasure>> measures;  // [rank][case]
};

// Whether every rank passed `ok`; every rank must call it alike.
bool AllOk(Shared& shared, int rank, bool ok) {
  shared.failed[rank] = ok ? 0 : 1;
  shared.barrier.Wait();
  const bool everyone =
      std::count(shared.failed.begin(), shared.failed.end(), 1) == 0;
  shared.barrier.Wait();
  return everyone;
}

// Runs `c` on this rank's `executor` until the leader has timed enough runs;
// the first run is untimed when it is cheap (it builds cuDNN plans and NCCL
// connections), long cases are timed from the first run.
void RunCase(const Case& c, int rank, int world_size, GpuRingExecutor& executor,
             RingCommunicator& communicator, const DeviceBuffer& pattern,
             Shared& shared, RankMeasure& m) {
  RingOptions options;
  options.step_timeout =
      absl::Seconds(absl::GetFlag(FLAGS_step_timeout_seconds));
  // An untimed first run where it is cheap: short cases, and patterns that
  // compute a fraction of FlopsOf (their first run builds cuDNN plans for
  // shapes no other case has).
  const bool warm_up =
      c.sparse || !c.dilated.empty() || FlopsOf(c) / world_size < 2e14;
  const absl::Time case_start = absl::Now();
  for (int run = 0;; ++run) {
    absl::Status s =
        FillPattern(executor.device_q(), executor.q_shape().NumElements(),
                    pattern, nullptr);
    if (s.ok()) {
      s = FillPattern(executor.device_k(),
                      2 * executor.kv_shape().NumElements(), pattern, nullptr);
    }
    if (s.ok()) s = CudaStatus(cudaDeviceSynchronize(), "filling inputs");
    if (!AllOk(shared, rank, s.ok())) {
      m.status = s.ok() ? absl::AbortedError("another rank failed") : s;
      return;
    }
    const absl::Time start = absl::Now();
    absl::StatusOr<GpuRingStats> stats = executor.Run(communicator, options);
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    if (!AllOk(shared, rank, stats.ok())) {
      m.status = stats.ok() ? absl::AbortedError("another rank failed")
                            : stats.status();
      return;
    }
    m.stats = *stats;
    const bool timed = run > 0 || !warm_up;
    if (timed) m.seconds.push_back(seconds);
    if (rank == shared.leader) {
      shared.stop =
          timed && (static_cast<int>(m.seconds.size()) >= c.max_runs ||
                    absl::ToDoubleSeconds(absl::Now() - case_start) >
                        absl::GetFlag(FLAGS_seconds));
    }
    shared.barrier.Wait();
    const bool stop = shared.stop;
    shared.barrier.Wait();
    if (stop) return;
  }
}

// Everything one rank does for `cases` on CUDA device `device`, in step with
// the other ranks; over NCCL with the ring `id` if there is one (else local
// copies).
void RunRank(int rank, int world_size, int device, const ncclUniqueId* id,
             const std::vector<Case>& cases, Shared& shared) {
  std::vector<RankMeasure>& measures = shared.measures[rank];
  measures.resize(cases.size());
  absl::Status status = UseCudaDevice(device);
  std::unique_ptr<NcclCommunicator> nccl;
  if (status.ok() && id != nullptr) {
    absl::StatusOr<std::unique_ptr<NcclCommunicator>> created =
        NcclCommunicator::Create(*id, rank, world_size, device,
                                 absl::Minutes(2));
    status = created.status();
    if (created.ok()) nccl = *std::move(created);
  }
  absl::StatusOr<DeviceBuffer> pattern =
      status.ok() ? MakePattern(rank) : absl::StatusOr<DeviceBuffer>(status);
  if (!AllOk(shared, rank, pattern.ok())) {
    for (RankMeasure& m : measures) {
      m.status = pattern.ok() ? absl::AbortedError("another rank failed")
                              : pattern.status();
    }
    return;
  }
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    RankMeasure& m = measures[i];
    GpuRingConfig config;
    config.device = device;
    config = TunedRingConfig(SpecOf(c), config);
    if (const std::optional<int64_t> rows = absl::GetFlag(FLAGS_tile_q)) {
      config.tile_q_rows = *rows;
    }
    if (const std::optional<int64_t> rows = absl::GetFlag(FLAGS_tile_kv)) {
      config.tile_kv_rows = *rows;
    }
    if (const std::optional<bool> own = absl::GetFlag(FLAGS_own_kernel)) {
      config.prefer_own_kernel = *own;
    }
    absl::StatusOr<std::unique_ptr<GpuRingExecutor>> executor =
        GpuRingExecutor::Create(SpecOf(c), rank, world_size, config);
    if (!AllOk(shared, rank, executor.ok())) {
      m.status = executor.ok() ? absl::AbortedError("another rank failed")
                               : executor.status();
      continue;
    }
    GpuRingExecutor& e = **executor;
    if (!e.cudnn_status().ok()) {
      m.cudnn = std::string(e.cudnn_status().message());
    }
    absl::StatusOr<CudaStream> copy_stream = CudaStream::Create();
    if (!AllOk(shared, rank, copy_stream.ok())) {
      m.status = copy_stream.ok() ? absl::AbortedError("another rank failed")
                                  : copy_stream.status();
      continue;
    }
    LocalCopies local_copies(rank, world_size, *std::move(copy_stream));
    RingCommunicator& communicator = c.transfers && nccl != nullptr
                                         ? static_cast<RingCommunicator&>(*nccl)
                                         : local_copies;
    RunCase(c, rank, world_size, e, communicator, *pattern, shared, m);
    size_t free_bytes = 0;
    size_t total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
      m.used_bytes = static_cast<int64_t>(total_bytes - free_bytes);
    }
    if (!m.status.ok() && c.transfers) {
      // A failed run breaks the communicator: the later cases cannot run.
      for (size_t j = i + 1; j < cases.size(); ++j) {
        measures[j].status =
            absl::AbortedError("an earlier case broke the ring");
      }
      return;
    }
  }
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

// Prints one table row per case from every rank's `measures` (the slowest
// rank's time per run); false if any failed.
bool Report(int world_size, bool alone, const std::vector<Case>& cases,
            const std::vector<std::vector<RankMeasure>>& measures) {
  bool all_ran = true;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const std::string name = alone         ? "ringattn, ranks alone on cuda:0"
                             : c.transfers ? "ringattn"
                                           : "ringattn, local copies";
    std::string mask = c.causal ? "causal" : "dense";
    absl::Status status;
    std::vector<double> slowest;
    for (int r = 0; r < world_size; ++r) {
      const RankMeasure& m = measures[r][i];
      if (!m.status.ok() && status.ok()) status = m.status;
      for (size_t k = 0; k < m.seconds.size(); ++k) {
        if (slowest.size() <= k) slowest.resize(k + 1, 0.0);
        slowest[k] = std::max(slowest[k], m.seconds[k]);
      }
    }
    if (!status.ok() || slowest.empty()) {
      std::printf("| %s | %d | %s | %lld | failed: %s |\n", name.c_str(),
                  world_size, mask.c_str(), static_cast<long long>(c.n),
                  std::string(status.message()).c_str());
      all_ran = false;
      continue;
    }
    const double seconds = Median(slowest);
    double pool = 0, used = 0, exposed = 0, computed = 0;
    int64_t cudnn = 0, flash = 0;
    for (int r = 0; r < world_size; ++r) {
      const RankMeasure& m = measures[r][i];
      pool = std::max(pool, m.stats.ring.peak_bytes / kGiB);
      used = std::max(used, m.used_bytes / kGiB);
      exposed = std::max(exposed, m.stats.ring.wait_seconds);
      cudnn += m.stats.tiles.cudnn;
      flash += m.stats.tiles.flash + m.stats.tiles.hopper +
               m.stats.tiles.decode + m.stats.lists.total();
      computed += m.stats.ring.flops;
      if (!m.cudnn.empty() && r == 0) {
        std::fprintf(stderr, "cuDNN not used on cuda:%d: %s\n", r,
                     m.cudnn.c_str());
      }
    }
    double flops = FlopsOf(c);
    if (c.sparse || !c.dilated.empty()) {
      mask = absl::StrFormat(
          "causal %s (%.2f%% of causal pairs)",
          c.sparse ? "sparse"
                   : absl::StrCat("dilated ", BranchesText(c.dilated)),
          100 * computed / flops);
      flops = computed;
    }
    std::printf(
        "| %s | %d | %s | %lld | %.1f | %.0f | %.1f | %.1f | %.0f%% | %.1f | "
        "%zu |\n",
        name.c_str(), world_size, mask.c_str(), static_cast<long long>(c.n),
        seconds * 1e3, flops / seconds / world_size / 1e12, pool, used,
        100.0 * cudnn / std::max<int64_t>(1, cudnn + flash), exposed * 1e3,
        slowest.size());
    std::fflush(stdout);
    if (alone) {
      std::string ranks;
      for (int r = 0; r < world_size; ++r) {
        absl::StrAppendFormat(&ranks, "%s%.2f", r == 0 ? "" : " / ",
                              Median(measures[r][i].seconds) * 1e3);
      }
      std::fprintf(stderr, "ranks alone, %s %lld: ms per rank %s\n",
                   mask.c_str(), static_cast<long long>(c.n), ranks.c_str());
    }
  }
  return all_ran;
}

// Runs `cases` on `world_size` GPUs (or, `alone`, each rank in turn on
// cuda:0) and prints one table row per case; false if any failed.
bool RunCases(int world_size, bool alone, const std::vector<Case>& cases) {
  if (alone) {
    Shared shared(world_size, 1);
    for (int rank = 0; rank < world_size; ++rank) {
      shared.leader = rank;
      RunRank(rank, world_size, 0, nullptr, cases, shared);
    }
    return Report(world_size, alone, cases, shared.measures);
  }
  ncclUniqueId id{};
  if (world_size > 1) {
    absl::StatusOr<ncclUniqueId> fresh = NewNcclUniqueId();
    if (!fresh.ok()) {
      std::printf("| ringattn | %d | all | - | failed: %s |\n", world_size,
                  std::string(fresh.status().message()).c_str());
      return false;
    }
    id = *fresh;
  }
  Shared shared(world_size, world_size);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world_size; ++rank) {
    threads.emplace_back([&, rank] {
      RunRank(rank, world_size, rank, world_size > 1 ? &id : nullptr, cases,
              shared);
    });
  }
  for (std::thread& t : threads) t.join();
  return Report(world_size, alone, cases, shared.measures);
}

int Main() {
  DisableNcclMulticast();
  std::vector<int64_t> lengths;
  std::vector<int64_t> long_lengths;
  for (const auto& [texts, parsed] :
       {std::make_pair(absl::GetFlag(FLAGS_lengths), &lengths),
        std::make_pair(absl::GetFlag(FLAGS_long_lengths), &long_lengths)}) {
    for (const std::string& text : texts) {
      absl::StatusOr<int64_t> n = ParseLength(text);
      if (!n.ok()) {
        std::fprintf(stderr, "ring_bench: %s\n",
                     std::string(n.status().message()).c_str());
        return 2;
      }
      parsed->push_back(*n);
    }
  }
  if (KvHeads() < 1 || absl::GetFlag(FLAGS_heads) % KvHeads() != 0) {
    std::fprintf(stderr, "ring_bench: --kv_heads must divide --heads\n");
    return 2;
  }
  const std::vector<std::string> masks = absl::GetFlag(FLAGS_masks);
  for (const std::string& mask : masks) {
    if (mask != "dense" && mask != "causal" && mask != "sparse" &&
        mask != "dilated") {
      std::fprintf(stderr,
                   "ring_bench: --masks takes dense, causal, sparse and "
                   "dilated\n");
      return 2;
    }
  }
  const absl::StatusOr<std::vector<v1::DilatedBranch>> parsed =
      ParseDilated(absl::GetFlag(FLAGS_dilated));
  if (!parsed.ok()) {
    std::fprintf(stderr, "ring_bench: %s\n",
                 std::string(parsed.status().message()).c_str());
    return 2;
  }
  std::vector<DilatedBranch> branches;
  for (const v1::DilatedBranch& b : *parsed) {
    branches.push_back({b.segment_length(), b.dilation()});
  }
  const int devices = CudaDeviceCount();
  if (devices == 0) {
    std::fprintf(stderr, "ring_bench: no CUDA device here\n");
    return 1;
  }
  absl::StatusOr<CudaDeviceInfo> info = OpenCudaDevice(0);
  if (!info.ok()) {
    std::fprintf(stderr, "ring_bench: %s\n",
                 std::string(info.status().message()).c_str());
    return 1;
  }
  int nccl_version = 0;
  ncclGetVersion(&nccl_version);
  std::printf(
      "\nringattn ring attention, %d x %s (%.0f GiB), NCCL %d, bf16, B=1, "
      "Hq=%d, Hkv=%d, D=%d, tiles %s\n\n",
      devices, info->name.c_str(), info->total_bytes / kGiB, nccl_version,
      absl::GetFlag(FLAGS_heads), KvHeads(), absl::GetFlag(FLAGS_head_dim),
      TilesNote().c_str());
  std::printf(
      "| implementation | GPUs | mask | N | ms | TFLOP/s per GPU | pool GiB "
      "per GPU | device GiB used per GPU | cuDNN tiles | ms not computing | "
      "runs |\n");
  std::printf(
      "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | "
      "--- |\n");
  std::fflush(stdout);
  int status = 0;
  for (const std::string& text : absl::GetFlag(FLAGS_gpus)) {
    int world_size = 0;
    if (!absl::SimpleAtoi(text, &world_size) || world_size < 1) {
      std::fprintf(stderr, "ring_bench: --gpus takes positive counts\n");
      return 2;
    }
    const bool alone = absl::GetFlag(FLAGS_ranks_alone) && world_size > devices;
    if (world_size > devices && !alone) {
      std::printf(
          "| ringattn | %d | - | - | skipped: this machine has %d "
          "GPU(s) |\n",
          world_size, devices);
      continue;
    }
    const bool skip =
        absl::GetFlag(FLAGS_skip_transfers) && world_size > 1 && !alone;
    const int iterations = absl::GetFlag(FLAGS_iterations);
    std::vector<Case> cases;
    for (const int64_t n : lengths) {
      for (const std::string& mask : masks) {
        const bool causal = mask != "dense";
        const bool sparse = mask == "sparse";
        const std::vector<DilatedBranch> dilated =
            mask == "dilated" ? branches : std::vector<DilatedBranch>();
        cases.push_back({n, causal, sparse, dilated, !alone, iterations});
        if (skip) {
          cases.push_back({n, causal, sparse, dilated, false, iterations});
        }
      }
    }
    for (const int64_t n : long_lengths) {
      cases.push_back({n, true, false, {}, !alone, 1});
      if (skip) cases.push_back({n, true, false, {}, false, 1});
    }
    if (!RunCases(world_size, alone, cases)) status = 1;
  }
  return status;
}

}  // namespace
}  // namespace ringattn

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return ringattn::Main();
}
