#ifndef RINGATTN_WORKER_WORKER_SERVICE_H_
#define RINGATTN_WORKER_WORKER_SERVICE_H_

// WorkerService: the Worker gRPC service of a CPU worker. Each Execute stream
// is one request's share on this rank: a header (spec, rank, world size,
// rendezvous prefix), the rows of the rank's shard in the wire dtype, then
// `run`; the worker joins the request's ring, computes with a RingExecutor and
// streams its fp32 output rows back, then ExecuteDone. For BROADCAST_Q the
// rank gets every query row, joins no ring, and returns partial rows for all
// queries over its own K/V (BroadcastExecutor). For PASS_Q the rank gets the
// same shard as for PASS_KV, but query blocks travel the ring instead of K/V
// (PassQExecutor on a CPU worker, GpuRingExecutor::CreatePassQ on a CUDA
// one). A header that names a communicator key
// rings over the communicator this worker keeps for that key
// (CommunicatorCache). Resident contexts live in host memory on a CPU worker,
// which copies a query's rows out of them, and in device memory on a CUDA
// worker, whose broadcast-Q and pass-Q queries read them in place (a decode
// step moves only its query rows). A small query that appends to its context
// brings the new rows in its header, and the worker stores them before it
// reads the context; larger appends come on StoreContext streams. Streams are
// callback reactors (no gRPC thread is parked on a stream); the computation of
// a request runs on a thread of its own. A large shard may also arrive on
// AttachRows streams (each on a connection of its own) that present the
// rows_key of its Execute stream's header; 'run' comes once they answered
// that their rows are stored, and the output goes back over them and the
// Execute stream at once. A large context piece may arrive the same way,
// beside its StoreContext stream.
// Cancelling a stream, or its deadline passing, aborts the ring on this rank
// and frees the request's memory. Bad input gets INVALID_ARGUMENT naming the
// problem; a worker at its limits answers RESOURCE_EXHAUSTED. Thread-safe.

#include <cstdint>
#include <memory>

#include "absl/time/time.h"
#include "ringattn/v1/worker.grpc.pb.h"
#include "worker/attached_row_streams.h"
#include "worker/background_page_faults.h"
#include "worker/communicator.h"
#include "worker/communicator_cache.h"
#include "worker/compute_threads.h"
#include "worker/context_store.h"
#include "worker/device_context_store.h"
#include "worker/execution_budget.h"
#include "worker/pinned_staging_pool.h"

namespace ringattn {

// A quarter of this host's physical memory: by default the most a request's
// staged shard may page-lock. Locking takes no memory of its own (the shard
// is held either way) but keeps it from being swapped out or reclaimed.
int64_t DefaultMostPinnedStagingBytes();

struct WorkerServiceOptions {
  // Executions at once; further streams get RESOURCE_EXHAUSTED.
  int max_concurrent_executions = 2;
  // Memory all executions may hold together (RingExecutor::BytesNeeded
  // each); a request that does not fit gets RESOURCE_EXHAUSTED.
  int64_t memory_bytes = int64_t{4} << 30;
  // The ring timeout of a header that leaves timeout_seconds at 0.
  absl::Duration default_ring_timeout = absl::Seconds(60);
  // Memory resident contexts may hold on this worker (device memory on a CUDA
  // worker, where queries read them in place).
  int64_t context_memory_bytes = int64_t{4} << 30;
  // The CUDA device requests run on (GpuRingExecutor; the connector must then
  // move device memory: an NcclConnector, and memory_bytes counts device
  // memory); -1: the CPU (RingExecutor).
  int cuda_device = -1;
  // How long a compute thread whose request ended polls for the next before
  // it sleeps (ComputeThreads).
  absl::Duration compute_linger = absl::ZeroDuration();
  // A request whose staged shard takes at least this many host bytes has
  // their pages faulted in ahead of its rows (BackgroundPageFaults).
  int64_t background_page_fault_bytes = kBackgroundPageFaultBytes;
  // A CUDA worker also page-locks such a shard once its pages are in
  // (PinnedHostRegions) if it takes at most this many bytes (0: never):
  // locked memory cannot be swapped out or given to anything else on the
  // host while the request holds it.
  int64_t most_pinned_staging_bytes = DefaultMostPinnedStagingBytes();
  // A CUDA worker stages a request whose host staging fits this many bytes
  // in a page-locked buffer of a PinnedStagingPool, one per execution at
  // once (max_concurrent_executions), allocated as first needed and kept
  // (0: none; such requests stage in pageable memory).
  int64_t pinned_staging_buffer_bytes = kBackgroundPageFaultBytes;
};

class WorkerService final : public v1::Worker::CallbackService {
 public:
  // `connector` joins every request's ring (directly, or through the
  // service's CommunicatorCache); it must outlive the service, and the service
  // must outlive the server it is registered with.
  WorkerService(RingConnector& connector, const WorkerServiceOptions& options);

  WorkerService(const WorkerService&) = delete;
  WorkerService& operator=(const WorkerService&) = delete;

  grpc::ServerBidiReactor<v1::ExecuteRequest, v1::ExecuteResponse>* Execute(
      grpc::CallbackServerContext* context) override;
  grpc::ServerBidiReactor<v1::ExecuteRequest, v1::ExecuteResponse>* AttachRows(
      grpc::CallbackServerContext* context) override;
  grpc::ServerReadReactor<v1::StoreContextRequest>* StoreContext(
      grpc::CallbackServerContext* context,
      v1::StoreContextResponse* response) override;
  grpc::ServerUnaryReactor* DropContext(
      grpc::CallbackServerContext* context,
      const v1::DropContextRequest* request,
      v1::DropContextResponse* response) override;

  // Executions admitted and not yet finished.
  int active_executions() const { return budget_.executions(); }
  // Page-locked staging buffers allocated so far (PinnedStagingPool).
  int staging_buffers() const {
    return staging_pool_ != nullptr ? staging_pool_->allocated() : 0;
  }
  // Communicators made for communicator keys so far.
  int64_t cached_communicator_creations() const {
    return communicators_.creations();
  }

 private:
  ResidentContexts& contexts();

  RingConnector& connector_;
  CommunicatorCache communicators_;
  const WorkerServiceOptions options_;
  ExecutionBudget budget_;
  // Resident contexts: in host memory on a CPU worker, in device memory on a
  // CUDA one (exactly one is set).
  std::unique_ptr<ContextStore> host_contexts_;
  std::unique_ptr<DeviceContextStore> device_contexts_;
  // A CUDA worker's short requests stage here (nullptr: none).
  std::unique_ptr<PinnedStagingPool> staging_pool_;
  // Outlives every stream: Execute streams open their shards to it.
  AttachedRowStreams attached_rows_;
  // Last, so that it is destroyed first: its work uses the members above.
  ComputeThreads compute_threads_;
};

}  // namespace ringattn

#endif  // RINGATTN_WORKER_WORKER_SERVICE_H_
