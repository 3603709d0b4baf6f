#ifndef RINGATTN_WORKER_GPU_RING_EXECUTOR_H_
#define RINGATTN_WORKER_GPU_RING_EXECUTOR_H_

// GpuRingExecutor: one rank's part of ring attention on one GPU, pass-KV
// (Create) or pass-Q (CreatePassQ), or broadcast-Q's partial result
// (CreateBroadcast). For pass-KV it
// follows the same RingPlan as the CPU RingExecutor, with every buffer in
// device memory carved out of one pool allocated at Create (nothing is
// allocated in the ring loop): the query shard and two K/V block buffers in a
// 16-bit compute dtype, fp32 O and LSE accumulators, and scratch for one
// tile's partial result. At each step it starts receiving the next block into
// the back buffer and sending the held block on (the communicator's stream),
// meanwhile runs the step's tasks on its compute stream, each cut into tiles
// of about 16K x 16K (where cuDNN runs fastest) that go through
// AttentionDispatcher (cuDNN, or our kernel where cuDNN refuses a shape) and
// are folded into the accumulators by an LSE merge; then waits for both and
// swaps the buffers.
//
// Pass-Q turns that around: the rank keeps its own K/V block (or reads a
// resident context in place, at any world size) and the query blocks travel,
// each one message [Q | O | LSE] (Q in the compute dtype, the fp32
// accumulators beside it) held in one of two query block buffers. At step s
// the rank holds the block of owner (rank - s) mod p and computes it against
// its own K/V with the plan's tasks for that pair (RingPlan::TasksAgainstBlock,
// cut into the same tiles, through the same attention paths and LSE merge);
// then it waits for that work and only then sends the block on to rank + 1
// while receiving the next from rank - 1. A block may leave only with this
// rank's keys merged in, so compute and transfers of a step do not overlap
// (as in the CPU PassQExecutor). After p steps the rank's own block is back
// and Download / RunStaged return its rows.
//
// Dense and causal attention (zigzag shards, GQA/MQA, any lengths),
// block-sparse attention (causal or not) and dilated attention (both combines,
// causal or not; launches planned by worker/gpu_dilated_tasks.h) run here. A
// block-sparse task takes one of two routes (GpuRingConfig::
// block_sparse_route): as work lists (worker/work_list.h), one launch of our
// flash kernel per task and tile_q_rows query rows, then one LSE merge; or
// cut at the mask's block boundaries into rectangles: the block pairs the
// mask (built once per executor) allows run as dense or causal tiles through
// the dispatcher (cuDNN), consecutive allowed key blocks of a query block (and
// consecutive query blocks allowing the same key blocks) sharing tiles, each
// tile merged. Either way the pairs the mask hides are never computed. The
// work lists are built and uploaded once, at creation, into a device buffer
// of their own beside the pool.
//
// Precision: Q, K and V are rounded to the compute dtype (bf16 for bf16 and
// fp32 wire data, fp16 for fp16), each tile's partial O is rounded to it once
// more before the fp32 merge, and LSE stays fp32. So fp32 requests get bf16
// accuracy (about 2e-2 * (1 + |O|)), not fp32's.
//
// Thread-compatible: one thread drives an executor; it makes its device
// current itself. Not copyable.

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/attention_spec.h"
#include "core/block_mask.h"
#include "core/dtype.h"
#include "core/ring_plan.h"
#include "core/shard_layout.h"
#include "core/tensor.h"
#include "core/typed_tensor.h"
#include "kernels/cuda/attention_args.h"
#include "kernels/cuda/attention_dispatch.h"
#include "kernels/cuda/device_buffer.h"
#include "worker/attention_tiles.h"
#include "worker/communicator.h"
#include "worker/compute_dtype.h"
#include "worker/device.h"
#include "worker/device_context_store.h"
#include "worker/gpu_dilated_tasks.h"
#include "worker/pinned_staging_pool.h"
#include "worker/ring_executor.h"
#include "worker/work_list.h"

namespace ringattn {

// How a block-sparse task is computed (see GpuRingExecutor).
enum class BlockSparseRoute {
  kAuto,        // ChooseBlockSparseRoute's rule
  kWorkList,    // our flash kernel over work lists
  kRectangles,  // one dispatcher call and merge per allowed rectangle tile
};

struct GpuRingConfig {
  int device = 0;  // the CUDA device index
  // Run the tiles cuDNN would take on our Hopper kernel where it takes them
  // (AttentionDispatcher::PreferOwnKernel). TunedRingConfig sets it, and the
  // tile sizes, where that ran faster.
  bool prefer_own_kernel = false;
  DeviceDType dtype = DeviceDType::kBFloat16;
  // Tasks are cut into tiles of at most this many query rows by this many
  // key rows (split evenly), each merged into the accumulators, except where
  // a rank has few query rows (see KeyRowsPerTile).
  int64_t tile_q_rows = 16384;
  int64_t tile_kv_rows = 16384;
  // Also hold the shard in host tensors of the compute dtype (host_q() ...),
  // for RunStaged: in one buffer lent by this pool where they fit it
  // (staging_lent()), else in pageable memory.
  bool host_staging = false;
  PinnedStagingPool* staging_pool = nullptr;
  // The route of block-sparse tasks.
  BlockSparseRoute block_sparse_route = BlockSparseRoute::kAuto;
  // K/V come from a resident context in device memory (UseResidentKv), not
  // from the host: a world of one reads them where they lie (its pool holds
  // no K/V block); a ring copies them into its home block on the device.
  bool resident_kv = false;
};

// `config` with the kernel and tile sizes that computed `spec` fastest: for
// dense and causal attention at D=128, our Hopper kernel on tiles of 32K query
// by 128K key rows (on 2x H200, causal, TFLOP/s per GPU on 1 / 2 GPUs: 596-601
// / 556-573 at 64K, 594-595 / 594-597 at 256K, 600 / 598 at 1M, against
// cuDNN's 16K x 16K tiles' 579-584 / 563-582, 580 / 564-570 and 575 / 572;
// dense 2-3% faster as well), and at D=64 likewise (one H200, dense / causal:
// 494 / 488 at 64K, 486 / 484 at 256K, against 476 / 469 and 467 / 467), at
// D=80 (477 / 468 and 464 / 462 against 16K x 16K tiles' 454 / 452 and 442 /
// 441) and at D=96 (547 / 541 and 544 / 532 against 528 / 526 and 518 / 517).
// Dilated requests at D=128 take our kernel on `config`'s tiles (causal
// LongNet branches (4096, 1), (16384, 4), (65536, 16): one H100, 426 TFLOP/s
// on the pairs computed at 256K and 1M against cuDNN's 397-410; one H200, 440
// against 429 at 1M; at D=64 cuDNN is ahead at 64K). Otherwise the
// dispatcher's choice on `config`'s tiles (other head dims and block-sparse
// requests were not measured on it).
GpuRingConfig TunedRingConfig(const AttentionSpec& spec, GpuRingConfig config);

// The most key rows one tile takes when a rank's query rows fit one tile.
inline constexpr int64_t kMostKeyRowsPerLongTile = int64_t{1} << 20;

// The key rows per tile for blocks of at most `query_rows` query rows (with
// `gqa_ratio` query heads per K/V head) against K/V blocks of at most
// `block_rows` rows. Within the decode kernel's packed rows, a whole block:
// that kernel splits the keys itself. Within one query tile, as many keys as
// a tile may take (at least tile_kv_rows, at most the block and
// kMostKeyRowsPerLongTile): a few hundred or thousand query rows give cuDNN
// too few row tiles to fill the GPU per call, so fewer, longer calls (and
// fewer merges) win. Otherwise config.tile_kv_rows.
int64_t KeyRowsPerTile(const GpuRingConfig& config, int64_t query_rows,
                       int64_t gqa_ratio, int64_t block_rows);

// The tiles that compute `task` (kFull, kCausal or kBlockSparse; none for
// kDilated, which gpu_dilated_tasks.h cuts into launches) of `spec`:
// every visible (query, key) pair in exactly one tile, no tile without one. A
// causal task is cut into tiles with no mask, tiles whose own bottom-right
// diagonal is the task's, and nothing for pairs the mask hides. A
// block-sparse task is cut at the block boundaries of `blocks` (the spec's
// mask, required for it), each allowed rectangle then tiled like a dense or,
// if spec.causal, a causal task. Requires positive tile sizes. Query rows are
// cut in whole multiples of `wave_rows` where it is positive
// (AddRectangleTiles).
std::vector<AttentionTile> TileTask(const AttentionSpec& spec,
                                    const BlockMask* blocks,
                                    const AttentionTask& task,
                                    int64_t tile_q_rows, int64_t tile_kv_rows,
                                    int64_t wave_rows = 0);
// TileTask with no block mask, for kFull and kCausal tasks.
std::vector<AttentionTile> TileTask(const AttentionSpec& spec,
                                    const AttentionTask& task,
                                    int64_t tile_q_rows, int64_t tile_kv_rows);

// One step's tiles in launch order, from `task_tiles` (TileTask's tiles of
// each of the step's `tasks`, none for a task computed otherwise): those of
// dense and causal tasks joined (JoinTiles, tile_q_rows x tile_kv_rows at
// most), then the block-sparse rectangles as they are. Those are already
// their mask's runs of allowed blocks, and joining costs the square of the
// tiles' number: a causal pattern of 16-row blocks over 5789 tokens is 21663
// rectangles, which took 42 s to join (into 21658).
std::vector<AttentionTile> StepTiles(
    const std::vector<AttentionTask>& tasks,
    const std::vector<std::vector<AttentionTile>>& task_tiles,
    int64_t tile_q_rows, int64_t tile_kv_rows);

// Above this many (query x key) pairs per rectangle tile on average, the
// rectangles are cuDNN's best shapes (16K x 16K tiles of large mask blocks run
// at 580-600 TFLOP/s on one H200, our Hopper kernel at about 550).
inline constexpr double kWorkListMostRectanglePairs = 4096.0 * 4096.0;

// Below this many pairs per rectangle tile on average, a work list on our
// mma.sync kernel (one launch) beats a call and a merge per rectangle: on one
// H200 at blocks of 16, D=80, causal or not (rectangles of 270-540 pairs on
// average) the list on the mma.sync kernel took 1/24-1/102 of the rectangles'
// time, level with the Hopper kernel's list (which took 1/13-1/82 of it at
// blocks of 64, D=80 and 128); each rectangle cost 13-69 us there. At blocks of
// 1024 the mma.sync list took 1.0-1.6x of the rectangles' time (one H100).
inline constexpr double kMmaWorkListMostRectanglePairs = 256.0 * 256.0;

// The route `requested` resolves to for block-sparse tasks whose rectangle
// tiles are `rectangles`: kAuto becomes kWorkList where the rectangles
// average at most kWorkListMostRectanglePairs and our Hopper kernel runs the
// lists (`hopper_available`, HopperAttentionAvailable), or at most
// kMmaWorkListMostRectanglePairs (the lists then run on the mma.sync kernel:
// other GPUs, D above 128 or not a multiple of 8), else kRectangles; the
// others stay. Measured on one H100 (bench/gpu/sparse_bench, N = 64K and
// 256K, blocks of 1024, 3-50% of the pairs, two patterns, causal or not): one
// Hopper launch per pattern took 0.51-0.82x the time of cuDNN per rectangle
// with its merges, every case.
BlockSparseRoute ChooseBlockSparseRoute(
    BlockSparseRoute requested, bool hopper_available,
    const std::vector<AttentionTile>& rectangles);

// Makes attention dispatchers (each with its cuDNN handle) for GPU executors
// of `device`, the current device, to take, until `count` are idle, rather
// than in the first requests that need them. Returns how many are idle.
int PrepareDispatchers(int device, int count);

struct GpuRingStats {
  // peak_bytes: the executor's device pool (cuDNN's workspace and NCCL's
  // buffers come on top); compute_seconds: the compute stream's busy time,
  // by CUDA events; wait_seconds: step time beyond it (transfers not hidden,
  // launch gaps); launches: `tiles` and `lists` together.
  RingRunStats ring;
  AttentionPathCounts tiles;  // the paths that computed the tiles
  AttentionPathCounts lists;  // the paths of the work-list launches (our own)
};

class GpuRingExecutor {
 public:
  // An executor for rank `rank` of `world_size`, its device pool allocated.
  // K/V are sharded as the spec's usual layout, or as `kv_layout` when given
  // (a resident context's pieces). INVALID_ARGUMENT for a bad spec, rank,
  // world size, layout or tile size; NOT_FOUND for a missing device;
  // RESOURCE_EXHAUSTED if the pool does not fit on the device.
  static absl::StatusOr<std::unique_ptr<GpuRingExecutor>> Create(
      const AttentionSpec& spec, int rank, int world_size,
      const GpuRingConfig& config,
      std::optional<ShardLayout> kv_layout = std::nullopt);

  // Pass-Q for rank `rank` of `world_size` (see above), over the same
  // layouts as Create; every pattern Create takes. Errors as Create.
  static absl::StatusOr<std::unique_ptr<GpuRingExecutor>> CreatePassQ(
      const AttentionSpec& spec, int rank, int world_size,
      const GpuRingConfig& config,
      std::optional<ShardLayout> kv_layout = std::nullopt);

  // Broadcast-Q for rank `rank` of `world_size`: an executor of a world of one
  // that holds every query row and only this rank's K/V chunks of the usual
  // layout or `kv_layout` (masks in global positions), for Run over a
  // SoloCommunicator; its output is this rank's partial (O, LSE). Errors as
  // Create, and UNIMPLEMENTED for specs broadcast-Q does not run.
  static absl::StatusOr<std::unique_ptr<GpuRingExecutor>> CreateBroadcast(
      const AttentionSpec& spec, int rank, int world_size,
      const GpuRingConfig& config,
      std::optional<ShardLayout> kv_layout = std::nullopt);

  // The device bytes Create allocates for this rank (the pool). Requires a
  // valid spec and 0 <= rank < world_size; saturates for absurd shapes.
  static int64_t DeviceBytesNeeded(const AttentionSpec& spec, int rank,
                                   int world_size, const GpuRingConfig& config,
                                   const ShardLayout* kv_layout = nullptr);
  // The same for CreatePassQ: two query blocks of the largest shard, with
  // their accumulators, and the rank's own K/V (none with resident_kv).
  static int64_t PassQDeviceBytesNeeded(const AttentionSpec& spec, int rank,
                                        int world_size,
                                        const GpuRingConfig& config,
                                        const ShardLayout* kv_layout = nullptr);

  GpuRingExecutor(const GpuRingExecutor&) = delete;
  GpuRingExecutor& operator=(const GpuRingExecutor&) = delete;
  // Waits for the executor's kernels, then frees its memory.
  ~GpuRingExecutor();

  const AttentionSpec& spec() const { return spec_; }
  const GpuRingConfig& config() const { return config_; }
  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  bool pass_q() const { return pass_q_; }
  const ShardLayout& q_layout() const { return q_layout_; }
  const ShardLayout& kv_layout() const { return kv_layout_; }
  const RingPlan& plan() const { return plan_; }
  // The spec's block mask; null unless the spec is block-sparse.
  const BlockMask* blocks() const {
    return blocks_.has_value() ? &*blocks_ : nullptr;
  }
  // OK when cuDNN serves this executor's tiles; otherwise why our kernel does.
  const absl::Status& cudnn_status() const;
  // The route block-sparse tasks take here (never kAuto).
  BlockSparseRoute block_sparse_route() const { return block_sparse_route_; }

  // The shard's shapes: Q and O [B, nq, Hq, D], K and V [B, nk, Hkv, D], with
  // nq, nk the rank's rows of q_layout() and kv_layout().
  Shape q_shape() const;
  Shape kv_shape() const;

  // The shard in device memory, contiguous, in config().dtype: Q rows of
  // q_layout().Chunks(rank) and K, V rows of kv_layout().Chunks(rank), in
  // chunk order. Fill them (Upload, or device copies) before each Run: a run
  // passes other ranks' blocks through the K/V buffers (pass-KV), or moves the
  // rank's query block to the other query buffer (pass-Q: device_q() is
  // where it lies now).
  void* device_q() const { return q_; }
  void* device_k() const { return home_block_; }
  void* device_v() const;

  // Narrows host fp32 rows (contiguous, of q_shape() and kv_shape()) into the
  // device shard. INVALID_ARGUMENT for other shapes or strides; INTERNAL for
  // a failing CUDA call.
  absl::Status Upload(View<const float> q, View<const float> k,
                      View<const float> v);

  // Runs the ring over `communicator`, which must move memory of
  // config().device (NcclCommunicator) and match rank and world size.
  // Returns the run's stats; the output stays on the device (Download).
  // Errors: what the communicator reports (DEADLINE_EXCEEDED, UNAVAILABLE,
  // CANCELLED), CANCELLED if options.cancelled was set, INTERNAL for a failing
  // CUDA call or a plan asking for a block this rank does not hold, and the
  // attention paths' errors. Nothing of this executor is in use on the device
  // or by the communicator when it returns.
  absl::StatusOr<GpuRingStats> Run(RingCommunicator& communicator,
                                   const RingOptions& options);

  // Copies the last Run's fp32 output into contiguous host tensors: o of
  // q_shape(), lse of q_shape() with dim 1 (natural log; -inf where a row
  // sees no key).
  absl::Status Download(View<float> o, View<float> lse) const;

  // With config().resident_kv: takes this rank's K/V rows from a resident
  // context before Run (`kv` must hold kv_shape()'s rows in config().dtype)
  // and keeps its memory until the executor goes. INVALID_ARGUMENT for
  // another shape or dtype, FAILED_PRECONDITION without resident_kv, INTERNAL
  // for a failing CUDA call.
  absl::Status UseResidentKv(ResidentKv kv);

  // With config().host_staging: where the caller loads the shard, in the
  // compute dtype (otherwise empty views; K and V also with resident_kv).
  // Q, K and V rows as RingExecutor::q() / k() / v() take them.
  TypedView host_q() const { return host_q_.view(); }
  TypedView host_k() const { return host_k_.view(); }
  TypedView host_v() const { return host_v_.view(); }
  // Whether they lie in a page-locked buffer of config().staging_pool.
  bool staging_lent() const { return staging_lent_; }

  // Copies the host staging tensors to the device, Runs, and brings O back in
  // `output_dtype` (narrowed on the device; a 16-bit O reuses host_q()'s
  // memory) with fp32 LSE: RingExecutor::Run's contract, for the worker
  // service.
  absl::StatusOr<RingOutput> RunStaged(RingCommunicator& communicator,
                                       const RingOptions& options,
                                       DType output_dtype);

  // RunStaged in two halves, for a caller that works on the fp32 output on
  // the device in between (broadcast-Q's tree, gpu_partial_reduction.h):
  // RunUploaded copies the staging tensors to the device and Runs;
  // DownloadOutput then brings O back in `output_dtype` with the LSE (stats
  // left empty).
  absl::StatusOr<GpuRingStats> RunUploaded(RingCommunicator& communicator,
                                           const RingOptions& options);
  absl::StatusOr<RingOutput> DownloadOutput(DType output_dtype);

  // The fp32 output on the device after a Run: O of q_shape() and LSE of
  // q_shape() with dim 1, contiguous; and the stream the executor's kernels
  // run on.
  float* device_o() const { return o_; }
  float* device_lse() const { return lse_; }
  cudaStream_t stream() const { return stream_.get(); }

 private:
  GpuRingExecutor(const AttentionSpec& spec, int rank, int world_size,
                  const GpuRingConfig& config, ShardLayout kv_layout,
                  bool pass_q);

  // DownloadOutput into `o` when it is a tensor of q_shape() in
  // `output_dtype` (else into host_q()'s memory or a new tensor).
  absl::StatusOr<RingOutput> DownloadInto(DType output_dtype, TypedTensor o);

  // Create and CreatePassQ: checks the arguments, then Build.
  static absl::StatusOr<std::unique_ptr<GpuRingExecutor>> CreateRing(
      const AttentionSpec& spec, int rank, int world_size,
      const GpuRingConfig& config, std::optional<ShardLayout> kv_layout,
      bool pass_q);
  // The factories once their arguments are checked.
  static absl::StatusOr<std::unique_ptr<GpuRingExecutor>> Build(
      const AttentionSpec& spec, int rank, int world_size,
      const GpuRingConfig& config, ShardLayout kv_layout, bool pass_q);

  // Allocates the pool, the stream and the events, borrows a dispatcher and
  // tiles the plan.
  absl::Status Initialize();
  // Makes the host staging tensors (config().host_staging).
  void StageOnHost();
  // K and V of one block, batches `batch_stride` elements apart.
  struct KvBlock {
    const char* k = nullptr;
    const char* v = nullptr;
    int64_t batch_stride = 0;
  };
  // The query rows of one shard ([B, rows, Hq, D] in the compute dtype) and
  // their fp32 accumulators (O of the same shape, LSE [B, rows, Hq]).
  struct QueryBlock {
    void* q = nullptr;
    float* o = nullptr;
    float* lse = nullptr;
    int64_t rows = 0;
  };

  // The key rows per tile of this rank (the free KeyRowsPerTile).
  int64_t KeyRowsPerTile() const;
  // Whether the pool holds a home K/V block (it does not where a resident
  // context is read in place: pass-Q, or a world of one).
  bool HasHomeBlock() const;
  // The most query rows a block computed here has: the rank's own (pass-KV),
  // or the largest shard's (pass-Q).
  int64_t QueryRows() const;
  // Rows and bytes of the K/V block of `owner`.
  int64_t BlockRows(int64_t owner) const;
  int64_t BlockBytes(int64_t owner) const;
  // K and V of `owner`'s block, held in `buffer` (one of the two block
  // buffers), or where the resident context holds them.
  KvBlock BlockAt(const void* buffer, int64_t owner) const;
  // The query block of `owner` held in `buffer` (one of the two query block
  // buffers, laid out [Q | O | LSE] for that owner's rows), and its bytes:
  // what pass-Q sends.
  QueryBlock QueryBlockAt(void* buffer, int64_t owner) const;
  int64_t QueryBlockBytes(int64_t owner) const;
  // Points q_, o_ and lse_ at the rank's own query block in `buffer`.
  void HoldOwnQueries(void* buffer);
  // Enqueues one tile of `queries` against `block`.
  absl::Status EnqueueTile(const AttentionTile& tile, const QueryBlock& queries,
                           const KvBlock& block, GpuRingStats& stats);
  // Enqueues one work-list launch of `queries` against `block`.
  absl::Status EnqueueLaunch(const WorkListLaunch& launch,
                             const QueryBlock& queries, const KvBlock& block,
                             GpuRingStats& stats);
  // Enqueues the query rows of `tile` in `queries` against its key rows of
  // `block` (the whole rectangle, causal or not, or the tiles `work` lists)
  // folded into the accumulators (stored, where the tile is fresh), by the
  // kernel itself where it can, else through the scratch; returns the path
  // that ran.
  absl::StatusOr<AttentionPath> EnqueueMerged(const AttentionTile& tile,
                                              const DeviceWorkList& work,
                                              const QueryBlock& queries,
                                              const KvBlock& block);
  // Plans every step's tiles and work lists (step_tiles_, step_launches_ ...)
  // from `step_tasks` and uploads the lists.
  absl::Status PlanSteps(
      const std::vector<std::vector<AttentionTask>>& step_tasks);
  // Enqueues step `step`'s dilated launches of `queries` against `block`.
  absl::Status EnqueueDilatedStep(int64_t step, const QueryBlock& queries,
                                  const KvBlock& block,
                                  const RingOptions& options,
                                  GpuRingStats& stats);
  // Enqueues step `step`'s tiles and dilated launches, between the compute
  // timing events. CANCELLED if options.cancelled is set before a launch.
  absl::Status EnqueueStep(int64_t step, const QueryBlock& queries,
                           const KvBlock& block, const RingOptions& options,
                           GpuRingStats& stats);
  // Waits for step `step`'s compute and adds its times (from `step_start`),
  // FLOPs and tasks to `stats`.
  absl::Status CountStep(int64_t step, absl::Time step_start,
                         GpuRingStats& stats);
  // The ring loops of Run, once the accumulators are cleared.
  absl::Status RunPassKv(RingCommunicator& communicator,
                         const RingOptions& options, GpuRingStats& stats);
  absl::Status RunPassQ(RingCommunicator& communicator,
                        const RingOptions& options, GpuRingStats& stats);
  // Ends a run that cannot go on: aborts the communicator, drains what is in
  // flight on both sides, and returns `status`.
  absl::Status Stop(RingCommunicator& communicator, bool in_flight,
                    absl::Status status);

  const AttentionSpec spec_;
  const int rank_;
  const int world_size_;
  const GpuRingConfig config_;
  const bool pass_q_;
  const ShardLayout q_layout_;
  const ShardLayout kv_layout_;
  const std::optional<BlockMask> blocks_;  // set iff spec_.block_sparse is
  const RingPlan plan_;
  const int64_t element_bytes_;

  // The stream the executor computes on; the buffers below that come from
  // the executors' pool (executor_memory_pool.h) go back to it on this
  // stream, which outlives them.
  CudaStream stream_;

  // Per step: its tiles and their FLOPs (task_flops.h); for pass-Q, step s
  // computes the block of owner (rank - s) mod p.
  std::vector<std::vector<AttentionTile>> step_tiles_;
  std::vector<double> step_flops_;
  std::vector<int64_t> step_tasks_;
  // Per step: the launches of its dilated tasks.
  std::vector<std::vector<DilatedCall>> step_dilated_calls_;
  // The route of block-sparse tasks; per step, its work-list launches, whose
  // tiles and spans lie in work_list_memory_ (tiles at device_tiles_, all the
  // spans at device_spans_).
  BlockSparseRoute block_sparse_route_ = BlockSparseRoute::kRectangles;
  std::vector<std::vector<WorkListLaunch>> step_launches_;
  DeviceBuffer work_list_memory_;
  const QueryTile* device_tiles_ = nullptr;
  const KeySpan* device_spans_ = nullptr;
  int64_t device_span_count_ = 0;

  DeviceBuffer pool_;
  // Two query block buffers, each [Q | O | LSE]; the spare only for pass-Q
  // with p > 1. q_, o_ and lse_ point at the rank's own rows.
  void* query_block_ = nullptr;
  void* spare_query_block_ = nullptr;
  void* q_ = nullptr;
  float* o_ = nullptr;
  float* lse_ = nullptr;
  // Two K/V block buffers, each [K | V]; the shard's own block starts in the
  // home one. The spare is null when the rank never receives one (pass-Q,
  // or p = 1).
  void* home_block_ = nullptr;
  void* spare_block_ = nullptr;
  void* part_o_ = nullptr;
  float* part_lse_ = nullptr;

  // Whether the accumulators need no clearing before a run: MarkFreshTiles
  // marked the first tile of every row, which stores instead of folding.
  bool stores_first_ = false;

  CudaEvent compute_start_;
  CudaEvent compute_end_;
  std::unique_ptr<AttentionDispatcher> dispatcher_;

  TypedTensor host_q_;
  TypedTensor host_k_;
  TypedTensor host_v_;
  bool staging_lent_ = false;
  // With resident_kv: this rank's rows of the context (UseResidentKv).
  ResidentKv resident_;
};

}  // namespace ringattn

#endif  // RINGATTN_WORKER_GPU_RING_EXECUTOR_H_
