#include "worker/gpu_ring_executor.h"

#include <algorithm>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/ring_plan.h"
#include "core/status_macros.h"
#include "core/strategy_support.h"
#include "kernels/cuda/convert.h"
#include "kernels/cuda/hopper_attention.h"
#include "kernels/cuda/partial_merge.h"
#include "worker/background_page_faults.h"
#include "worker/executor_memory.h"
#include "worker/executor_memory_pool.h"
#include "worker/kernel_launches.h"
#include "worker/pinned_host_regions.h"
#include "worker/task_flops.h"

namespace ringattn {
namespace {

// Every slice of the pool starts on this boundary (cuDNN wants 16 bytes).
constexpr int64_t kAlignment = 256;
// fp32 values Upload moves per chunk through its device staging buffer.
constexpr int64_t kUploadChunk = int64_t{8} << 20;

double AlignUp(double bytes) {
  return static_cast<double>(
      static_cast<int64_t>((bytes + kAlignment - 1) / kAlignment) * kAlignment);
}

// Byte offsets within a query block [Q | O | LSE] of `rows` rows (Q at 0), in
// double so that absurd shapes saturate instead of overflowing.
struct QueryBlockLayout {
  double o = 0;
  double lse = 0;
  double bytes = 0;
};

QueryBlockLayout LayOutQueryBlock(const AttentionSpec& spec, double rows,
                                  int64_t element_bytes) {
  const double rows_heads = static_cast<double>(spec.batch) * rows *
                            static_cast<double>(spec.q_heads);
  const double values = rows_heads * static_cast<double>(spec.head_dim);
  QueryBlockLayout layout;
  layout.o = AlignUp(values * static_cast<double>(element_bytes));
  layout.lse = layout.o + AlignUp(values * sizeof(float));
  layout.bytes = layout.lse + rows_heads * sizeof(float);
  return layout;
}

// Byte offsets of the pool's slices, in double as above.
struct PoolLayout {
  double query_block = 0;
  double spare_query_block = 0;
  double home_block = 0;
  double spare_block = 0;
  double part_o = 0;
  double part_lse = 0;
  double total = 0;
};

// A pool of query blocks of `q_rows` rows (a spare one if `spare_query`), K/V
// blocks of `block_rows` rows (a spare one if `spare_kv`), and the scratch of
// one tile.
PoolLayout LayOutPool(const AttentionSpec& spec, int64_t q_rows,
                      bool spare_query, int64_t block_rows, bool spare_kv,
                      int64_t tile_q_rows, int64_t element_bytes) {
  const double batch = static_cast<double>(spec.batch);
  const double query_bytes =
      LayOutQueryBlock(spec, static_cast<double>(q_rows), element_bytes).bytes;
  const double block_values = 2 * batch * static_cast<double>(block_rows) *
                              spec.kv_heads * spec.head_dim;
  const double tile_rows = static_cast<double>(std::min(q_rows, tile_q_rows));
  PoolLayout layout;
  double at = 0;
  auto take = [&at](double bytes) {
    const double start = at;
    at += AlignUp(bytes);
    return start;
  };
  layout.query_block = take(query_bytes);
  layout.spare_query_block = spare_query ? take(query_bytes) : 0;
  layout.home_block = take(block_values * element_bytes);
  layout.spare_block = spare_kv ? take(block_values * element_bytes) : 0;
  layout.part_o =
      take(batch * tile_rows * spec.q_heads * spec.head_dim * element_bytes);
  layout.part_lse = take(batch * tile_rows * spec.q_heads * sizeof(float));
  layout.total = at;
  return layout;
}

// The pool of rank `rank`. Pass-KV: the rank's query rows stay, K/V blocks
// of the largest shard pass through a home and a spare buffer, and a world
// of one reads a resident context in place. Pass-Q: query blocks of the
// largest shard pass through two buffers, and the rank's own K/V stays in the
// home buffer, or in the resident context.
PoolLayout PoolFor(const AttentionSpec& spec, int rank, int world_size,
                   const GpuRingConfig& config, const ShardLayout& q_layout,
                   const ShardLayout& kv_layout, bool pass_q) {
  const bool ring = world_size > 1;
  const int64_t q_rows =
      pass_q ? q_layout.LargestShard() : q_layout.ShardLength(rank);
  int64_t block_rows =
      pass_q ? kv_layout.ShardLength(rank) : kv_layout.LargestShard();
  if (config.resident_kv && (pass_q || !ring)) block_rows = 0;
  return LayOutPool(spec, q_rows, pass_q && ring, block_rows, !pass_q && ring,
                    config.tile_q_rows, /*element_bytes=*/2);
}

int64_t Modulo(int64_t x, int64_t m) { return ((x % m) + m) % m; }

// Appends the tiles of global query positions `q` (shard row `q_row` on)
// against global key positions `k` (block row `k_row` on), all visible unless
// `causal`, in tiles of at most tile_q_rows x tile_kv_rows.
void AddPositionTiles(const AttentionSpec& spec, bool causal, const Range& q,
                      int64_t q_row, const Range& k, int64_t k_row,
                      int64_t tile_q_rows, int64_t tile_kv_rows,
                      int64_t wave_rows, std::vector<AttentionTile>& tiles) {
  // Key k is visible from query q iff k <= q + Nk - Nq (global positions).
  AddRectangleTiles(q_row, q.size(), k_row, k.size(), causal,
                    q.begin - k.begin + spec.kv_len - spec.q_len, tile_q_rows,
                    tile_kv_rows, tiles, wave_rows);
}

// Lends AttentionDispatchers (a cuDNN handle, its plans and workspace) per
// device, so that the plans built for one request serve the next. Never
// destroyed: cuDNN handles must not outlive the CUDA runtime at exit.
class DispatcherPool {
 public:
  static DispatcherPool& Shared() {
    static DispatcherPool* const pool = new DispatcherPool;
    return *pool;
  }

  // An idle dispatcher of `device`, or a new one made on the current device
  // (which must be `device`).
  std::unique_ptr<AttentionDispatcher> Take(int device) {
    {
      absl::MutexLock lock(&mutex_);
      std::vector<std::unique_ptr<AttentionDispatcher>>& idle = idle_[device];
      if (!idle.empty()) {
        std::unique_ptr<AttentionDispatcher> dispatcher =
            std::move(idle.back());
        idle.pop_back();
        return dispatcher;
      }
    }
    return std::make_unique<AttentionDispatcher>();
  }

  void Give(int device, std::unique_ptr<AttentionDispatcher> dispatcher) {
    absl::MutexLock lock(&mutex_);
    idle_[device].push_back(std::move(dispatcher));
  }

  int Idle(int device) {
    absl::MutexLock lock(&mutex_);
    return static_cast<int>(idle_[device].size());
  }

 private:
  absl::Mutex mutex_;
  std::map<int, std::vector<std::unique_ptr<AttentionDispatcher>>> idle_
      ABSL_GUARDED_BY(mutex_);
};

absl::Status CheckContiguous(const char* name, View<const float> view,
                             const Shape& shape) {
  if (view.shape() != shape || view.seq_stride() != shape.heads * shape.dim ||
      view.batch_stride() != shape.seq * shape.heads * shape.dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, " must be a contiguous [", shape.batch, ", ", shape.seq, ", ",
        shape.heads, ", ", shape.dim, "] tensor"));
  }
  return absl::OkStatus();
}

int64_t PoolBytesNeeded(const AttentionSpec& spec, int rank, int world_size,
                        const GpuRingConfig& config,
                        const ShardLayout* kv_layout, bool pass_q) {
  const ShardLayout kv = kv_layout != nullptr
                             ? *kv_layout
                             : LayoutFor(spec, spec.kv_len, world_size);
  return SaturatedBytes(PoolFor(spec, rank, world_size, config,
                                QueryLayoutFor(spec, world_size), kv, pass_q)
                            .total);
}

}  // namespace

int PrepareDispatchers(int device, int count) {
  DispatcherPool& pool = DispatcherPool::Shared();
  for (int idle = pool.Idle(device); idle < count; ++idle) {
    pool.Give(device, std::make_unique<AttentionDispatcher>());
  }
  return pool.Idle(device);
}

std::vector<AttentionTile> StepTiles(
    const std::vector<AttentionTask>& tasks,
    const std::vector<std::vector<AttentionTile>>& task_tiles,
    int64_t tile_q_rows, int64_t tile_kv_rows) {
  std::vector<AttentionTile> tiles;
  std::vector<AttentionTile> rectangles;
  for (size_t t = 0; t < tasks.size(); ++t) {
    std::vector<AttentionTile>& into =
        tasks[t].kind == TaskKind::kBlockSparse ? rectangles : tiles;
    into.insert(into.end(), task_tiles[t].begin(), task_tiles[t].end());
  }
  JoinTiles(tile_q_rows, tile_kv_rows, tiles);
  tiles.insert(tiles.end(), rectangles.begin(), rectangles.end());
  return tiles;
}

std::vector<AttentionTile> TileTask(const AttentionSpec& spec,
                                    const AttentionTask& task,
                                    int64_t tile_q_rows, int64_t tile_kv_rows) {
  return TileTask(spec, nullptr, task, tile_q_rows, tile_kv_rows);
}

std::vector<AttentionTile> TileTask(const AttentionSpec& spec,
                                    const BlockMask* blocks,
                                    const AttentionTask& task,
                                    int64_t tile_q_rows, int64_t tile_kv_rows,
                                    int64_t wave_rows) {
  std::vector<AttentionTile> tiles;
  if (task.kind == TaskKind::kDilated) return tiles;  // gpu_dilated_tasks.h
  if (task.kind != TaskKind::kBlockSparse || blocks == nullptr) {
    AddPositionTiles(spec, spec.causal && task.kind != TaskKind::kFull, task.q,
                     task.q_row, task.k, task.k_row, tile_q_rows, tile_kv_rows,
                     wave_rows, tiles);
    return tiles;
  }
  // Block-sparse: per query block, the runs of consecutive allowed key blocks
  // (clipped to the task); consecutive query blocks with the same runs go
  // together, and each (query blocks, key run) rectangle is tiled as a dense
  // or causal block.
  const int64_t size = blocks->block_size();
  const int64_t k_first = task.k.begin / size;
  const int64_t k_last = (task.k.end - 1) / size;
  std::vector<Range> group_runs;
  std::vector<Range> runs;
  Range group_q{task.q.begin, task.q.begin};
  const auto flush = [&] {
    for (const Range& k : group_runs) {
      AddPositionTiles(spec, spec.causal, group_q,
                       task.q_row + group_q.begin - task.q.begin, k,
                       task.k_row + k.begin - task.k.begin, tile_q_rows,
                       tile_kv_rows, wave_rows, tiles);
    }
  };
  for (int64_t qb = task.q.begin / size; qb <= (task.q.end - 1) / size; ++qb) {
    const Range q{std::max(task.q.begin, qb * size),
                  std::min(task.q.end, (qb + 1) * size)};
    runs.clear();
    for (int64_t kb = k_first; kb <= k_last; ++kb) {
      if (!blocks->Allowed(qb, kb)) continue;
      const Range k{std::max(task.k.begin, kb * size),
                    std::min(task.k.end, (kb + 1) * size)};
      if (!runs.empty() && runs.back().end == k.begin) {
        runs.back().end = k.end;
      } else {
        runs.push_back(k);
      }
    }
    if (!group_q.empty() && runs == group_runs) {
      group_q.end = q.end;
      continue;
    }
    flush();
    group_q = q;
    group_runs.swap(runs);
  }
  flush();
  return tiles;
}

BlockSparseRoute ChooseBlockSparseRoute(
    BlockSparseRoute requested, bool hopper_available,
    const std::vector<AttentionTile>& rectangles) {
  if (requested != BlockSparseRoute::kAuto) return requested;
  double pairs = 0;
  for (const AttentionTile& tile : rectangles) {
    pairs += static_cast<double>(tile.q_len) * static_cast<double>(tile.kv_len);
  }
  const double most = hopper_available ? kWorkListMostRectanglePairs
                                       : kMmaWorkListMostRectanglePairs;
  const bool small = rectangles.empty() ||
                     pairs / static_cast<double>(rectangles.size()) <= most;
  return small ? BlockSparseRoute::kWorkList : BlockSparseRoute::kRectangles;
}

int64_t GpuRingExecutor::DeviceBytesNeeded(const AttentionSpec& spec, int rank,
                                           int world_size,
                                           const GpuRingConfig& config,
                                           const ShardLayout* kv_layout) {
  return PoolBytesNeeded(spec, rank, world_size, config, kv_layout,
                         /*pass_q=*/false);
}

int64_t GpuRingExecutor::PassQDeviceBytesNeeded(const AttentionSpec& spec,
                                                int rank, int world_size,
                                                const GpuRingConfig& config,
                                                const ShardLayout* kv_layout) {
  return PoolBytesNeeded(spec, rank, world_size, config, kv_layout,
                         /*pass_q=*/true);
}

absl::StatusOr<std::unique_ptr<GpuRingExecutor>> GpuRingExecutor::Create(
    const AttentionSpec& spec, int rank, int world_size,
    const GpuRingConfig& config, std::optional<ShardLayout> kv_layout) {
  return CreateRing(spec, rank, world_size, config, std::move(kv_layout),
                    /*pass_q=*/false);
}

absl::StatusOr<std::unique_ptr<GpuRingExecutor>> GpuRingExecutor::CreatePassQ(
    const AttentionSpec& spec, int rank, int world_size,
    const GpuRingConfig& config, std::optional<ShardLayout> kv_layout) {
  return CreateRing(spec, rank, world_size, config, std::move(kv_layout),
                    /*pass_q=*/true);
}

absl::StatusOr<std::unique_ptr<GpuRingExecutor>> GpuRingExecutor::CreateRing(
    const AttentionSpec& spec, int rank, int world_size,
    const GpuRingConfig& config, std::optional<ShardLayout> kv_layout,
    bool pass_q) {
  RINGATTN_RETURN_IF_ERROR(spec.Validate());
  RINGATTN_RETURN_IF_ERROR(CheckRank(rank, world_size));
  if (config.tile_q_rows < 1 || config.tile_kv_rows < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("tile sizes must be positive, got ", config.tile_q_rows,
                     " x ", config.tile_kv_rows));
  }
  absl::StatusOr<ShardLayout> layout =
      KvLayoutFor(spec, world_size, std::move(kv_layout));
  if (!layout.ok()) return layout.status();
  return Build(spec, rank, world_size, config, *std::move(layout), pass_q);
}

absl::StatusOr<std::unique_ptr<GpuRingExecutor>>
GpuRingExecutor::CreateBroadcast(const AttentionSpec& spec, int rank,
                                 int world_size, const GpuRingConfig& config,
                                 std::optional<ShardLayout> kv_layout) {
  RINGATTN_RETURN_IF_ERROR(spec.Validate());
  RINGATTN_RETURN_IF_ERROR(CheckBroadcastQSupports(spec));
  RINGATTN_RETURN_IF_ERROR(CheckRank(rank, world_size));
  absl::StatusOr<ShardLayout> layout =
      KvLayoutFor(spec, world_size, std::move(kv_layout));
  if (!layout.ok()) return layout.status();
  return Build(spec, 0, 1, config, WorldOfOne(*layout, rank),
               /*pass_q=*/false);
}

absl::StatusOr<std::unique_ptr<GpuRingExecutor>> GpuRingExecutor::Build(
    const AttentionSpec& spec, int rank, int world_size,
    const GpuRingConfig& config, ShardLayout kv_layout, bool pass_q) {
  const int64_t bytes =
      pass_q
          ? PassQDeviceBytesNeeded(spec, rank, world_size, config, &kv_layout)
          : DeviceBytesNeeded(spec, rank, world_size, config, &kv_layout);
  RINGATTN_RETURN_IF_ERROR(
      CheckExecutorBytes(bytes, rank, world_size, "its share"));
  RINGATTN_RETURN_IF_ERROR(EnterCudaDevice(config.device));
  std::unique_ptr<GpuRingExecutor> executor(new GpuRingExecutor(
      spec, rank, world_size, config, std::move(kv_layout), pass_q));
  RINGATTN_RETURN_IF_ERROR(executor->Initialize());
  return executor;
}

GpuRingExecutor::GpuRingExecutor(const AttentionSpec& spec, int rank,
                                 int world_size, const GpuRingConfig& config,
                                 ShardLayout kv_layout, bool pass_q)
    : spec_(spec),
      rank_(rank),
      world_size_(world_size),
      config_(config),
      pass_q_(pass_q),
      q_layout_(QueryLayoutFor(spec, world_size)),
      kv_layout_(std::move(kv_layout)),
      blocks_(BlockMask::ForSpec(spec)),
      plan_(RingPlan::Build(spec, q_layout_, kv_layout_, blocks())),
      element_bytes_(2) {}

absl::Status GpuRingExecutor::Initialize() {
  absl::StatusOr<CudaStream> stream = CudaStream::Create();
  if (!stream.ok()) return stream.status();
  stream_ = *std::move(stream);
  const PoolLayout layout = PoolFor(spec_, rank_, world_size_, config_,
                                    q_layout_, kv_layout_, pass_q_);
  const int64_t total = static_cast<int64_t>(layout.total);
  if (total > 0) {
    absl::StatusOr<DeviceBuffer> pool = AllocateExecutorMemory(
        config_.device, static_cast<size_t>(total), stream_.get());
    if (!pool.ok()) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "rank ", rank_, " cannot allocate the ", total,
          " bytes of device memory it needs on cuda:", config_.device, " (",
          pool.status().message(), ")"));
    }
    pool_ = *std::move(pool);
  }
  char* base = pool_.as<char>();
  auto at = [base](double offset) {
    return base + static_cast<int64_t>(offset);
  };
  const bool ring = world_size_ > 1;
  query_block_ = at(layout.query_block);
  spare_query_block_ = pass_q_ && ring ? at(layout.spare_query_block) : nullptr;
  HoldOwnQueries(query_block_);
  home_block_ = at(layout.home_block);
  spare_block_ = !pass_q_ && ring ? at(layout.spare_block) : nullptr;
  part_o_ = at(layout.part_o);
  part_lse_ = reinterpret_cast<float*>(at(layout.part_lse));
  if (spare_block_ != nullptr) {
    // Defined contents, for runs that skip the transfers (benchmarks).
    RINGATTN_RETURN_IF_ERROR(CudaStatus(
        cudaMemset(spare_block_, 0,
                   static_cast<size_t>(layout.part_o - layout.spare_block)),
        "clearing the spare block buffer"));
  }

  absl::StatusOr<CudaEvent> start = CudaEvent::Create(/*timing=*/true);
  if (!start.ok()) return start.status();
  compute_start_ = *std::move(start);
  absl::StatusOr<CudaEvent> end = CudaEvent::Create(/*timing=*/true);
  if (!end.ok()) return end.status();
  compute_end_ = *std::move(end);
  dispatcher_ = DispatcherPool::Shared().Take(config_.device);
  dispatcher_->PreferOwnKernel(config_.prefer_own_kernel);

  // Per step, the tasks it computes: the rank's queries against the block it
  // holds (pass-KV), or the visiting queries against the rank's own K/V.
  std::vector<std::vector<AttentionTask>> step_tasks;
  if (pass_q_) {
    const std::vector<std::vector<AttentionTask>> by_owner =
        plan_.TasksAgainstBlock(rank_);
    for (int64_t s = 0; s < world_size_; ++s) {
      step_tasks.push_back(by_owner[Modulo(rank_ - s, world_size_)]);
    }
  } else {
    for (int64_t s = 0; s < plan_.num_steps(); ++s) {
      step_tasks.push_back(plan_.Step(rank_, s).tasks);
    }
  }
  RINGATTN_RETURN_IF_ERROR(PlanSteps(step_tasks));

  if (config_.host_staging) StageOnHost();
  return absl::OkStatus();
}

void GpuRingExecutor::StageOnHost() {
  const DType host = HostDTypeOf(config_.dtype);
  const Shape kv = config_.resident_kv ? Shape() : kv_shape();
  // Each tensor's start aligned as cudaMalloc aligns.
  auto aligned_bytes = [host](const Shape& shape) {
    return (shape.NumElements() * DTypeSize(host) + 255) / 256 * 256;
  };
  const int64_t q_bytes = aligned_bytes(q_shape());
  const int64_t kv_bytes = aligned_bytes(kv);
  std::shared_ptr<char> lease;
  if (config_.staging_pool != nullptr) {
    lease = config_.staging_pool->Lend(q_bytes + 2 * kv_bytes);
  }
  if (lease == nullptr) {
    host_q_ = TypedTensor(host, q_shape());
    if (!config_.resident_kv) {
      host_k_ = TypedTensor(host, kv);
      host_v_ = TypedTensor(host, kv);
    }
    return;
  }
  staging_lent_ = true;
  host_q_ = TypedTensor(host, q_shape(), lease.get(), lease);
  if (!config_.resident_kv) {
    host_k_ = TypedTensor(host, kv, lease.get() + q_bytes, lease);
    host_v_ = TypedTensor(host, kv, lease.get() + q_bytes + kv_bytes, lease);
  }
}

absl::Status GpuRingExecutor::PlanSteps(
    const std::vector<std::vector<AttentionTask>>& step_tasks) {
  // Tiles our Hopper kernel computes are cut in whole waves of thread blocks.
  const int64_t wave_rows =
      config_.prefer_own_kernel
          ? HopperWaveRows(spec_.batch, spec_.q_heads, spec_.head_dim)
          : 0;
  // Block-sparse tasks as rectangle tiles, for the route's rule.
  std::vector<std::vector<std::vector<AttentionTile>>> task_tiles;
  std::vector<AttentionTile> rectangles;
  for (const std::vector<AttentionTask>& tasks : step_tasks) {
    std::vector<std::vector<AttentionTile>>& tiles = task_tiles.emplace_back();
    for (const AttentionTask& task : tasks) {
      tiles.push_back(TileTask(spec_, blocks(), task, config_.tile_q_rows,
                               KeyRowsPerTile(), wave_rows));
      if (task.kind == TaskKind::kBlockSparse) {
        rectangles.insert(rectangles.end(), tiles.back().begin(),
                          tiles.back().end());
      }
    }
  }
  block_sparse_route_ = ChooseBlockSparseRoute(
      config_.block_sparse_route, HopperAttentionAvailable(spec_.head_dim),
      rectangles);
  const bool lists =
      blocks_.has_value() && block_sparse_route_ == BlockSparseRoute::kWorkList;
  WorkList work;
  for (size_t s = 0; s < step_tasks.size(); ++s) {
    const std::vector<AttentionTask>& tasks = step_tasks[s];
    double& flops = step_flops_.emplace_back(0.0);
    const size_t first_launch = work.launches.size();
    for (size_t t = 0; t < tasks.size(); ++t) {
      const AttentionTask& task = tasks[t];
      if (lists && task.kind == TaskKind::kBlockSparse) {
        AddBlockSparseLaunches(spec_, *blocks_, task, config_.tile_q_rows,
                               work);
        task_tiles[s][t].clear();
      }
      flops += TaskFlops(spec_, blocks(), task);
    }
    step_tiles_.push_back(
        StepTiles(tasks, task_tiles[s], config_.tile_q_rows, KeyRowsPerTile()));
    step_launches_.emplace_back(work.launches.begin() + first_launch,
                                work.launches.end());
    step_tasks_.push_back(static_cast<int64_t>(tasks.size()));
    step_dilated_calls_.push_back(PlanDilatedTasks(
        spec_, tasks, QueryRows(), config_.tile_q_rows, config_.tile_kv_rows));
  }
  // A pass-KV run of tiles alone need not clear its accumulators where the
  // first tile of each row stores into them. (Pass-Q's query blocks come
  // back to a rank with other ranks' keys folded in.)
  const bool tiles_alone =
      !pass_q_ && work.launches.empty() &&
      std::all_of(
          step_dilated_calls_.begin(), step_dilated_calls_.end(),
          [](const std::vector<DilatedCall>& calls) { return calls.empty(); });
  stores_first_ = tiles_alone && MarkFreshTiles(QueryRows(), step_tiles_);
  if (work.tiles.empty()) return absl::OkStatus();
  // One buffer: the tiles, then the spans.
  const size_t tile_bytes = work.tiles.size() * sizeof(QueryTile);
  const size_t span_bytes = work.spans.size() * sizeof(KeySpan);
  absl::StatusOr<DeviceBuffer> memory = AllocateExecutorMemory(
      config_.device, tile_bytes + span_bytes, stream_.get());
  if (!memory.ok()) return memory.status();
  work_list_memory_ = *std::move(memory);
  char* base = work_list_memory_.as<char>();
  RINGATTN_RETURN_IF_ERROR(CudaStatus(
      cudaMemcpy(base, work.tiles.data(), tile_bytes, cudaMemcpyHostToDevice),
      "uploading the work lists' tiles"));
  if (span_bytes > 0) {
    RINGATTN_RETURN_IF_ERROR(
        CudaStatus(cudaMemcpy(base + tile_bytes, work.spans.data(), span_bytes,
                              cudaMemcpyHostToDevice),
                   "uploading the work lists' spans"));
  }
  device_tiles_ = reinterpret_cast<const QueryTile*>(base);
  device_spans_ = reinterpret_cast<const KeySpan*>(base + tile_bytes);
  device_span_count_ = static_cast<int64_t>(work.spans.size());
  return absl::OkStatus();
}

GpuRingExecutor::~GpuRingExecutor() {
  if (cudaSetDevice(config_.device) != cudaSuccess) return;
  if (stream_.get() != nullptr) cudaStreamSynchronize(stream_.get());
  if (dispatcher_ != nullptr) {
    DispatcherPool::Shared().Give(config_.device, std::move(dispatcher_));
  }
}

const absl::Status& GpuRingExecutor::cudnn_status() const {
  return dispatcher_->cudnn_status();
}

Shape GpuRingExecutor::q_shape() const {
  return Shape{spec_.batch, q_layout_.ShardLength(rank_), spec_.q_heads,
               spec_.head_dim};
}

Shape GpuRingExecutor::kv_shape() const {
  return Shape{spec_.batch, kv_layout_.ShardLength(rank_), spec_.kv_heads,
               spec_.head_dim};
}

void* GpuRingExecutor::device_v() const {
  return static_cast<char*>(home_block_) +
         kv_shape().NumElements() * element_bytes_;
}

GpuRingConfig TunedRingConfig(const AttentionSpec& spec, GpuRingConfig config) {
  if (!HopperCompiledForHeadDim(spec.head_dim) ||
      spec.block_sparse.has_value()) {
    return config;
  }
  if (!spec.dilated.empty()) {
    if (spec.head_dim == 128) config.prefer_own_kernel = true;
    return config;
  }
  config.prefer_own_kernel = true;
  config.tile_q_rows = 32768;
  config.tile_kv_rows = 131072;
  return config;
}

int64_t KeyRowsPerTile(const GpuRingConfig& config, int64_t query_rows,
                       int64_t gqa_ratio, int64_t block_rows) {
  const int64_t block = std::max<int64_t>(1, block_rows);
  if (query_rows * gqa_ratio <= kGpuDecodeMaxPackedRows) return block;
  if (query_rows <= config.tile_q_rows) {
    return std::max(config.tile_kv_rows,
                    std::min(block, kMostKeyRowsPerLongTile));
  }
  return config.tile_kv_rows;
}

int64_t GpuRingExecutor::KeyRowsPerTile() const {
  return ringattn::KeyRowsPerTile(config_, QueryRows(), spec_.GqaRatio(),
                                  kv_layout_.LargestShard());
}

bool GpuRingExecutor::HasHomeBlock() const {
  return !(config_.resident_kv && (pass_q_ || world_size_ == 1));
}

int64_t GpuRingExecutor::QueryRows() const {
  return pass_q_ ? q_layout_.LargestShard() : q_layout_.ShardLength(rank_);
}

int64_t GpuRingExecutor::BlockRows(int64_t owner) const {
  return kv_layout_.ShardLength(owner);
}

int64_t GpuRingExecutor::BlockBytes(int64_t owner) const {
  return element_bytes_ * 2 * spec_.batch * BlockRows(owner) * spec_.kv_heads *
         spec_.head_dim;
}

GpuRingExecutor::KvBlock GpuRingExecutor::BlockAt(const void* buffer,
                                                  int64_t owner) const {
  if (!HasHomeBlock()) {
    return KvBlock{static_cast<const char*>(resident_.k),
                   static_cast<const char*>(resident_.v),
                   resident_.batch_stride};
  }
  const int64_t rows = BlockRows(owner);
  const int64_t row_values = spec_.kv_heads * spec_.head_dim;
  const char* keys = static_cast<const char*>(buffer);
  return KvBlock{keys, keys + spec_.batch * rows * row_values * element_bytes_,
                 rows * row_values};
}

GpuRingExecutor::QueryBlock GpuRingExecutor::QueryBlockAt(void* buffer,
                                                          int64_t owner) const {
  const int64_t rows = q_layout_.ShardLength(owner);
  const QueryBlockLayout layout =
      LayOutQueryBlock(spec_, static_cast<double>(rows), element_bytes_);
  char* base = static_cast<char*>(buffer);
  return QueryBlock{
      base, reinterpret_cast<float*>(base + static_cast<int64_t>(layout.o)),
      reinterpret_cast<float*>(base + static_cast<int64_t>(layout.lse)), rows};
}

int64_t GpuRingExecutor::QueryBlockBytes(int64_t owner) const {
  if (q_layout_.ShardLength(owner) == 0) return 0;
  return static_cast<int64_t>(
      LayOutQueryBlock(spec_, static_cast<double>(q_layout_.ShardLength(owner)),
                       element_bytes_)
          .bytes);
}

void GpuRingExecutor::HoldOwnQueries(void* buffer) {
  const QueryBlock own = QueryBlockAt(buffer, rank_);
  q_ = own.q;
  o_ = own.o;
  lse_ = own.lse;
}

absl::Status GpuRingExecutor::UseResidentKv(ResidentKv kv) {
  if (!config_.resident_kv) {
    return absl::FailedPreconditionError(
        "UseResidentKv needs an executor created with resident_kv");
  }
  const Shape shape = kv_shape();
  if (kv.dtype != config_.dtype || kv.rows != shape.seq ||
      (shape.NumElements() > 0 &&
       kv.batch_stride < shape.seq * shape.heads * shape.dim)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the resident context gives ", kv.rows, " rows of ",
                     DeviceDTypeName(kv.dtype), " where this rank needs ",
                     shape.seq, " rows of ", DeviceDTypeName(config_.dtype)));
  }
  resident_ = std::move(kv);
  if (!HasHomeBlock() || shape.NumElements() == 0) return absl::OkStatus();
  RINGATTN_RETURN_IF_ERROR(UseCudaDevice(config_.device));
  const size_t pitch =
      static_cast<size_t>(shape.heads * shape.dim * element_bytes_);
  const size_t width = static_cast<size_t>(shape.seq) * pitch;
  const KvBlock home = BlockAt(home_block_, rank_);
  const struct {
    const void* from;
    const char* to;
  } copies[] = {{resident_.k, home.k}, {resident_.v, home.v}};
  for (const auto& copy : copies) {
    RINGATTN_RETURN_IF_ERROR(CudaStatus(
        cudaMemcpy2DAsync(
            const_cast<char*>(copy.to), width, copy.from,
            static_cast<size_t>(resident_.batch_stride) * element_bytes_, width,
            static_cast<size_t>(shape.batch), cudaMemcpyDeviceToDevice,
            stream_.get()),
        "copying the resident context into the ring's block"));
  }
  return absl::OkStatus();
}

absl::Status GpuRingExecutor::Upload(View<const float> q, View<const float> k,
                                     View<const float> v) {
  if (config_.resident_kv) {
    return absl::FailedPreconditionError(
        "this executor takes K/V from a resident context (UseResidentKv), "
        "not from Upload");
  }
  RINGATTN_RETURN_IF_ERROR(CheckContiguous("Q", q, q_shape()));
  RINGATTN_RETURN_IF_ERROR(CheckContiguous("K", k, kv_shape()));
  RINGATTN_RETURN_IF_ERROR(CheckContiguous("V", v, kv_shape()));
  RINGATTN_RETURN_IF_ERROR(UseCudaDevice(config_.device));
  const int64_t largest =
      std::max(q_shape().NumElements(), kv_shape().NumElements());
  if (largest == 0) return absl::OkStatus();
  absl::StatusOr<DeviceBuffer> staging = DeviceBuffer::Allocate(
      sizeof(float) * static_cast<size_t>(std::min(largest, kUploadChunk)));
  if (!staging.ok()) return staging.status();
  const struct {
    const float* host;
    void* device;
    int64_t count;
  } copies[] = {{q.data(), q_, q_shape().NumElements()},
                {k.data(), device_k(), kv_shape().NumElements()},
                {v.data(), device_v(), kv_shape().NumElements()}};
  for (const auto& copy : copies) {
    for (int64_t at = 0; at < copy.count; at += kUploadChunk) {
      const int64_t count = std::min(kUploadChunk, copy.count - at);
      RINGATTN_RETURN_IF_ERROR(
          CudaStatus(cudaMemcpyAsync(staging->as<float>(), copy.host + at,
                                     sizeof(float) * count,
                                     cudaMemcpyHostToDevice, stream_.get()),
                     "uploading the shard"));
      RINGATTN_RETURN_IF_ERROR(
          CudaStatus(LaunchConvertFromFloat(
                         config_.dtype, staging->as<float>(),
                         static_cast<char*>(copy.device) + at * element_bytes_,
                         count, stream_.get()),
                     "narrowing the shard"));
    }
  }
  return CudaStatus(cudaStreamSynchronize(stream_.get()),
                    "waiting for the upload");
}

absl::Status GpuRingExecutor::Download(View<float> o, View<float> lse) const {
  Shape lse_shape = q_shape();
  lse_shape.dim = 1;
  RINGATTN_RETURN_IF_ERROR(CheckContiguous("O", o, q_shape()));
  RINGATTN_RETURN_IF_ERROR(CheckContiguous("LSE", lse, lse_shape));
  RINGATTN_RETURN_IF_ERROR(UseCudaDevice(config_.device));
  RINGATTN_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream_.get()),
                                      "waiting for the output"));
  if (q_shape().NumElements() == 0) return absl::OkStatus();
  RINGATTN_RETURN_IF_ERROR(CudaStatus(
      cudaMemcpy(o.data(), o_, sizeof(float) * q_shape().NumElements(),
                 cudaMemcpyDeviceToHost),
      "downloading O"));
  return CudaStatus(
      cudaMemcpy(lse.data(), lse_, sizeof(float) * lse_shape.NumElements(),
                 cudaMemcpyDeviceToHost),
      "downloading the LSE");
}

absl::StatusOr<AttentionPath> GpuRingExecutor::EnqueueMerged(
    const AttentionTile& tile, const DeviceWorkList& work,
    const QueryBlock& queries, const KvBlock& block) {
  const int64_t q_row = tile.q_row;
  const int64_t q_len = tile.q_len;
  const int64_t q_row_values = spec_.q_heads * spec_.head_dim;
  const int64_t k_row_values = spec_.kv_heads * spec_.head_dim;
  const int64_t q_rows = queries.rows;
  DeviceAttentionArgs args;
  args.dtype = config_.dtype;
  args.batch = spec_.batch;
  args.q_len = q_len;
  args.kv_len = tile.kv_len;
  args.q_heads = spec_.q_heads;
  args.kv_heads = spec_.kv_heads;
  args.head_dim = spec_.head_dim;
  args.q.data = static_cast<const char*>(queries.q) +
                q_row * q_row_values * element_bytes_;
  args.q.batch_stride = q_rows * q_row_values;
  args.q.seq_stride = q_row_values;
  args.k.data = block.k + tile.k_row * k_row_values * element_bytes_;
  args.v.data = block.v + tile.k_row * k_row_values * element_bytes_;
  args.k.batch_stride = args.v.batch_stride = block.batch_stride;
  args.k.seq_stride = args.v.seq_stride = k_row_values;
  args.o.data = part_o_;
  args.o.batch_stride = q_len * q_row_values;
  args.o.seq_stride = q_row_values;
  args.lse = part_lse_;
  args.scale = spec_.EffectiveScale();
  args.causal = tile.causal;
  args.work = work;
  AccumulatorRows into;
  into.o = queries.o + q_row * q_row_values;
  into.o_batch_stride = q_rows * q_row_values;
  into.o_seq_stride = q_row_values;
  into.lse = queries.lse + q_row * spec_.q_heads;
  into.lse_batch_stride = q_rows * spec_.q_heads;
  into.lse_seq_stride = spec_.q_heads;
  into.fresh = tile.fresh;
  return dispatcher_->ForwardInto(args, into, stream_.get());
}

absl::Status GpuRingExecutor::EnqueueTile(const AttentionTile& tile,
                                          const QueryBlock& queries,
                                          const KvBlock& block,
                                          GpuRingStats& stats) {
  absl::StatusOr<AttentionPath> path =
      EnqueueMerged(tile, DeviceWorkList{}, queries, block);
  if (!path.ok()) return path.status();
  stats.tiles.Add(*path);
  return absl::OkStatus();
}

absl::Status GpuRingExecutor::EnqueueLaunch(const WorkListLaunch& launch,
                                            const QueryBlock& queries,
                                            const KvBlock& block,
                                            GpuRingStats& stats) {
  DeviceWorkList work;
  work.tiles = device_tiles_ + launch.first_tile;
  work.tile_count = launch.tile_count;
  work.spans = device_spans_;
  work.span_count = device_span_count_;
  AttentionTile rectangle;
  rectangle.q_row = launch.q_row;
  rectangle.q_len = launch.q_len;
  rectangle.k_row = launch.k_row;
  rectangle.kv_len = launch.kv_len;
  absl::StatusOr<AttentionPath> path =
      EnqueueMerged(rectangle, work, queries, block);
  if (!path.ok()) return path.status();
  stats.lists.Add(*path);
  return absl::OkStatus();
}

absl::Status GpuRingExecutor::EnqueueDilatedStep(int64_t step,
                                                 const QueryBlock& queries,
                                                 const KvBlock& block,
                                                 const RingOptions& options,
                                                 GpuRingStats& stats) {
  DilatedOperands operands;
  operands.dtype = config_.dtype;
  operands.q = queries.q;
  operands.q_rows = queries.rows;
  operands.k = block.k;
  operands.v = block.v;
  operands.kv_batch_stride = block.batch_stride;
  operands.o = queries.o;
  operands.lse = queries.lse;
  operands.part_o = part_o_;
  operands.part_lse = part_lse_;
  AttentionPathCounts counts;
  const absl::Status enqueued = EnqueueDilatedCalls(
      spec_, step_dilated_calls_[step], operands, *dispatcher_,
      options.cancelled, stream_.get(), counts);
  stats.tiles += counts;
  return enqueued;
}

absl::Status GpuRingExecutor::Stop(RingCommunicator& communicator,
                                   bool in_flight, absl::Status status) {
  AbortRing(communicator, in_flight);
  cudaStreamSynchronize(stream_.get());
  return status;
}

absl::Status GpuRingExecutor::EnqueueStep(int64_t step,
                                          const QueryBlock& queries,
                                          const KvBlock& block,
                                          const RingOptions& options,
                                          GpuRingStats& stats) {
  RINGATTN_RETURN_IF_ERROR(CudaStatus(
      cudaEventRecord(compute_start_.get(), stream_.get()), "timing a step"));
  for (const AttentionTile& tile : step_tiles_[step]) {
    if (options.cancelled != nullptr && options.cancelled->load()) {
      return absl::CancelledError(
          absl::StrCat("rank ", rank_, " was cancelled at ring step ", step));
    }
    RINGATTN_RETURN_IF_ERROR(EnqueueTile(tile, queries, block, stats));
  }
  for (const WorkListLaunch& launch : step_launches_[step]) {
    if (options.cancelled != nullptr && options.cancelled->load()) {
      return absl::CancelledError(
          absl::StrCat("rank ", rank_, " was cancelled at ring step ", step));
    }
    RINGATTN_RETURN_IF_ERROR(EnqueueLaunch(launch, queries, block, stats));
  }
  if (!step_dilated_calls_[step].empty()) {
    RINGATTN_RETURN_IF_ERROR(
        EnqueueDilatedStep(step, queries, block, options, stats));
  }
  return CudaStatus(cudaEventRecord(compute_end_.get(), stream_.get()),
                    "timing a step");
}

absl::Status GpuRingExecutor::CountStep(int64_t step, absl::Time step_start,
                                        GpuRingStats& stats) {
  RINGATTN_RETURN_IF_ERROR(compute_end_.Wait("computing"));
  float milliseconds = 0;
  RINGATTN_RETURN_IF_ERROR(
      CudaStatus(cudaEventElapsedTime(&milliseconds, compute_start_.get(),
                                      compute_end_.get()),
                 "timing a step"));
  const double compute_seconds = milliseconds / 1e3;
  const double step_seconds = absl::ToDoubleSeconds(absl::Now() - step_start);
  stats.ring.compute_seconds += compute_seconds;
  stats.ring.wait_seconds += std::max(0.0, step_seconds - compute_seconds);
  stats.ring.flops += step_flops_[step];
  stats.ring.tasks += step_tasks_[step];
  return absl::OkStatus();
}

absl::StatusOr<GpuRingStats> GpuRingExecutor::Run(
    RingCommunicator& communicator, const RingOptions& options) {
  RINGATTN_RETURN_IF_ERROR(
      CheckCommunicatorRank(communicator, rank_, world_size_));
  RINGATTN_RETURN_IF_ERROR(UseCudaDevice(config_.device));
  const Shape q = q_shape();
  if (!stores_first_) {
    RINGATTN_RETURN_IF_ERROR(CudaStatus(
        LaunchClearAccumulators(o_, q.NumElements(), lse_,
                                q.batch * q.seq * q.heads, stream_.get()),
        "clearing the accumulators"));
  }
  GpuRingStats stats;
  stats.ring.peak_bytes = static_cast<int64_t>(pool_.bytes());
  RINGATTN_RETURN_IF_ERROR(pass_q_ ? RunPassQ(communicator, options, stats)
                                   : RunPassKv(communicator, options, stats));
  RINGATTN_RETURN_IF_ERROR(
      EnqueueFinishDilated(spec_, o_, q.NumElements(), stream_.get()));
  AttentionPathCounts launched = stats.tiles;
  launched += stats.lists;
  KernelLaunches& launches = stats.ring.launches;
  launches.cudnn = launched.cudnn;
  launches.flash = launched.flash;
  launches.hopper = launched.hopper;
  launches.decode = launched.decode;
  return stats;
}

absl::Status GpuRingExecutor::RunPassKv(RingCommunicator& communicator,
                                        const RingOptions& options,
                                        GpuRingStats& stats) {
  stats.ring.steps = plan_.num_steps();
  const QueryBlock own = QueryBlockAt(query_block_, rank_);
  void* front = home_block_;
  void* back = spare_block_;
  int64_t held = rank_;  // whose block the front buffer holds
  for (int64_t s = 0; s < plan_.num_steps(); ++s) {
    const RingStep& step = plan_.Step(rank_, s);
    if ((!step.tasks.empty() || step.send) && held != step.kv_owner) {
      return Stop(communicator, false,
                  absl::InternalError(
                      absl::StrCat("ring plan: rank ", rank_, " at step ", s,
                                   " needs the block of rank ", step.kv_owner,
                                   " but holds that of rank ", held)));
    }
    int64_t incoming = -1;
    bool in_flight = false;
    if (step.receive) {
      if (s + 1 >= plan_.num_steps() ||
          (incoming = plan_.Step(rank_, s + 1).kv_owner) < 0 ||
          back == nullptr) {
        return Stop(communicator, false,
                    absl::InternalError(absl::StrCat(
                        "ring plan: rank ", rank_, " receives at step ", s,
                        " a block no later step holds")));
      }
      // An empty block (its owner holds no positions) needs no transfer.
      if (BlockBytes(incoming) > 0) {
        if (absl::Status started = communicator.StartReceive(
                back, BlockBytes(incoming), plan_.Previous(rank_));
            !started.ok()) {
          return Stop(communicator, false, started);
        }
        in_flight = true;
      }
    }
    if (step.send && BlockBytes(held) > 0) {
      if (absl::Status started = communicator.StartSend(front, BlockBytes(held),
                                                        plan_.Next(rank_));
          !started.ok()) {
        return Stop(communicator, in_flight, started);
      }
      in_flight = true;
      ++stats.ring.transfers;
      stats.ring.bytes_sent += BlockBytes(held);
    }
    const absl::Time step_start = absl::Now();
    const absl::Status compute =
        EnqueueStep(s, own, BlockAt(front, held), options, stats);
    if (!compute.ok()) return Stop(communicator, in_flight, compute);
    if (in_flight) {
      const absl::Status moved = communicator.Wait(
          std::min(absl::Now() + options.step_timeout, options.deadline));
      if (!moved.ok()) return Stop(communicator, false, moved);
    }
    RINGATTN_RETURN_IF_ERROR(CountStep(s, step_start, stats));
    if (step.receive) {
      std::swap(front, back);
      held = incoming;
    }
  }
  return absl::OkStatus();
}

absl::Status GpuRingExecutor::RunPassQ(RingCommunicator& communicator,
                                       const RingOptions& options,
                                       GpuRingStats& stats) {
  const int64_t p = world_size_;
  const int next = static_cast<int>(Modulo(rank_ + 1, p));
  const int previous = static_cast<int>(Modulo(rank_ - 1, p));
  stats.ring.steps = p;
  const KvBlock own_kv = BlockAt(home_block_, rank_);
  // At step s the front buffer holds the block of rank - s; after the last
  // step's transfer the rank's own block is back.
  void* front = q_ == query_block_ ? query_block_ : spare_query_block_;
  void* back = front == query_block_ ? spare_query_block_ : query_block_;
  for (int64_t s = 0; s < p; ++s) {
    const int64_t held = Modulo(rank_ - s, p);
    const int64_t incoming = Modulo(rank_ - s - 1, p);
    bool in_flight = false;
    // A world of one has nowhere to send; an empty block needs no transfer.
    if (p > 1 && QueryBlockBytes(incoming) > 0) {
      if (absl::Status started = communicator.StartReceive(
              back, QueryBlockBytes(incoming), previous);
          !started.ok()) {
        return Stop(communicator, false, started);
      }
      in_flight = true;
    }
    const absl::Time step_start = absl::Now();
    absl::Status compute =
        EnqueueStep(s, QueryBlockAt(front, held), own_kv, options, stats);
    // The block leaves only once this rank's keys are merged into it.
    if (compute.ok()) {
      compute = compute_end_.Wait("computing");
    }
    if (!compute.ok()) return Stop(communicator, in_flight, compute);
    if (p > 1 && QueryBlockBytes(held) > 0) {
      if (absl::Status started =
              communicator.StartSend(front, QueryBlockBytes(held), next);
          !started.ok()) {
        return Stop(communicator, in_flight, started);
      }
      in_flight = true;
      ++stats.ring.transfers;
      stats.ring.bytes_sent += QueryBlockBytes(held);
    }
    if (in_flight) {
      const absl::Status moved = communicator.Wait(
          std::min(absl::Now() + options.step_timeout, options.deadline));
      if (!moved.ok()) return Stop(communicator, false, moved);
    }
    RINGATTN_RETURN_IF_ERROR(CountStep(s, step_start, stats));
    if (p > 1) std::swap(front, back);
  }
  HoldOwnQueries(front);
  return absl::OkStatus();
}

absl::StatusOr<RingOutput> GpuRingExecutor::RunStaged(
    RingCommunicator& communicator, const RingOptions& options,
    DType output_dtype) {
  // An O that cannot take host_q()'s memory gets fresh memory, whose pages
  // fault in on another thread while the ring computes: faulted in by the
  // download itself, 64 MiB of fp32 O took 12-17 ms of a 4096-row query on
  // an H200 host.
  TypedTensor o;
  std::optional<BackgroundPageFaults> faults;
  if (output_dtype != host_q_.dtype()) {
    o = TypedTensor(output_dtype, q_shape());
    const TypedView fresh = o.view();
    faults.emplace(std::vector<absl::Span<char>>{absl::Span<char>(
        static_cast<char*>(fresh.data()), static_cast<size_t>(fresh.bytes()))});
  }
  absl::StatusOr<GpuRingStats> stats = RunUploaded(communicator, options);
  if (!stats.ok()) return stats.status();
  if (faults.has_value()) faults->Wait();
  absl::StatusOr<RingOutput> output = DownloadInto(output_dtype, std::move(o));
  if (!output.ok()) return output.status();
  output->stats = stats->ring;
  return output;
}

absl::StatusOr<GpuRingStats> GpuRingExecutor::RunUploaded(
    RingCommunicator& communicator, const RingOptions& options) {
  if (!config_.host_staging) {
    return absl::FailedPreconditionError(
        "RunStaged needs an executor created with host_staging");
  }
  RINGATTN_RETURN_IF_ERROR(UseCudaDevice(config_.device));
  const struct {
    const TypedView host;
    void* device;
  } uploads[] = {{host_q_.view(), q_},
                 {host_k_.view(), device_k()},
                 {host_v_.view(), device_v()}};
  for (const auto& upload : uploads) {
    RINGATTN_RETURN_IF_ERROR(CopyInPinnedPieces(
        upload.device, upload.host.data(),
        static_cast<size_t>(upload.host.bytes()), /*host_offset=*/0,
        cudaMemcpyHostToDevice, stream_.get(), "uploading the shard"));
  }
  // The ring's first send reads the home block on another stream.
  RINGATTN_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream_.get()),
                                      "waiting for the upload"));
  return Run(communicator, options);
}

absl::StatusOr<RingOutput> GpuRingExecutor::DownloadOutput(DType output_dtype) {
  return DownloadInto(output_dtype, TypedTensor());
}

absl::StatusOr<RingOutput> GpuRingExecutor::DownloadInto(DType output_dtype,
                                                         TypedTensor o) {
  RINGATTN_RETURN_IF_ERROR(UseCudaDevice(config_.device));
  RingOutput output;
  Shape lse_shape = q_shape();
  lse_shape.dim = 1;
  output.lse = Tensor<float>(lse_shape);
  if (output_dtype == host_q_.dtype()) {
    output.o = std::move(host_q_);
  } else if (o.dtype() == output_dtype && o.shape() == q_shape()) {
    output.o = std::move(o);
  } else {
    output.o = TypedTensor(output_dtype, q_shape());
  }
  const TypedView host_o = output.o.view();
  if (host_o.bytes() > 0) {
    // A 16-bit O is narrowed into the query buffer, which the run no longer
    // needs, and comes back from there.
    const void* device_o = o_;
    if (output_dtype != DType::kFloat32) {
      RINGATTN_RETURN_IF_ERROR(CudaStatus(
          LaunchConvertFromFloat(ComputeDTypeFor(output_dtype), o_, q_,
                                 q_shape().NumElements(), stream_.get()),
          "narrowing O"));
      device_o = q_;
    }
    RINGATTN_RETURN_IF_ERROR(CopyInPinnedPieces(
        host_o.data(), device_o, static_cast<size_t>(host_o.bytes()),
        /*host_offset=*/0, cudaMemcpyDeviceToHost, stream_.get(),
        "downloading O"));
    RINGATTN_RETURN_IF_ERROR(
        CudaStatus(cudaMemcpyAsync(output.lse.data(), lse_,
                                   sizeof(float) * lse_shape.NumElements(),
                                   cudaMemcpyDeviceToHost, stream_.get()),
                   "downloading the LSE"));
  }
  RINGATTN_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream_.get()),
                                      "waiting for the output"));
  return output;
}

}  // namespace ringattn
