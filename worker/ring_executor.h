#ifndef RINGATTN_WORKER_RING_EXECUTOR_H_
#define RINGATTN_WORKER_RING_EXECUTOR_H_

// RingExecutor: one rank's part of pass-KV ring attention for one request. It
// holds the rank's query shard, its output accumulators and two K/V block
// buffers (double buffering): at every step of the ring plan it starts
// receiving the next block into the back buffer and sending the held block on,
// computes the step's tasks on the held block meanwhile, waits for both
// transfers and swaps the buffers. All memory is allocated once, up front, so
// a rank holds O(N / p) whatever the number of steps. Thread-compatible; not
// copyable.

#include <atomic>
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
#include "worker/communicator.h"
#include "worker/kernel_launches.h"

namespace ringattn {

struct RingOptions {
  // The longest one step may wait for its transfers.
  absl::Duration step_timeout = absl::Seconds(60);
  // No wait lasts past this.
  absl::Time deadline = absl::InfiniteFuture();
  // If set, checked before every task; once true the run stops with
  // CANCELLED. Whoever sets it should also Abort() the communicator to end a
  // wait in progress.
  const std::atomic<bool>* cancelled = nullptr;
};

struct RingRunStats {
  int64_t peak_bytes = 0;  // the executor's buffers plus kernel scratch
  int64_t steps = 0;       // steps of the ring plan
  int64_t transfers = 0;   // blocks this rank sent
  int64_t bytes_sent = 0;
  int64_t tasks = 0;
  KernelLaunches launches;     // the attention kernels that computed them
  double compute_seconds = 0;  // in attention kernels
  double wait_seconds = 0;     // blocked on transfers after computing a step
  double flops = 0;            // see task_flops.h
};

// What one rank computed: rows of its query shard in the order of
// q_layout().Chunks(rank).
struct RingOutput {
  TypedTensor o;      // [B, n, Hq, D]; fp32 on CPU workers
  Tensor<float> lse;  // [B, n, Hq, 1], natural log; -inf where no key is seen
  RingRunStats stats;
};

class RingExecutor {
 public:
  // An executor for rank `rank` of `world_size`, its buffers allocated. K/V
  // are sharded as the spec's usual layout, or as `kv_layout` when given (a
  // resident context's pieces). K/V blocks are held and travel in `kv_dtype`:
  // fp32, or bf16 for rows that arrive in bf16 (half the bytes to hold and to
  // send; cpu_kv_holding.h). INVALID_ARGUMENT for a bad spec, rank, world
  // size, layout or K/V dtype.
  static absl::StatusOr<std::unique_ptr<RingExecutor>> Create(
      const AttentionSpec& spec, int rank, int world_size,
      std::optional<ShardLayout> kv_layout = std::nullopt,
      DType kv_dtype = DType::kFloat32);

  // The bytes an executor for this rank holds (what Create allocates plus the
  // kernels' scratch). Requires a valid spec and 0 <= rank < world_size.
  static int64_t BytesNeeded(const AttentionSpec& spec, int rank,
                             int world_size,
                             const ShardLayout* kv_layout = nullptr,
                             DType kv_dtype = DType::kFloat32);

  RingExecutor(const RingExecutor&) = delete;
  RingExecutor& operator=(const RingExecutor&) = delete;

  const AttentionSpec& spec() const { return spec_; }
  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  // Which positions (in masking order) each rank holds.
  const ShardLayout& q_layout() const { return q_layout_; }
  const ShardLayout& kv_layout() const { return kv_layout_; }
  const RingPlan& plan() const { return plan_; }

  // Where the caller loads the rank's shard before Run: Q rows of
  // q_layout().Chunks(rank) in fp32, K and V rows of kv_layout().Chunks(rank)
  // in the K/V dtype, in chunk order ([B, n, H, D]). Valid until Run.
  View<float> q() { return q_.floats(); }
  TypedView k() { return BlockKeys(front_, rank_); }
  TypedView v() { return BlockValues(front_, rank_); }

  // Runs the ring over `communicator` (rank and world size must match) and
  // returns this rank's output. Once only: FAILED_PRECONDITION after that.
  // Errors: what the communicator reports (DEADLINE_EXCEEDED, UNAVAILABLE,
  // CANCELLED), CANCELLED if options.cancelled was set, INTERNAL if the plan
  // asks for a block this rank does not hold.
  absl::StatusOr<RingOutput> Run(RingCommunicator& communicator,
                                 const RingOptions& options);

 private:
  RingExecutor(const AttentionSpec& spec, int rank, int world_size,
               ShardLayout kv_layout, DType kv_dtype);

  // Rows and bytes of the K/V block of `owner`.
  int64_t BlockRows(int64_t owner) const;
  int64_t BlockBytes(int64_t owner) const;
  // The K and V halves of the block of `owner` stored at `buffer`.
  TypedView BlockKeys(char* buffer, int64_t owner) const;
  TypedView BlockValues(char* buffer, int64_t owner) const;
  // Stops at a cancellation: aborts the communicator, waits out what is in
  // flight (so no transfer outlives the buffers) and returns CANCELLED.
  absl::Status Cancel(RingCommunicator& communicator, bool in_flight,
                      int64_t step);

  const AttentionSpec spec_;
  const int rank_;
  const int world_size_;
  const ShardLayout q_layout_;
  const ShardLayout kv_layout_;
  const std::optional<BlockMask> blocks_;
  const RingPlan plan_;
  const DType kv_dtype_;

  TypedTensor q_;  // fp32, filled by the caller: not zeroed
  Tensor<float> o_;
  Tensor<float> lse_;
  std::vector<float> task_scratch_;  // one task's partial result
  // Two K/V blocks of the largest size, each K then V: [front | back]. Not
  // zeroed: rows arrive before they are read, and a world of one never
  // touches the back block (zeroing gigabytes of K/V that are written next
  // was most of a CPU worker's time on an upload).
  std::unique_ptr<char[]> block_storage_;
  char* front_ = nullptr;
  char* back_ = nullptr;
  bool ran_ = false;
};

}  // namespace ringattn

#endif  // RINGATTN_WORKER_RING_EXECUTOR_H_
