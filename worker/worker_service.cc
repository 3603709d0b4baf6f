#include "worker/worker_service.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "core/attention_spec.h"
#include "core/dtype.h"
#include "core/ring_plan.h"
#include "core/shard_layout.h"
#include "core/status_macros.h"
#include "core/strategy_support.h"
#include "core/tensor.h"
#include "proto/grpc_status.h"
#include "proto/spec_conversion.h"
#include "spdlog/spdlog.h"
#include "worker/background_page_faults.h"
#include "worker/broadcast_executor.h"
#include "worker/context_piece.h"
#include "worker/gpu_partial_reduction.h"
#include "worker/gpu_ring_executor.h"
#include "worker/kernel_launches.h"
#include "worker/output_dealer.h"
#include "worker/output_lanes.h"
#include "worker/partial_reduction.h"
#include "worker/pass_q_executor.h"
#include "worker/pinned_host_regions.h"
#include "worker/ring_executor.h"
#include "worker/shard_intake.h"
#include "worker/shard_rows.h"
#include "worker/solo_communicator.h"

namespace ringattn {
namespace {

// Output messages carry about this many bytes (well under gRPC's 4 MiB),
// those at either end of the output fewer (OutputDealer), so that the
// coordinator forwards one while the next comes: on one H200 host the output
// of a 64-row query reached the client 0.17 ms sooner, of a 256-row one 0.4.
constexpr int64_t kFirstOutputMessageBytes = int64_t{128} << 10;
constexpr int64_t kOutputMessageBytes = int64_t{1} << 20;
// The longest ring timeout a header may ask for.
constexpr double kMostTimeoutSeconds = 24 * 3600;

// Ring waits end at the ring timeout or at the call's deadline, whichever
// comes first. One that ran out while the call still had time ran out on a
// peer that is stalled or unreachable: UNAVAILABLE (retry once the cluster is
// whole), not the caller's DEADLINE_EXCEEDED.
absl::Status PeerTimeoutAsUnavailable(absl::Status status,
                                      absl::Time call_deadline) {
  if (status.code() != absl::StatusCode::kDeadlineExceeded ||
      absl::Now() >= call_deadline) {
    return status;
  }
  return absl::UnavailableError(status.message());
}

// The dtype this worker holds context `name` in, for the coordinator's
// listing; unspecified if a drop raced the commit that just stored rows.
v1::DType HeldDTypeProto(ResidentContexts& contexts, const std::string& name) {
  absl::StatusOr<DType> dtype = contexts.HeldDType(name);
  return dtype.ok() ? DTypeToProto(*dtype) : v1::DTYPE_UNSPECIFIED;
}

// One Execute stream: reads the header and the shard, runs the ring on a
// thread of the service's ComputeThreads, then writes the output. gRPC
// serializes the reactions that matter here: reads happen before the
// computation starts and writes only after it ends; OnCancel may come at any
// time and touches only `cancelled_` and, under the mutex, the communicator.
// Deletes itself once both OnDone and the computation (if one started) are
// over.
class ExecuteReactor final
    : public grpc::ServerBidiReactor<v1::ExecuteRequest, v1::ExecuteResponse> {
 public:
  ExecuteReactor(grpc::CallbackServerContext* context, RingConnector& connector,
                 CommunicatorCache& communicators,
                 ComputeThreads& compute_threads, ContextStore* host_contexts,
                 DeviceContextStore* device_contexts,
                 AttachedRowStreams& attached_rows,
                 PinnedStagingPool* staging_pool,
                 const WorkerServiceOptions& options,
                 absl::StatusOr<ExecutionBudget::Ticket> ticket)
      : context_(context),
        connector_(connector),
        communicators_(communicators),
        compute_threads_(compute_threads),
        host_contexts_(host_contexts),
        device_contexts_(device_contexts),
        staging_pool_(staging_pool),
        options_(options),
        deadline_(absl::FromChrono(context->deadline())),
        opened_(absl::Now()),
        rows_key_(attached_rows) {
    if (!ticket.ok()) {
      FinishWith(ticket.status());
      return;
    }
    ticket_ = std::move(*ticket);
    // Tells the caller the stream was admitted.
    StartSendInitialMetadata();
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // A cancel fails the read too, and may come before OnCancel.
      FinishWith(context_->IsCancelled()
                     ? absl::CancelledError("the stream was cancelled before "
                                            "'run'")
                     : absl::InvalidArgumentError(
                           "the stream ended before 'run': send a header, "
                           "the shard's rows, then run"));
      return;
    }
    const absl::Status status = Accept(request_);
    if (!status.ok()) {
      FinishWith(status);
      return;
    }
    if (run_requested_) {
      holders_.fetch_add(1);
      compute_threads_.Run([this] {
        Compute();
        Release();
      });
      return;
    }
    StartRead(&request_);
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      FinishWith(absl::CancelledError(
          "the stream broke while the output was being sent"));
      return;
    }
    WriteNext();
  }

  void OnCancel() override {
    cancelled_ = true;
    absl::MutexLock lock(&mutex_);
    if (communicator_ != nullptr) communicator_->Abort();
  }

  void OnDone() override { Release(); }

 private:
  // Only gRPC and the computation delete it (Release).
  ~ExecuteReactor() override {
    CloseRowStreams();
    if (lanes_ != nullptr) {
      lanes_->End(absl::CancelledError("its Execute stream ended"));
    }
  }

  // Drops one of the two holders: gRPC (until OnDone) and the computation.
  void Release() {
    if (holders_.fetch_sub(1) == 1) delete this;
  }

  // Where K/V come from for a query of a resident context.
  struct ContextLoad {
    std::string name;
    std::vector<Range> chunks;
    TypedView k;
    TypedView v;
  };

  void Log(spdlog::level::level_enum level, const std::string& message) const {
    if (rank_ < 0) {
      spdlog::log(level, "request {}: {}", request_id_, message);
      return;
    }
    spdlog::log(level, "request {} rank {}/{}: {}", request_id_, rank_,
                world_size_, message);
  }

  void FinishWith(absl::Status status) {
    status = PeerTimeoutAsUnavailable(std::move(status), deadline_);
    if (cancelled_ && !status.ok()) {
      status = absl::CancelledError(
          absl::StrCat("the stream was cancelled (", status.message(), ")"));
    }
    Log(status.ok() ? spdlog::level::info : spdlog::level::warn,
        absl::StrCat("finished: ", status.ToString()));
    // Attached streams still waiting for this stream's shard are refused
    // now rather than when it is freed, and those waiting for its output end
    // with its error.
    CloseRowStreams();
    if (lanes_ != nullptr && !status.ok()) lanes_->End(status);
    // The computation is over: give the execution slot back before the caller
    // hears the status, so that its next stream is admitted (the buffers
    // themselves go in OnDone, moments later).
    ticket_ = ExecutionBudget::Ticket();
    Finish(ToGrpcStatus(status));
  }

  absl::Status Accept(const v1::ExecuteRequest& request) {
    switch (request.kind_case()) {
      case v1::ExecuteRequest::kHeader:
        RINGATTN_RETURN_IF_ERROR(AcceptHeader(request.header()));
        RINGATTN_RETURN_IF_ERROR(OpenRowStreams());
        for (const v1::ShardRows& rows : request.header().rows()) {
          RINGATTN_RETURN_IF_ERROR(AcceptRows(rows));
        }
        return request.header().run() ? AcceptRun() : absl::OkStatus();
      case v1::ExecuteRequest::kRows:
        return AcceptRows(request.rows());
      case v1::ExecuteRequest::kRun:
        if (!request.run()) {
          return absl::InvalidArgumentError("'run' must be true");
        }
        return AcceptRun();
      case v1::ExecuteRequest::KIND_NOT_SET:
        break;
    }
    return absl::InvalidArgumentError(
        "an ExecuteRequest must hold a header, rows or run");
  }

  // 'run', on its own or in the header: every row must have arrived.
  absl::Status AcceptRun() {
    if (!has_executor()) {
      return absl::InvalidArgumentError(
          "'run' before the header: send the header first");
    }
    // The coordinator sends 'run' once its attached streams finished; any
    // still sending lose their rows now.
    CloseRowStreams();
    RINGATTN_RETURN_IF_ERROR(intake_->CheckComplete());
    run_requested_ = true;
    return absl::OkStatus();
  }

  // Lets AttachRows streams that present the header's rows_key place rows
  // into this stream's shard and then wait to carry part of its output.
  absl::Status OpenRowStreams() {
    if (!rows_key_.taken()) return absl::OkStatus();
    lanes_ = std::make_shared<OutputLanes>();
    return rows_key_.Open({intake_, lanes_});
  }

  // Ends attached rows: refuses streams that wait or come later, and waits
  // for rows being stored. Idempotent; after it the shard is stable.
  void CloseRowStreams() {
    rows_key_.Close();
    if (intake_ != nullptr) intake_->Close();
  }

  absl::Status AcceptHeader(const v1::ExecuteHeader& header) {
    if (has_executor()) {
      return absl::InvalidArgumentError(
          "a second header arrived; a stream has exactly one, first");
    }
    request_id_ = header.request_id().empty() ? "-" : header.request_id();
    rows_key_.Take(header.rows_key());
    absl::StatusOr<AttentionSpec> spec = SpecFromProto(header.spec());
    if (!spec.ok()) return spec.status();
    absl::StatusOr<DType> dtype = DTypeFromProto(header.spec().wire_dtype());
    if (!dtype.ok()) return dtype.status();
    absl::StatusOr<DType> output_dtype = OutputDType(header.spec());
    if (!output_dtype.ok()) return output_dtype.status();
    const v1::Strategy strategy = header.spec().strategy();
    if (header.world_size() < 1 || header.rank() < 0 ||
        header.rank() >= header.world_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("header: rank ", header.rank(),
                       " is not a rank of world size ", header.world_size()));
    }
    if (header.rendezvous_prefix().empty()) {
      return absl::InvalidArgumentError(
          "header: rendezvous_prefix is empty; it must name the request's "
          "ring");
    }
    const double timeout = header.timeout_seconds();
    if (!(timeout >= 0) || timeout > kMostTimeoutSeconds) {
      return absl::InvalidArgumentError(
          absl::StrCat("header: timeout_seconds must be in [0, ",
                       kMostTimeoutSeconds, "], got ", timeout));
    }
    spec_ = *spec;
    wire_dtype_ = *dtype;
    output_dtype_ = *output_dtype;
    broadcast_ = strategy == v1::BROADCAST_Q;
    merge_on_workers_ =
        broadcast_ && header.spec().partial_merge() == v1::MERGE_ON_WORKERS;
    rank_ = header.rank();
    world_size_ = header.world_size();
    prefix_ = header.rendezvous_prefix();
    communicator_key_ = header.communicator_key();
    communicator_slot_ = header.communicator_slot();
    ring_timeout_ =
        timeout == 0 ? options_.default_ring_timeout : absl::Seconds(timeout);
    if (merge_on_workers_) {
      RINGATTN_RETURN_IF_ERROR(
          ticket_.Reserve(PartialReductionScratchBytes(spec_)));
    }
    if (header.has_append()) {
      RINGATTN_RETURN_IF_ERROR(AcceptAppend(header));
    }
    std::optional<ShardLayout> kv_layout;
    if (!header.context().empty()) {
      if (header.kv_layout_size() != world_size_) {
        return absl::InvalidArgumentError(
            absl::StrCat("header: kv_layout has ", header.kv_layout_size(),
                         " entries for a world of ", world_size_));
      }
      std::vector<std::vector<Range>> chunks;
      for (const v1::KvChunks& worker : header.kv_layout()) {
        if (worker.begin_size() != worker.end_size()) {
          return absl::InvalidArgumentError(
              "header: kv_layout entries need as many ends as begins");
        }
        chunks.emplace_back();
        for (int i = 0; i < worker.begin_size(); ++i) {
          chunks.back().push_back(Range{worker.begin(i), worker.end(i)});
        }
      }
      kv_layout = ShardLayout::FromChunks(spec_.kv_len, std::move(chunks));
    }
    if (options_.cuda_device >= 0) {
      return AcceptGpuHeader(header, std::move(kv_layout), strategy);
    }
    if (strategy == v1::BROADCAST_Q) {
      return AcceptBroadcastHeader(header, std::move(kv_layout));
    }
    if (strategy == v1::PASS_Q) {
      return AcceptPassQHeader(header, std::move(kv_layout));
    }
    const DType kv_dtype = CopiedKvDType(header);
    RINGATTN_RETURN_IF_ERROR(ticket_.Reserve(RingExecutor::BytesNeeded(
        spec_, rank_, world_size_, kv_layout ? &*kv_layout : nullptr,
        kv_dtype)));
    absl::StatusOr<std::unique_ptr<RingExecutor>> executor =
        RingExecutor::Create(spec_, rank_, world_size_, std::move(kv_layout),
                             kv_dtype);
    if (!executor.ok()) return executor.status();
    executor_ = std::move(*executor);
    StageShard(header, executor_->q_layout(), rank_, TypedView(executor_->q()),
               executor_->kv_layout(), rank_, executor_->k(), executor_->v());
    LogHeader("", absl::StrCat(", K/V in ", DTypeName(kv_dtype)), "bytes");
    return absl::OkStatus();
  }

  // The rows a query appends to its context, carried by its header: stored
  // when 'run' arrives, before K and V are read.
  absl::Status AcceptAppend(const v1::ExecuteHeader& header) {
    const v1::StoreContextHeader& append = header.append();
    if (header.context().empty() || append.name() != header.context() ||
        append.create()) {
      return absl::InvalidArgumentError(
          "header: 'append' must add rows to the context the header names");
    }
    append_.emplace();
    return append_->Start(append);
  }

  // The rest of AcceptHeader on a CUDA worker: the shard is staged in host
  // memory in the compute dtype, then computed by a GpuRingExecutor. For
  // broadcast-Q that executor is a world of one holding every query row and
  // this rank's K/V, and it runs with no ring; for pass-Q its query blocks
  // travel the ring (CreatePassQ).
  absl::Status AcceptGpuHeader(const v1::ExecuteHeader& header,
                               std::optional<ShardLayout> kv_layout,
                               v1::Strategy strategy) {
    const bool broadcast = strategy == v1::BROADCAST_Q;
    const bool pass_q = strategy == v1::PASS_Q;
    GpuRingConfig config;
    config.device = options_.cuda_device;
    config.dtype = ComputeDTypeFor(wire_dtype_);
    config.host_staging = true;
    config.staging_pool = staging_pool_;
    config = TunedRingConfig(spec_, config);
    if (!header.context().empty()) {
      // Computed in the dtype the context is held in, read where it lies.
      absl::StatusOr<DeviceDType> held =
          device_contexts_->DTypeOf(header.context());
      if (!held.ok()) return held.status();
      config.dtype = *held;
      config.resident_kv = true;
    }
    // The executor's own rank: broadcast-Q runs a world of one.
    const int rank = broadcast ? 0 : rank_;
    if (broadcast) {
      absl::StatusOr<ShardLayout> layout =
          KvLayoutFor(spec_, world_size_, std::move(kv_layout));
      if (!layout.ok()) return layout.status();
      const ShardLayout own = WorldOfOne(*layout, rank_);
      RINGATTN_RETURN_IF_ERROR(ticket_.Reserve(
          GpuRingExecutor::DeviceBytesNeeded(spec_, 0, 1, config, &own)));
      kv_layout = std::move(*layout);
    } else {
      const ShardLayout* layout = kv_layout ? &*kv_layout : nullptr;
      RINGATTN_RETURN_IF_ERROR(ticket_.Reserve(
          pass_q ? GpuRingExecutor::PassQDeviceBytesNeeded(
                       spec_, rank_, world_size_, config, layout)
                 : GpuRingExecutor::DeviceBytesNeeded(spec_, rank_, world_size_,
                                                      config, layout)));
    }
    const absl::Time creating = absl::Now();
    absl::StatusOr<std::unique_ptr<GpuRingExecutor>> executor =
        broadcast ? GpuRingExecutor::CreateBroadcast(
                        spec_, rank_, world_size_, config, std::move(kv_layout))
        : pass_q ? GpuRingExecutor::CreatePassQ(spec_, rank_, world_size_,
                                                config, std::move(kv_layout))
                 : GpuRingExecutor::Create(spec_, rank_, world_size_, config,
                                           std::move(kv_layout));
    if (!executor.ok()) return executor.status();
    const absl::Duration creation = absl::Now() - creating;
    gpu_executor_ = std::move(*executor);
    GpuRingExecutor& e = *gpu_executor_;
    StageShard(header, e.q_layout(), rank, e.host_q(), e.kv_layout(), rank,
               e.host_k(), e.host_v());
    LogHeader(broadcast ? "broadcast-Q"
              : pass_q  ? "pass-Q"
                        : "",
              absl::StrFormat(" on cuda:%d in %s (its executor made in %.3f "
                              "ms%s)",
                              config.device, DeviceDTypeName(config.dtype),
                              absl::ToDoubleMilliseconds(creation),
                              e.staging_lent() ? ", staging lent" : ""),
              "device bytes");
    return absl::OkStatus();
  }

  // The dtype a CPU executor holds the K/V rows it copies in: that of the
  // rows it reads when they are bf16 (a bf16 context, or a request's own bf16
  // rows), which loses nothing and halves the bytes to hold, send and read;
  // fp32 otherwise, and for dilated requests.
  DType CopiedKvDType(const v1::ExecuteHeader& header) const {
    if (!spec_.dilated.empty()) return DType::kFloat32;
    if (!header.context().empty()) {
      absl::StatusOr<DType> held = host_contexts_->HeldDType(header.context());
      return held.ok() ? *held : DType::kFloat32;
    }
    return wire_dtype_ == DType::kBFloat16 ? DType::kBFloat16 : DType::kFloat32;
  }

  // How a broadcast-Q or pass-Q executor holds K and V: a query of a
  // context reads the context's rows where they lie (dilated specs aside);
  // otherwise the executor holds them itself, in CopiedKvDType.
  CpuKvHolding KvHoldingFor(const v1::ExecuteHeader& header) const {
    return CpuKvHolding{CopiedKvDType(header),
                        !header.context().empty() && spec_.dilated.empty()};
  }

  // What LogHeader says of how K and V are held.
  static std::string DescribeKvHolding(const CpuKvHolding& holding) {
    return holding.resident
               ? ", K/V read in place"
               : absl::StrCat(", K/V in ", DTypeName(holding.dtype));
  }

  // The rest of AcceptHeader for broadcast-Q: every query row and this rank's
  // K/V shard (held as KvHoldingFor says), computed by a BroadcastExecutor
  // without a ring.
  absl::Status AcceptBroadcastHeader(const v1::ExecuteHeader& header,
                                     std::optional<ShardLayout> kv_layout) {
    const CpuKvHolding holding = KvHoldingFor(header);
    kv_read_in_place_ = holding.resident;
    RINGATTN_RETURN_IF_ERROR(ticket_.Reserve(BroadcastExecutor::BytesNeeded(
        spec_, rank_, world_size_, kv_layout ? &*kv_layout : nullptr,
        holding)));
    absl::StatusOr<std::unique_ptr<BroadcastExecutor>> executor =
        BroadcastExecutor::Create(spec_, rank_, world_size_,
                                  std::move(kv_layout), holding);
    if (!executor.ok()) return executor.status();
    broadcast_executor_ = std::move(*executor);
    BroadcastExecutor& e = *broadcast_executor_;
    // The query rows form a world of one, held by its rank 0.
    StageShard(header, e.q_layout(), 0, TypedView(e.q()), e.kv_layout(), rank_,
               e.k(), e.v());
    LogHeader("broadcast-Q", DescribeKvHolding(holding), "bytes");
    return absl::OkStatus();
  }

  // The rest of AcceptHeader for pass-Q: the rank's Q and K/V shards as for
  // pass-KV (K/V held as KvHoldingFor says), computed by a PassQExecutor
  // (query blocks travel the ring).
  absl::Status AcceptPassQHeader(const v1::ExecuteHeader& header,
                                 std::optional<ShardLayout> kv_layout) {
    const CpuKvHolding holding = KvHoldingFor(header);
    kv_read_in_place_ = holding.resident;
    RINGATTN_RETURN_IF_ERROR(ticket_.Reserve(PassQExecutor::BytesNeeded(
        spec_, rank_, world_size_, kv_layout ? &*kv_layout : nullptr,
        holding)));
    absl::StatusOr<std::unique_ptr<PassQExecutor>> executor =
        PassQExecutor::Create(spec_, rank_, world_size_, std::move(kv_layout),
                              holding);
    if (!executor.ok()) return executor.status();
    pass_q_executor_ = std::move(*executor);
    PassQExecutor& e = *pass_q_executor_;
    StageShard(header, e.q_layout(), rank_, TypedView(e.q()), e.kv_layout(),
               rank_, e.k(), e.v());
    LogHeader("pass-Q", DescribeKvHolding(holding), "bytes");
    return absl::OkStatus();
  }

  bool has_executor() const {
    return executor_ != nullptr || gpu_executor_ != nullptr ||
           broadcast_executor_ != nullptr || pass_q_executor_ != nullptr;
  }

  absl::Status AcceptRows(const v1::ShardRows& rows) {
    if (intake_ == nullptr) {
      return absl::InvalidArgumentError(
          "ShardRows before the header: send the header first");
    }
    return intake_->Place(rows).status();
  }

  // Points the row targets at an executor's staging tensors: Q rows of
  // `q_layout`'s chunks of `q_rank`, K and V rows of `kv_layout`'s chunks of
  // `kv_rank`; K and V come from the resident context instead when the header
  // names one.
  void StageShard(const v1::ExecuteHeader& header, const ShardLayout& q_layout,
                  int q_rank, TypedView q, const ShardLayout& kv_layout,
                  int kv_rank, TypedView k, TypedView v) {
    q_chunks_ = q_layout.Chunks(q_rank);
    std::array<ShardRowsTarget, 3> targets = {
        ShardRowsTarget("Q", q, &q_layout, q_rank),
        ShardRowsTarget("K", k, &kv_layout, kv_rank),
        ShardRowsTarget("V", v, &kv_layout, kv_rank)};
    if (!header.context().empty()) {
      // K and V come from the resident context instead, at 'run'.
      context_load_ =
          ContextLoad{header.context(), kv_layout.Chunks(kv_rank), k, v};
      targets[1].MarkAllArrived();
      targets[2].MarkAllArrived();
    }
    intake_ = std::make_shared<ShardIntake>(std::move(targets), wire_dtype_);
    const int64_t staged = q.bytes() + k.bytes() + v.bytes();
    const bool page_locked =
        gpu_executor_ != nullptr && gpu_executor_->staging_lent();
    if (staged >= options_.background_page_fault_bytes && !page_locked) {
      // A CUDA worker's staging is also page-locked once it is in, so that
      // it crosses to the device (and O comes back) as DMA.
      BackgroundPageFaults::Then pin;
      if (gpu_executor_ != nullptr &&
          staged <= options_.most_pinned_staging_bytes) {
        pinned_ = std::make_unique<PinnedHostRegions>(options_.cuda_device);
        pin = [this](absl::Span<char> region) {
          if (absl::Status status = pinned_->Pin(region); !status.ok()) {
            Log(spdlog::level::debug, status.ToString());
          }
        };
      }
      page_faults_.emplace(
          std::vector<absl::Span<char>>{
              {q.data(), static_cast<size_t>(q.bytes())},
              {k.data(), static_cast<size_t>(k.bytes())},
              {v.data(), static_cast<size_t>(v.bytes())}},
          std::move(pin));
    }
  }

  // Logs the accepted header: the request's shapes, the shard staged for it
  // (`where`: on which device, in which dtype) and the memory reserved, in
  // `unit`.
  void LogHeader(absl::string_view strategy, absl::string_view where,
                 absl::string_view unit) {
    Log(spdlog::level::info,
        absl::StrCat("header", strategy.empty() ? "" : " (", strategy,
                     strategy.empty() ? "" : ")", ": batch ", spec_.batch,
                     ", q_len ", spec_.q_len, ", kv_len ", spec_.kv_len,
                     ", heads ", spec_.q_heads, "/", spec_.kv_heads,
                     ", head_dim ", spec_.head_dim, ", ",
                     DTypeName(wire_dtype_), "; shard of ",
                     intake_->target(0).rows().shape().seq, " query and ",
                     intake_->target(1).rows().shape().seq, " key rows", where,
                     ", ", ticket_.reserved_bytes(), " ", unit,
                     absl::StrFormat(
                         "; %.3f ms after the stream opened",
                         absl::ToDoubleMilliseconds(absl::Now() - opened_))));
  }

  // Gives the executor this rank's K/V rows of the resident context of
  // context_load_: read in place, or copied into a CPU pass-KV executor's
  // ring buffers (and a dilated request's). The rows a large query appends
  // travel on their own StoreContext stream and may still be on their way:
  // while some are missing it waits for the store to take more, at most the
  // ring timeout, and gives up if cancelled.
  absl::Status LoadContext() {
    const ContextLoad& load = *context_load_;
    ResidentContexts& store = contexts();
    const absl::Time give_up = std::min(deadline_, absl::Now() + ring_timeout_);
    for (;;) {
      const int64_t seen = store.additions();
      absl::Status loaded = TryLoadContext(load);
      if (!absl::IsFailedPrecondition(loaded)) return loaded;
      if (cancelled_) return absl::CancelledError("cancelled");
      if (absl::Now() >= give_up) return loaded;
      // Wakes now and then to notice a cancel.
      store.AwaitAddition(
          seen, std::min(give_up, absl::Now() + absl::Milliseconds(100)));
    }
  }

  ResidentContexts& contexts() {
    if (device_contexts_ != nullptr) return *device_contexts_;
    return *host_contexts_;
  }

  // Stores the rows the header's append carried; the bytes the context then
  // holds here go back in ExecuteDone.
  absl::Status StoreAppend() {
    absl::StatusOr<int64_t> bytes = append_->Commit(contexts());
    if (!bytes.ok()) return bytes.status();
    context_bytes_ = *bytes;
    context_dtype_ = HeldDTypeProto(contexts(), append_->name());
    Log(spdlog::level::info,
        absl::StrCat("context '", append_->name(), "': holds ", *bytes,
                     " bytes after positions [", append_->positions().begin,
                     ", ", append_->positions().end, ")"));
    return absl::OkStatus();
  }

  absl::Status TryLoadContext(const ContextLoad& load) {
    if (gpu_executor_ != nullptr) {
      absl::StatusOr<ResidentKv> kv =
          device_contexts_->Find(load.name, load.chunks);
      if (!kv.ok()) return kv.status();
      return gpu_executor_->UseResidentKv(*std::move(kv));
    }
    if (!kv_read_in_place_) {
      return host_contexts_->Copy(load.name, load.chunks, load.k, load.v);
    }
    absl::StatusOr<ResidentRows> rows =
        host_contexts_->Find(load.name, load.chunks);
    if (!rows.ok()) return rows.status();
    return broadcast_executor_ != nullptr
               ? broadcast_executor_->UseResidentRows(*std::move(rows))
               : pass_q_executor_->UseResidentRows(*std::move(rows));
  }

  // Runs on a compute thread: stores the rows the query appends, takes
  // resident context rows (LoadContext), joins the ring (none for
  // broadcast-Q), computes, starts writing the output.
  void Compute() {
    page_faults_.reset();
    if (append_.has_value()) {
      if (absl::Status stored = StoreAppend(); !stored.ok()) {
        FinishWith(stored);
        return;
      }
    }
    if (context_load_.has_value()) {
      if (absl::Status loaded = LoadContext(); !loaded.ok()) {
        FinishWith(loaded);
        return;
      }
    }
    if (broadcast_executor_ != nullptr) {
      Log(spdlog::level::info, "all rows arrived; computing (broadcast-Q)");
      absl::StatusOr<RingOutput> output = broadcast_executor_->Run(&cancelled_);
      broadcast_executor_.reset();
      if (output.ok() && merge_on_workers_) {
        HostPartials partials(output->o.floats(), output->lse.view());
        if (absl::Status reduced = ReduceOnWorkers(partials, output->stats);
            !reduced.ok()) {
          output = reduced;
        } else if (rank_ == 0) {
          // Narrowed once merged.
          NarrowOutput(*output);
        }
      }
      if (!output.ok()) {
        FinishWith(output.status());
        return;
      }
      StartOutput(std::move(*output));
      return;
    }
    absl::StatusOr<std::unique_ptr<RingCommunicator>> communicator = JoinRing();
    if (!communicator.ok()) {
      FinishWith(communicator.status());
      return;
    }
    SetCancelTarget(communicator->get());
    const RingOptions options = RunOptions();
    absl::StatusOr<RingOutput> output =
        gpu_executor_ != nullptr && merge_on_workers_
            ? RunGpuAndReduce(**communicator, options)
        : gpu_executor_ != nullptr
            ? gpu_executor_->RunStaged(
                  **communicator, options,
                  broadcast_ ? DType::kFloat32 : output_dtype_)
        : pass_q_executor_ != nullptr
            ? pass_q_executor_->Run(**communicator, options)
            : executor_->Run(**communicator, options);
    SetCancelTarget(nullptr);
    communicator->reset();
    if (!output.ok()) {
      DropExecutors();
      FinishWith(output.status());
      return;
    }
    // Broadcast-Q partials stay fp32: the coordinator merges them.
    if (!broadcast_) NarrowOutput(*output);
    StartOutput(std::move(*output));
    // Only once the output is on its way: freeing device memory waits for the
    // whole device. The writes touch nothing of the executors.
    DropExecutors();
  }

  void DropExecutors() {
    pinned_.reset();
    executor_.reset();
    gpu_executor_.reset();
    pass_q_executor_.reset();
  }

  // Converts O to the request's output dtype, so that the coordinator takes
  // rows of that width (half the bytes of fp32 for 16-bit outputs) and
  // forwards them as they are.
  void NarrowOutput(RingOutput& output) const {
    if (output.o.dtype() == output_dtype_) return;
    TypedTensor narrowed(output_dtype_, output.o.shape());
    CopyTyped(output.o.view(), narrowed.view());
    output.o = std::move(narrowed);
  }

  // This request's ring: a world of one on a GPU running alone (broadcast-Q
  // or a cluster of one), otherwise the connector's group of every rank: the
  // cached communicator when the header names its key, else a new one.
  absl::StatusOr<std::unique_ptr<RingCommunicator>> JoinRing() {
    if (gpu_executor_ != nullptr && gpu_executor_->world_size() == 1) {
      Log(spdlog::level::info,
          absl::StrCat(
              "all rows arrived; computing on cuda:", options_.cuda_device,
              broadcast_ ? " (broadcast-Q)" : ""));
      return std::make_unique<SoloCommunicator>();
    }
    Log(spdlog::level::info, "all rows arrived; joining the ring");
    return ConnectGroup();
  }

  // The communicator of every rank of the request: the cached one when the
  // header names its key, else a new one for this request alone.
  absl::StatusOr<std::unique_ptr<RingCommunicator>> ConnectGroup() {
    const absl::Time start = absl::Now();
    const absl::Duration connect_timeout =
        std::min(ring_timeout_, deadline_ - start);
    if (connect_timeout <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(
          "the call's deadline passed before the ring was joined");
    }
    bool reused = false;
    absl::StatusOr<std::unique_ptr<RingCommunicator>> communicator =
        communicator_key_.empty()
            ? connector_.Connect(prefix_, rank_, world_size_, connect_timeout,
                                 &cancelled_)
            : communicators_.Lend(communicator_key_, communicator_slot_, rank_,
                                  world_size_, connect_timeout, &reused,
                                  &cancelled_);
    if (communicator.ok()) {
      Log(spdlog::level::info,
          absl::StrCat("joined the ring in ",
                       absl::FormatDuration(absl::Now() - start),
                       communicator_key_.empty() ? ""
                       : reused                  ? " (cached communicator)"
                                : " (new cached communicator)"));
    }
    return communicator;
  }

  // Broadcast-Q on a GPU with the merge on the workers: computes this rank's
  // partial over its keys (over `solo`, a world of one), reduces the
  // partials to rank 0 on the devices, and brings back rank 0's output in the
  // output dtype (the other ranks return no rows).
  absl::StatusOr<RingOutput> RunGpuAndReduce(RingCommunicator& solo,
                                             const RingOptions& options) {
    GpuRingExecutor& e = *gpu_executor_;
    absl::StatusOr<GpuRingStats> stats = e.RunUploaded(solo, options);
    if (!stats.ok()) return stats.status();
    const Shape shape = e.q_shape();
    absl::StatusOr<std::unique_ptr<DevicePartials>> partials =
        DevicePartials::Create(
            options_.cuda_device, e.device_o(), e.device_lse(),
            shape.batch * shape.seq * shape.heads, shape.dim, e.stream());
    if (!partials.ok()) return partials.status();
    RingOutput output;
    output.stats = stats->ring;
    RINGATTN_RETURN_IF_ERROR(ReduceOnWorkers(**partials, output.stats));
    if (rank_ != 0) return output;
    absl::StatusOr<RingOutput> merged = e.DownloadOutput(output_dtype_);
    if (!merged.ok()) return merged.status();
    merged->stats = output.stats;
    return merged;
  }

  // Broadcast-Q with the merge on the workers: joins the request's
  // communicator and folds every rank's partial into rank 0's `partials`
  // (partial_reduction.h), counting its transfers and waits into `stats`.
  // Afterwards rank 0 returns the merged rows in the output dtype and the
  // other ranks none. A world of one has nothing to reduce.
  absl::Status ReduceOnWorkers(PartialBuffers& partials, RingRunStats& stats) {
    if (world_size_ > 1) {
      Log(spdlog::level::info, "computed; joining the partial reduction");
      absl::StatusOr<std::unique_ptr<RingCommunicator>> communicator =
          ConnectGroup();
      if (!communicator.ok()) return communicator.status();
      SetCancelTarget(communicator->get());
      absl::StatusOr<ReductionStats> reduced =
          ReduceToRankZero(**communicator, partials, RunOptions());
      SetCancelTarget(nullptr);
      communicator->reset();
      if (!reduced.ok()) return reduced.status();
      stats.transfers += reduced->transfers;
      stats.bytes_sent += reduced->bytes_sent;
      stats.wait_seconds += reduced->wait_seconds;
      Log(spdlog::level::info,
          absl::StrCat("reduced the partials in ", reduced->rounds, " rounds, ",
                       reduced->wait_seconds, " s waiting"));
    }
    if (rank_ != 0) q_chunks_.clear();
    return absl::OkStatus();
  }

  // Makes `communicator` the one OnCancel aborts (nullptr: none while no
  // communication runs); a cancel that came earlier aborts it at once.
  void SetCancelTarget(RingCommunicator* communicator) {
    {
      absl::MutexLock lock(&mutex_);
      communicator_ = communicator;
    }
    if (communicator != nullptr && cancelled_) communicator->Abort();
  }

  // The waits of this request's communication: each at most the ring
  // timeout, none past the call's deadline, all ended by a cancel.
  RingOptions RunOptions() const {
    RingOptions options;
    options.step_timeout = ring_timeout_;
    options.deadline = deadline_;
    options.cancelled = &cancelled_;
    return options;
  }

  // Logs what was computed and starts writing `output`, over the attached
  // streams too if there are any.
  void StartOutput(RingOutput output) {
    stats_ = output.stats;
    const RingRunStats& stats = stats_;
    Log(spdlog::level::info,
        absl::StrCat("computed: ", stats.steps, " steps, ", stats.transfers,
                     " blocks sent, ", stats.tasks,
                     " tasks (kernels: ", stats.launches.ToString(), "), ",
                     stats.compute_seconds, " s computing (",
                     stats.compute_seconds > 0
                         ? stats.flops / stats.compute_seconds / 1e9
                         : 0.0,
                     " GFLOP/s), ", stats.wait_seconds, " s waiting"));
    dealer_ = std::make_shared<OutputDealer>(
        std::move(output.o), std::move(output.lse), q_chunks_,
        spec_.hilbert.has_value(), kFirstOutputMessageBytes,
        kOutputMessageBytes);
    if (lanes_ != nullptr) lanes_->Start(dealer_);
    WriteNext();
  }

  // Starts writing the next output rows; the last of them go with the
  // ExecuteDone and the status in one message (a shard that fits one message,
  // as a decode step's does, needs a single write). Touches nothing after
  // StartWrite: OnWriteDone may already be running.
  void WriteNext() {
    response_.Clear();
    if (!dealer_->Next(response_.mutable_output())) response_.clear_output();
    if (response_.has_output() && dealer_->HasMore()) {
      StartWrite(&response_);
      return;
    }
    const RingRunStats& stats = stats_;
    v1::ExecuteDone* done = response_.mutable_done();
    done->set_peak_bytes(stats.peak_bytes);
    done->set_compute_seconds(stats.compute_seconds);
    done->set_flops(stats.flops);
    done->set_ring_steps(stats.steps);
    done->set_transfers(stats.transfers);
    done->set_context_bytes(context_bytes_);
    done->set_context_dtype(context_dtype_);
    for (const auto& [kernel, launches] : stats.launches.Named()) {
      (*done->mutable_kernel_launches())[kernel] = launches;
    }
    Log(spdlog::level::info,
        absl::StrCat("output handed out in ", dealer_->messages(), " messages",
                     lanes_ != nullptr ? " over attached streams too" : "",
                     "; finished: OK"));
    ticket_ = ExecutionBudget::Ticket();
    StartWriteAndFinish(&response_, grpc::WriteOptions(), grpc::Status::OK);
  }

  grpc::CallbackServerContext* const context_;  // gRPC's, until OnDone
  RingConnector& connector_;
  CommunicatorCache& communicators_;
  ComputeThreads& compute_threads_;
  ContextStore* const host_contexts_;          // on a CPU worker
  DeviceContextStore* const device_contexts_;  // on a CUDA worker
  PinnedStagingPool* const staging_pool_;      // on a CUDA worker, or null
  const WorkerServiceOptions& options_;
  const absl::Time deadline_;
  const absl::Time opened_;  // when gRPC made the stream
  ExecutionBudget::Ticket ticket_;

  v1::ExecuteRequest request_;
  v1::ExecuteResponse response_;

  // From the header.
  std::string request_id_ = "-";
  AttentionSpec spec_;
  DType wire_dtype_ = DType::kFloat32;
  DType output_dtype_ = DType::kFloat32;
  bool broadcast_ = false;  // strategy BROADCAST_Q: partial outputs, fp32
  // Broadcast-Q merged on the workers: rank 0 returns the merged rows.
  bool merge_on_workers_ = false;
  int rank_ = -1;
  int world_size_ = 0;
  std::string prefix_;
  std::string communicator_key_;  // empty: a communicator of its own
  int communicator_slot_ = 0;     // the key's slot
  absl::Duration ring_timeout_;

  // The shard as it arrives.
  std::unique_ptr<RingExecutor> executor_;
  // Instead of executor_ on a CUDA worker.
  std::unique_ptr<GpuRingExecutor> gpu_executor_;
  // Instead of executor_ for broadcast-Q.
  std::unique_ptr<BroadcastExecutor> broadcast_executor_;
  // Instead of executor_ for pass-Q.
  std::unique_ptr<PassQExecutor> pass_q_executor_;
  // Where the shard's rows land, from this stream and attached ones.
  std::shared_ptr<ShardIntake> intake_;
  // The header's rows_key while attached streams may place rows.
  RowsKeyClaim rows_key_;
  // A large shard's staging on a CUDA worker, page-locked; and what faults
  // its pages in ahead of its rows (and then locks them).
  std::unique_ptr<PinnedHostRegions> pinned_;
  std::optional<BackgroundPageFaults> page_faults_;
  std::optional<ContextLoad> context_load_;  // for a query of a context
  // A CPU executor reads the context's rows where they lie (not a copy).
  bool kv_read_in_place_ = false;
  std::optional<ContextPiece> append_;  // rows the query appends
  int64_t context_bytes_ = 0;  // held for the context once they are stored
  v1::DType context_dtype_ = v1::DTYPE_UNSPECIFIED;  // ... and its dtype
  bool run_requested_ = false;

  // The computation.
  std::atomic<int> holders_{1};  // gRPC, and the computation once started
  std::atomic<bool> cancelled_{false};
  absl::Mutex mutex_;
  RingCommunicator* communicator_ ABSL_GUARDED_BY(mutex_) = nullptr;

  // The output: the positions of this rank's query rows, what computing
  // them took, and their rows as handed out to this stream and the attached
  // ones waiting for output (lanes_, with the header's rows_key).
  std::vector<Range> q_chunks_;
  RingRunStats stats_;
  std::shared_ptr<OutputDealer> dealer_;
  std::shared_ptr<OutputLanes> lanes_;
};

// One StoreContext stream: the header, then the K and V rows of this worker's
// new piece of a context (ContextPiece), some of them perhaps on AttachRows
// streams that present the header's rows_key and end as this stream does.
// The piece is stored on a compute thread: a large one takes seconds to reach
// the device, and a gRPC thread blocked that long would leave the
// coordinator's keepalive pings unanswered. On a CUDA worker its pages are
// locked as they fault in, so that it reaches the device as DMA. Deletes
// itself in OnDone.
class StoreContextReactor final
    : public grpc::ServerReadReactor<v1::StoreContextRequest> {
 public:
  StoreContextReactor(grpc::CallbackServerContext* context,
                      ResidentContexts& contexts, ComputeThreads& threads,
                      AttachedRowStreams& attached_rows,
                      const WorkerServiceOptions& options,
                      v1::StoreContextResponse* response)
      : context_(context),
        contexts_(contexts),
        threads_(threads),
        response_(response),
        piece_(options.cuda_device, options.most_pinned_staging_bytes),
        rows_key_(attached_rows) {
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (ok) {
      if (const absl::Status status = Accept(request_); !status.ok()) {
        End(status);
        return;
      }
      StartRead(&request_);
      return;
    }
    // The coordinator closes this stream once its attached streams answered
    // that their rows are stored; later rows are not part of the piece. It
    // cancels the stream when the upload failed elsewhere: a piece not yet
    // stored by then is not stored (it drops those that were).
    rows_key_.Close();
    // A cancel fails the read too (whether or not OnCancel came yet).
    if (context_->IsCancelled()) {
      End(absl::CancelledError("the upload was cancelled; nothing stored"));
      return;
    }
    threads_.Run([this] { End(Commit()); });
  }

  void OnDone() override { delete this; }

 private:
  ~StoreContextReactor() override {
    rows_key_.Close();
    if (lanes_ != nullptr) {
      lanes_->End(absl::CancelledError("its StoreContext stream ended"));
    }
  }

  // Ends the attached streams and then this one with `status`.
  void End(const absl::Status& status) {
    rows_key_.Close();
    if (lanes_ != nullptr) lanes_->End(status);
    Finish(ToGrpcStatus(status));
  }

  absl::Status Accept(const v1::StoreContextRequest& request) {
    if (request.has_header()) {
      started_ = absl::Now();
      // Taken first: attached streams waiting for a refused header hear so.
      rows_key_.Take(request.header().rows_key());
      RINGATTN_RETURN_IF_ERROR(piece_.Start(request.header()));
      if (!rows_key_.taken()) return absl::OkStatus();
      // Attached streams place rows into the piece and wait for its outcome.
      lanes_ = std::make_shared<OutputLanes>();
      return rows_key_.Open({piece_.intake(), lanes_});
    }
    if (!request.has_rows()) {
      return absl::InvalidArgumentError(
          "a StoreContextRequest must hold a header or rows");
    }
    return piece_.Place(request.rows());
  }

  absl::Status Commit() {
    const absl::Time arrived = absl::Now();
    absl::StatusOr<int64_t> bytes = piece_.Commit(contexts_);
    if (!bytes.ok()) return bytes.status();
    response_->set_bytes(*bytes);
    response_->set_dtype(HeldDTypeProto(contexts_, piece_.name()));
    spdlog::info(
        "context '{}': holds {} bytes after positions [{}, {}); rows arrived "
        "in {:.3f} s, stored in {:.3f} s",
        piece_.name(), *bytes, piece_.positions().begin, piece_.positions().end,
        absl::ToDoubleSeconds(arrived - started_),
        absl::ToDoubleSeconds(absl::Now() - arrived));
    return absl::OkStatus();
  }

  grpc::CallbackServerContext* const context_;  // gRPC's, until OnDone
  ResidentContexts& contexts_;
  ComputeThreads& threads_;
  v1::StoreContextResponse* const response_;
  absl::Time started_;  // when the header came
  v1::StoreContextRequest request_;
  ContextPiece piece_;
  // The header's rows_key while attached streams may join.
  RowsKeyClaim rows_key_;
  // The attached streams waiting for the piece's outcome.
  std::shared_ptr<OutputLanes> lanes_;
};

// One AttachRows stream: waits for the Execute (or StoreContext) stream whose
// header named its key, places its rows into that stream's shard (or piece)
// until the coordinator closes its side, answers how many it stored, then
// carries the output rows its OutputLanes deal it (or ends as they say). After
// the rows, `mutex_` orders the writes with the lanes' answer (Start or End),
// which may come on any thread. Deletes itself in OnDone, which may run on a
// gRPC thread as soon as Finish is called: so Finish comes after the lock is
// released, and nothing of the stream is touched after it.
class AttachRowsReactor final
    : public grpc::ServerBidiReactor<v1::ExecuteRequest, v1::ExecuteResponse>,
      public AttachedRowStreams::Waiter,
      public OutputLanes::Lane {
 public:
  AttachRowsReactor(grpc::CallbackServerContext* context,
                    AttachedRowStreams& streams)
      : streams_(streams) {
    const auto& metadata = context->client_metadata();
    const auto key = metadata.find(kRowsKeyMetadata);
    if (key == metadata.end()) {
      Finish(ToGrpcStatus(absl::InvalidArgumentError(
          absl::StrCat("AttachRows needs the initial metadata '",
                       kRowsKeyMetadata, "' naming an Execute stream"))));
      return;
    }
    key_.assign(key->second.data(), key->second.size());
    // May answer at once, through Attach or Refuse.
    streams_.Await(key_, this);
  }

  void Attach(AttachedShard shard) override {
    {
      absl::MutexLock lock(&mutex_);
      lanes_ = shard.lanes;
    }
    intake_ = std::move(shard.intake);
    StartRead(&request_);
  }

  void Refuse(absl::Status status) override { Finish(ToGrpcStatus(status)); }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // Every row of this stream is stored: say so, then wait for output.
      std::shared_ptr<OutputLanes> lanes;
      {
        absl::MutexLock lock(&mutex_);
        response_.set_rows_stored(rows_);
        writing_ = true;
        StartWrite(&response_);
        lanes = lanes_;
      }
      lanes->Join(this);
      return;
    }
    if (!request_.has_rows()) {
      Finish(ToGrpcStatus(absl::InvalidArgumentError(
          "an AttachRows stream carries rows only; the header and 'run' go "
          "on the Execute stream")));
      return;
    }
    absl::StatusOr<int64_t> placed = intake_->Place(request_.rows());
    if (!placed.ok()) {
      Finish(ToGrpcStatus(placed.status()));
      return;
    }
    rows_ += *placed;
    StartRead(&request_);
  }

  void Start(std::shared_ptr<OutputDealer> dealer) override {
    std::optional<grpc::Status> finish;
    {
      absl::MutexLock lock(&mutex_);
      dealer_ = std::move(dealer);
      if (writing_) return;
      finish = ended_.has_value() ? ToGrpcStatus(*ended_) : WriteNextLocked();
    }
    if (finish.has_value()) Finish(*finish);
  }

  void End(absl::Status status) override {
    {
      absl::MutexLock lock(&mutex_);
      if (writing_) {
        ended_ = std::move(status);
        return;
      }
    }
    Finish(ToGrpcStatus(status));
  }

  void OnWriteDone(bool ok) override {
    std::optional<grpc::Status> finish;
    {
      absl::MutexLock lock(&mutex_);
      writing_ = false;
      if (!ok) {
        const absl::Status broken = absl::CancelledError(
            "the stream broke while the output was being sent");
        // Until the lanes answer, it is theirs to finish.
        if (dealer_ == nullptr && !ended_.has_value() && !lanes_->Leave(this)) {
          ended_ = broken;
          return;
        }
        finish = ToGrpcStatus(broken);
      } else if (ended_.has_value()) {
        finish = ToGrpcStatus(*ended_);
      } else if (dealer_ != nullptr) {
        finish = WriteNextLocked();
      }
    }
    if (finish.has_value()) Finish(*finish);
  }

  void OnCancel() override {
    // Still waiting for its Execute stream's header, or for output: nothing
    // else will answer it.
    if (streams_.Forget(key_, this)) {
      Finish(ToGrpcStatus(absl::CancelledError(
          "cancelled while waiting for its Execute stream's header")));
      return;
    }
    bool left = false;
    {
      absl::MutexLock lock(&mutex_);
      left = lanes_ != nullptr && !writing_ && lanes_->Leave(this);
    }
    if (left) {
      Finish(ToGrpcStatus(
          absl::CancelledError("cancelled while waiting for the output")));
    }
  }

  void OnDone() override { delete this; }

 private:
  // Starts writing the next output rows; once all are out, the status to
  // finish with instead.
  std::optional<grpc::Status> WriteNextLocked()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    response_.Clear();
    if (!dealer_->Next(response_.mutable_output())) return grpc::Status::OK;
    writing_ = true;
    StartWrite(&response_);
    return std::nullopt;
  }

  AttachedRowStreams& streams_;
  std::string key_;
  std::shared_ptr<ShardIntake> intake_;
  v1::ExecuteRequest request_;
  int64_t rows_ = 0;

  absl::Mutex mutex_;
  std::shared_ptr<OutputLanes> lanes_ ABSL_GUARDED_BY(mutex_);
  v1::ExecuteResponse response_ ABSL_GUARDED_BY(mutex_);
  bool writing_ ABSL_GUARDED_BY(mutex_) = false;
  std::shared_ptr<OutputDealer> dealer_ ABSL_GUARDED_BY(mutex_);
  std::optional<absl::Status> ended_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace

int64_t DefaultMostPinnedStagingBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_bytes = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_bytes <= 0) return int64_t{16} << 30;
  return static_cast<int64_t>(pages) * page_bytes / 4;
}

WorkerService::WorkerService(RingConnector& connector,
                             const WorkerServiceOptions& options)
    : connector_(connector),
      communicators_(connector),
      options_(options),
      budget_(options.max_concurrent_executions, options.memory_bytes),
      compute_threads_(options.compute_linger) {
  if (options.cuda_device >= 0) {
    device_contexts_ = std::make_unique<DeviceContextStore>(
        options.cuda_device, options.context_memory_bytes);
    if (options.pinned_staging_buffer_bytes > 0) {
      staging_pool_ = std::make_unique<PinnedStagingPool>(
          options.cuda_device, options.pinned_staging_buffer_bytes,
          options.max_concurrent_executions);
      const absl::Time start = absl::Now();
      const int buffers = staging_pool_->Fill();
      spdlog::info("page-locked {} staging buffers of {} MiB in {}", buffers,
                   options.pinned_staging_buffer_bytes >> 20,
                   absl::FormatDuration(absl::Now() - start));
    }
  } else {
    host_contexts_ =
        std::make_unique<ContextStore>(options.context_memory_bytes);
  }
}

grpc::ServerBidiReactor<v1::ExecuteRequest, v1::ExecuteResponse>*
WorkerService::Execute(grpc::CallbackServerContext* context) {
  return new ExecuteReactor(context, connector_, communicators_,
                            compute_threads_, host_contexts_.get(),
                            device_contexts_.get(), attached_rows_,
                            staging_pool_.get(), options_, budget_.Admit());
}

grpc::ServerBidiReactor<v1::ExecuteRequest, v1::ExecuteResponse>*
WorkerService::AttachRows(grpc::CallbackServerContext* context) {
  return new AttachRowsReactor(context, attached_rows_);
}

ResidentContexts& WorkerService::contexts() {
  if (device_contexts_ != nullptr) return *device_contexts_;
  return *host_contexts_;
}

grpc::ServerReadReactor<v1::StoreContextRequest>* WorkerService::StoreContext(
    grpc::CallbackServerContext* context, v1::StoreContextResponse* response) {
  return new StoreContextReactor(context, contexts(), compute_threads_,
                                 attached_rows_, options_, response);
}

grpc::ServerUnaryReactor* WorkerService::DropContext(
    grpc::CallbackServerContext* context, const v1::DropContextRequest* request,
    v1::DropContextResponse*) {
  contexts().Undo(request->name(), request->keep_length(),
                  request->undone_appends());
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace ringattn
