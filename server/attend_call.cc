#include "server/attend_call.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "core/block_mask.h"
#include "core/dtype.h"
#include "core/status_macros.h"
#include "core/tensor.h"
#include "kernels/cpu/merge_with_lse.h"
#include "proto/grpc_status.h"
#include "proto/spec_conversion.h"
#include "ringattn/v1/worker.grpc.pb.h"
#include "server/chunk_routing.h"
#include "server/context_append.h"
#include "server/context_upload.h"
#include "server/merge_choice.h"
#include "server/one_message_executes.h"
#include "server/request_layout.h"
#include "server/row_coverage.h"
#include "server/row_stream.h"
#include "server/shared_download.h"
#include "server/shared_upload.h"
#include "server/strategy_choice.h"
#include "server/worker_writer.h"
#include "spdlog/spdlog.h"

namespace ringattn {
namespace {

using Clock = std::chrono::steady_clock;
using ExecuteStream =
    grpc::ClientReaderWriter<v1::ExecuteRequest, v1::ExecuteResponse>;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

const char* TensorLabel(v1::TensorName tensor) {
  return tensor == v1::Q ? "Q" : tensor == v1::K ? "K" : "V";
}

// One worker's Execute stream for this call.
struct WorkerLink {
  Cluster::Member member;
  grpc::ClientContext context;
  // A large upload: the stream, its messages written on a thread of their
  // own and its responses read on another.
  std::unique_ptr<ExecuteStream> stream;
  std::unique_ptr<WorkerWriter> writer;  // destroyed before the stream
  // A large upload's rows go round these and the Execute stream.
  std::vector<std::unique_ptr<RowStream>> row_streams;
  size_t next_row_stream = 0;
  // A small upload: the header, collecting the worker's rows, sent whole
  // with 'run' as the stream's only message (Call::executes_).
  std::optional<v1::ExecuteRequest> whole;
};

// Requests that upload at most this much reach each worker as one message
// (header, rows and 'run'; worker.proto), written once the client's upload
// is read: every message on a stream costs a write and a wake-up on both
// sides, and a writer thread per worker pays off only for uploads long
// enough to overlap with reading the client.
constexpr int64_t kMostWholeUploadBytes = int64_t{1} << 20;

// The LSE of an OutputChunk, [heads, rows], from `lse` [rows, heads] as
// workers send it.
std::string ChunkLse(const float* lse, int64_t rows, int64_t heads) {
  std::string bytes(static_cast<size_t>(rows * heads) * sizeof(float), '\0');
  float* transposed = reinterpret_cast<float*>(bytes.data());
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t h = 0; h < heads; ++h)
      transposed[h * rows + t] = lse[t * heads + h];
  }
  return bytes;
}

// Output rows that arrived ahead of their turn: a run of consecutive tokens.
struct OutputRun {
  int64_t count = 0;
  std::string o;           // [count, Hq, D] in the request's output dtype
  std::vector<float> lse;  // [count, Hq]
};

class Call {
 public:
  Call(const CoordinatorState& state, grpc::ServerContext* context,
       RequestStream* stream, std::string request_id)
      : state_(state),
        context_(context),
        stream_(stream),
        request_id_(std::move(request_id)),
        prefix_(absl::StrCat("request/", request_id_, "/")) {}

  ~Call() {
    if (shared_download_ != nullptr) {
      // OK once Finish returned; otherwise attached streams end with it.
      shared_download_->Fail(
          absl::CancelledError("the request failed; its Attend call says why"));
      state_.downloads->Remove(request_id_);
    }
    // Cancelling a stream that has ended costs as much as cancelling one
    // that runs (gRPC still takes the cancellation through the call): tens of
    // microseconds of a decode step before its status goes out.
    if (!streams_ended_) CancelWorkers();
    executes_.reset();
    for (std::thread& reader : readers_) reader.join();
    state_.store->EraseWithPrefix(prefix_);
  }

  absl::Status Run();

 private:
  // Everything Run does but settling a decode step's appended rows.
  absl::Status RunSteps();
  absl::Status ReadHeader();
  absl::Status UseResidentContext();
  absl::Status CheckSize();
  absl::Status OpenWorkers();
  absl::Status Upload();
  // Upload's reading and routing of the chunks, from the call's own stream
  // and any attached streams.
  absl::Status ReadChunks();
  // Hands out the ticket attached streams present, if the header asked for
  // them (upload or download streams).
  void StartSharedUpload();
  // No more chunks from attached streams; those still open are cancelled.
  void EndSharedUpload();
  // Sends the rows of `chunk` to the workers that own them (its data may be
  // moved away).
  absl::Status RouteChunk(v1::TensorChunk& chunk, int64_t index);
  // Queues `request` for worker `worker`; the error of a failed worker.
  absl::Status SendToWorker(int64_t worker, v1::ExecuteRequest request);
  // Ends worker `worker`'s AttachRows streams once their rows are written.
  absl::Status FinishRowStreams(int64_t worker);
  // The error of worker `worker` whose AttachRows stream ended with
  // `status`.
  absl::Status RowStreamError(int64_t worker, grpc::Status status);
  absl::Status CheckComplete();
  absl::Status Compute();
  // Sends each worker its last message and reads its responses: on this
  // thread for a small request, otherwise on a thread per stream (a worker's
  // Execute stream and AttachRows streams all bring output).
  absl::Status StartWorkers();
  // The next response or stream end of any worker; none if `timeout` passed.
  std::optional<WorkerEvent> NextEvent(absl::Duration timeout);
  absl::Status TakeResponse(int rank, v1::ExecuteResponse& response);
  // The dtype of a worker's output chunk, once its sizes are checked.
  absl::StatusOr<DType> CheckOutputSize(const v1::ShardOutput& output) const;
  // Queues the rows of `output` until their turn (its data may be moved
  // away).
  absl::Status TakeOutput(v1::ShardOutput& output);
  // With forward_output_: sends the rows of `output` to the client as one
  // chunk, dealt over the download streams, from the thread that read them
  // (its data may be moved away).
  absl::Status ForwardOutput(v1::ShardOutput& output);
  // The first failure of ForwardOutput; OK if none.
  absl::Status ForwardFailure();
  absl::Status MergePartial(const v1::ShardOutput& output);
  absl::Status EmitMerged();
  absl::Status EmitReady(bool flush);
  absl::Status WorkerError(int rank, const grpc::Status& status);
  void CancelWorkers();
  v1::Summary MakeSummary();

  const CoordinatorState& state_;
  grpc::ServerContext* const context_;
  RequestStream* const stream_;
  const std::string request_id_;
  const std::string prefix_;
  const Clock::time_point start_ = Clock::now();

  v1::AttentionSpec spec_proto_;
  AttentionSpec spec_;
  std::optional<ResidentContext> resident_;  // Query only
  bool appending_ =
      false;  // a Query that appends new K/V first (holds the context)
  std::unique_ptr<ContextAppend> append_;
  DType dtype_ = DType::kFloat32;
  DType output_dtype_ = DType::kFloat32;
  v1::Strategy strategy_ = v1::PASS_KV;
  // Broadcast-Q: where the partials merge (OpenWorkers chooses); MERGE_AUTO
  // for the other strategies.
  v1::PartialMerge merge_ = v1::MERGE_AUTO;
  std::optional<RequestLayout> layout_;
  std::vector<std::unique_ptr<WorkerLink>> workers_;
  // A small request's streams (reset before workers_ goes).
  std::optional<OneMessageExecutes> executes_;
  std::vector<std::thread> readers_;
  // Streams whose responses Compute reads until they end: each worker's
  // Execute stream and its AttachRows streams.
  size_t streams_running_ = 0;
  bool streams_ended_ = false;         // Compute saw every one of them end
  std::vector<RowCoverage> coverage_;  // [tensor * batch + b]
  AdmissionControl::Ticket ticket_;
  // With upload_streams > 1: the chunks from every stream go through it.
  std::shared_ptr<SharedUpload> shared_upload_;
  // With download_streams > 1: the output chunks go round it.
  std::shared_ptr<SharedDownload> shared_download_;
  // The workers' kept ring communicator, if this request got it.
  CommunicatorKeys::Lease communicator_;

  absl::Mutex mutex_;
  std::deque<WorkerEvent> events_ ABSL_GUARDED_BY(mutex_);
  // Output rows go from the threads that read the workers straight to the
  // client's download streams, in whatever order they come, instead of
  // through this call's thread in token order (StartWorkers decides); those
  // threads write the call's own stream in turn, under forward_writes_.
  bool forward_output_ = false;
  absl::Mutex forward_writes_;
  std::atomic<int64_t> rows_forwarded_{0};
  std::atomic<int64_t> bytes_forwarded_{0};
  absl::Status forward_failure_ ABSL_GUARDED_BY(mutex_);

  std::map<int64_t, OutputRun> pending_;  // by b * Nq + token
  // Broadcast-Q merged at the coordinator: every row's output merged over the
  // partials so far.
  std::vector<float> merged_o_;    // [B, Nq, Hq, D]
  std::vector<float> merged_lse_;  // [B, Nq, Hq]
  int64_t merged_rows_ = 0;        // partial rows merged, over all workers
  int64_t next_row_ = 0;
  v1::OutputChunk chunk_;
  int64_t upload_bytes_ = 0;  // what the client will send, as CheckSize counted
  int64_t bytes_in_ = 0;
  int64_t bytes_out_ = 0;
  double upload_seconds_ = 0;
  double start_seconds_ = 0;  // of compute_seconds_: handing the workers 'run'
  double compute_seconds_ = 0;
  std::vector<v1::ExecuteDone> done_;  // by rank
};

absl::Status Call::ReadHeader() {
  v1::AttendRequest request;
  if (!stream_->Read(&request)) {
    return absl::InvalidArgumentError(
        "the stream ended before the header: send an AttentionSpec first");
  }
  if (!request.has_header()) {
    return absl::InvalidArgumentError(
        "the first message must be the header (an AttentionSpec); got a "
        "tensor chunk");
  }
  spec_proto_ = request.header();
  RINGATTN_RETURN_IF_ERROR(
      CheckStreamCount("upload_streams", spec_proto_.upload_streams()));
  RINGATTN_RETURN_IF_ERROR(
      CheckStreamCount("download_streams", spec_proto_.download_streams()));
  if (!stream_->context_name().empty()) {
    RINGATTN_RETURN_IF_ERROR(UseResidentContext());
  }
  absl::StatusOr<AttentionSpec> spec = SpecFromProto(spec_proto_);
  if (!spec.ok()) return spec.status();
  spec_ = *spec;
  absl::StatusOr<DType> dtype = DTypeFromProto(spec_proto_.wire_dtype());
  if (!dtype.ok()) return dtype.status();
  dtype_ = *dtype;
  absl::StatusOr<DType> output_dtype = OutputDType(spec_proto_);
  if (!output_dtype.ok()) return output_dtype.status();
  output_dtype_ = *output_dtype;
  // Refuses what no cluster could run before anything is uploaded; the
  // choice itself waits for the workers (OpenWorkers).
  RINGATTN_RETURN_IF_ERROR(
      ChoosePartialMerge(spec_, spec_proto_.partial_merge(), /*workers=*/1,
                         DTypeSize(output_dtype_), CpuMergeRates(),
                         /*communicator_kept=*/false)
          .status());
  if (spec_proto_.strategy() == v1::STRATEGY_AUTO) return absl::OkStatus();
  return ChooseStrategy(spec_, spec_proto_.strategy(), /*workers=*/1,
                        DTypeSize(dtype_), DTypeSize(output_dtype_),
                        CpuStrategyRates(), /*communicator_kept=*/false)
      .status();
}

absl::Status Call::UseResidentContext() {
  const int64_t appended = stream_->append_length();
  if (appended < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("field 'append_length' must be >= 0, got ", appended));
  }
  // A query that appends holds its context like an upload does, so that no
  // other upload interleaves; a plain query reads a snapshot.
  absl::StatusOr<ResidentContext> resident =
      appended > 0 ? state_.contexts->BeginUpload(stream_->context_name(),
                                                  /*create=*/false)
                   : state_.contexts->Find(stream_->context_name());
  if (!resident.ok()) return resident.status();
  appending_ = appended > 0;
  resident_ = std::move(*resident);
  const auto check = [&](const char* field, int64_t got,
                         int64_t want) -> absl::Status {
    if (got == want) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("field '", field, "' must match context '",
                     resident_->name, "' (", want, "), got ", got));
  };
  RINGATTN_RETURN_IF_ERROR(
      check("batch", spec_proto_.batch(), resident_->batch));
  if (spec_proto_.kv_heads() == 0) {
    spec_proto_.set_kv_heads(resident_->kv_heads);
  }
  RINGATTN_RETURN_IF_ERROR(
      check("kv_heads", spec_proto_.kv_heads(), resident_->kv_heads));
  RINGATTN_RETURN_IF_ERROR(
      check("head_dim", spec_proto_.head_dim(), resident_->head_dim));
  spec_proto_.set_kv_len(resident_->length + appended);
  return absl::OkStatus();
}

absl::Status Call::CheckSize() {
  const int64_t element = DTypeSize(dtype_);
  const int64_t q_bytes =
      spec_.batch * spec_.q_len * spec_.q_heads * spec_.head_dim * element;
  const int64_t kv_bytes =
      spec_.batch * spec_.kv_len * spec_.kv_heads * spec_.head_dim * element;
  const int64_t appended_bytes = 2 * spec_.batch * stream_->append_length() *
                                 spec_.kv_heads * spec_.head_dim * element;
  const int64_t total =
      q_bytes + (resident_.has_value() ? appended_bytes : 2 * kv_bytes);
  if (total > state_.options.max_request_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the request uploads ", total, " bytes of Q, K and V but the limit is ",
        state_.options.max_request_bytes,
        " bytes (--max_request_bytes); split it or raise the limit"));
  }
  absl::StatusOr<AdmissionControl::Ticket> ticket =
      state_.admission->Admit(total, absl::FromChrono(context_->deadline()));
  if (!ticket.ok()) return ticket.status();
  ticket_ = std::move(*ticket);
  upload_bytes_ = total;
  return absl::OkStatus();
}

absl::Status Call::OpenWorkers() {
  absl::StatusOr<Cluster::Membership> membership =
      state_.cluster->ReadyMembership();
  if (!membership.ok()) return membership.status();
  const std::vector<Cluster::Member>& members = membership->members;
  const int64_t p = static_cast<int64_t>(members.size());
  const bool all_cpu =
      std::all_of(members.begin(), members.end(),
                  [](const Cluster::Member& m) { return m.device == "cpu"; });
  const StrategyRates rates = all_cpu ? CpuStrategyRates() : GpuStrategyRates();
  const bool communicator_kept =
      p > 1 && state_.communicator_keys->Reusable(membership->epoch);
  absl::StatusOr<v1::Strategy> strategy =
      ChooseStrategy(spec_, spec_proto_.strategy(), p, DTypeSize(dtype_),
                     DTypeSize(output_dtype_), rates, communicator_kept);
  if (!strategy.ok()) return strategy.status();
  strategy_ = *strategy;
  spec_proto_.set_strategy(strategy_);
  const bool broadcast = strategy_ == v1::BROADCAST_Q;
  const bool pass_q = strategy_ == v1::PASS_Q;
  if (broadcast) {
    absl::StatusOr<v1::PartialMerge> merge = ChoosePartialMerge(
        spec_, spec_proto_.partial_merge(), p, DTypeSize(output_dtype_),
        rates.merge, communicator_kept);
    if (!merge.ok()) return merge.status();
    merge_ = *merge;
  }
  // What the workers run: their part of the reduction, if any.
  spec_proto_.set_partial_merge(merge_);
  const bool tree = merge_ == v1::MERGE_ON_WORKERS;
  // A CPU worker holds fp32 Q, O and LSE rows of its shard (all rows for
  // broadcast-Q; two travelling blocks and its output for pass-Q) and three
  // K/V blocks (its own and the double buffer; only its own for broadcast-Q
  // and pass-Q). A GPU holds Q and two K/V blocks in 16 bits and fp32 O and
  // LSE; none of K/V where it reads a resident context in place (broadcast-Q,
  // or a world of one). For pass-Q a GPU holds two travelling query blocks
  // (16-bit Q, fp32 O and LSE) and its own K/V block only, none of it where
  // it reads a resident context in place. Both kinds hold room for one
  // received fp32 partial when broadcast-Q merges on the workers.
  const int64_t q_rows = broadcast ? spec_.q_len : (spec_.q_len + p - 1) / p;
  const int64_t kv_rows = (spec_.kv_len + p - 1) / p + 1;
  const int64_t q_values = spec_.batch * q_rows * spec_.q_heads;
  const int64_t kv_values =
      2 * spec_.batch * kv_rows * spec_.kv_heads * spec_.head_dim;
  const int64_t gpu_kv_blocks =
      resident_.has_value() && (broadcast || pass_q || p == 1) ? 0
      : pass_q                                                 ? 1
                                                               : 2;
  const int64_t tree_scratch = tree ? 4 * q_values * (spec_.head_dim + 1) : 0;
  for (const Cluster::Member& member : members) {
    int64_t per_worker =
        member.device == "cpu"
            ? 4 * ((pass_q ? 3 : 1) * q_values * (2 * spec_.head_dim + 1) +
                   (broadcast || pass_q ? 1 : 3) * kv_values)
            : (pass_q ? 2 : 1) * q_values * (6 * spec_.head_dim + 4) +
                  gpu_kv_blocks * 2 * kv_values;
    per_worker += tree_scratch;
    if (member.memory_bytes > 0 && per_worker > member.memory_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the request needs about ", per_worker, " bytes on each of ", p,
          " workers but worker ", member.rank, " offers ", member.memory_bytes,
          "; add workers or send a shorter sequence"));
    }
  }
  if (resident_.has_value()) {
    RINGATTN_RETURN_IF_ERROR(CheckContextMembers(*resident_, members));
  }
  if (appending_) {
    // A small query's new rows ride in its one message per worker.
    absl::StatusOr<std::unique_ptr<ContextAppend>> append =
        ContextAppend::Start(members, *resident_,
                             /*create=*/false, stream_->append_length(), dtype_,
                             context_->deadline(),
                             state_.options.row_streams_min_bytes,
                             upload_bytes_ <= kMostWholeUploadBytes
                                 ? AppendDelivery::kWithQuery
                                 : AppendDelivery::kOwnStreams);
    if (!append.ok()) return append.status();
    append_ = std::move(*append);
    if (const int streams = append_->row_streams(); streams > 0) {
      state_.metrics->Add("ringattn_worker_row_streams_total", {},
                          static_cast<double>(streams));
    }
  }
  layout_.emplace(spec_, p);
  done_.assign(static_cast<size_t>(p), v1::ExecuteDone());
  if (broadcast && !tree) {
    const int64_t rows = spec_.batch * spec_.q_len * spec_.q_heads;
    merged_o_.assign(static_cast<size_t>(rows * spec_.head_dim), 0.0f);
    merged_lse_.assign(static_cast<size_t>(rows), -INFINITY);
  }
  coverage_.clear();
  for (int tensor = 0; tensor < 3; ++tensor) {
    for (int64_t b = 0; b < spec_.batch; ++b) {
      coverage_.emplace_back(tensor == 0 ? spec_.q_len : spec_.kv_len);
    }
  }
  v1::ExecuteRequest header;
  v1::ExecuteHeader* h = header.mutable_header();
  h->set_request_id(request_id_);
  *h->mutable_spec() = spec_proto_;
  h->set_world_size(static_cast<int>(p));
  h->set_rendezvous_prefix(prefix_);
  // Every ring needs a communicator, and so does broadcast-Q's tree.
  if (p > 1 && (!broadcast || tree)) {
    communicator_ = state_.communicator_keys->Acquire(
        membership->epoch, state_.warm_up ? CommunicatorKeys::Prefer::kUnmade
                                          : CommunicatorKeys::Prefer::kMade);
    h->set_communicator_key(communicator_.key());
    h->set_communicator_slot(communicator_.slot());
    state_.metrics->Add(
        "ringattn_ring_communicators_total",
        {{"communicator", communicator_.key().empty() ? "own"
                          : communicator_.first_use() ? "new"
                                                      : "reused"}},
        1);
  }
  const absl::Duration remaining =
      absl::FromChrono(context_->deadline()) - absl::Now();
  h->set_timeout_seconds(
      absl::ToDoubleSeconds(std::min(remaining, state_.options.ring_timeout)));
  if (resident_.has_value()) {
    h->set_context(resident_->name);
    const ResidentContext& layout = appending_ ? append_->after() : *resident_;
    for (const std::vector<Range>& chunks : layout.chunks) {
      v1::KvChunks* held = h->add_kv_layout();
      for (const Range& chunk : chunks) {
        held->add_begin(chunk.begin);
        held->add_end(chunk.end);
      }
    }
    // K and V are already on the workers.
    for (int64_t b = 0; b < spec_.batch; ++b) {
      coverage_[spec_.batch + b].Mark(0, spec_.kv_len);
      coverage_[2 * spec_.batch + b].Mark(0, spec_.kv_len);
    }
  }
  // A large upload reaches each worker over several connections at once.
  // Broadcast-Q sends every worker all of the query rows.
  const bool row_streams = (broadcast ? upload_bytes_ : upload_bytes_ / p) >=
                           state_.options.row_streams_min_bytes;
  for (const Cluster::Member& member : members) {
    auto link = std::make_unique<WorkerLink>();
    link->member = member;
    link->context.set_deadline(context_->deadline());
    // The stream's metadata goes out with the header instead of on its own,
    // so opening it does not wait for a write.
    link->context.set_initial_metadata_corked(true);
    h->set_rank(member.rank);
    if (upload_bytes_ <= kMostWholeUploadBytes) {
      link->whole = header;
      workers_.push_back(std::move(link));
      continue;
    }
    link->stream = member.stub->Execute(&link->context);
    const int64_t streams =
        row_streams ? 1 + static_cast<int64_t>(member.row_stubs.size()) : 1;
    const int64_t queued_bytes = kMaxQueuedBytesPerWorker / streams;
    link->writer = WriterOf(link->stream.get(), queued_bytes);
    h->clear_rows_key();
    if (streams > 1) {
      const std::string key = absl::StrCat(request_id_, "/", member.rank);
      h->set_rows_key(key);
      link->row_streams = OpenRowStreams(link->member.row_stubs, key,
                                         context_->deadline(), queued_bytes);
    }
    workers_.push_back(std::move(link));
    RINGATTN_RETURN_IF_ERROR(SendToWorker(member.rank, header));
  }
  if (!workers_.front()->row_streams.empty()) {
    const size_t streams = workers_.front()->row_streams.size();
    spdlog::info("request {}: rows go to each worker over {} streams",
                 request_id_, 1 + streams);
    state_.metrics->Add("ringattn_worker_row_streams_total", {},
                        static_cast<double>(streams * workers_.size()));
  }
  return absl::OkStatus();
}

absl::Status Call::SendToWorker(int64_t worker, v1::ExecuteRequest request) {
  WorkerLink& link = *workers_[worker];
  if (link.whole.has_value()) {
    *link.whole->mutable_header()->add_rows() =
        std::move(*request.mutable_rows());
    return absl::OkStatus();
  }
  // Rows take the worker's streams in turn; everything else goes on the
  // Execute stream.
  const size_t lane =
      request.has_rows() && !link.row_streams.empty()
          ? link.next_row_stream++ % (link.row_streams.size() + 1)
          : 0;
  if (lane > 0) {
    RowStream& row = *link.row_streams[lane - 1];
    if (row.writer->Push(std::move(request))) return absl::OkStatus();
    return RowStreamError(worker, row.stream->Finish());
  }
  if (link.writer->Push(std::move(request))) return absl::OkStatus();
  return WorkerError(static_cast<int>(worker), link.stream->Finish());
}

absl::Status Call::FinishRowStreams(int64_t worker) {
  WorkerLink& link = *workers_[worker];
  for (auto& row : link.row_streams) {
    if (!row->EndRows()) return RowStreamError(worker, row->stream->Finish());
  }
  // The worker answers each once it has stored the stream's rows; the
  // stream then waits for its share of the output.
  for (auto& row : link.row_streams) {
    v1::ExecuteResponse stored;
    if (!row->stream->Read(&stored)) {
      return RowStreamError(worker, row->stream->Finish());
    }
    if (stored.has_output() || stored.has_done()) {
      CancelWorkers();
      return absl::InternalError(absl::StrCat(
          "worker ", worker,
          " sent output on an AttachRows stream before saying its rows were "
          "stored"));
    }
  }
  return absl::OkStatus();
}

absl::Status Call::RowStreamError(int64_t worker, grpc::Status status) {
  WorkerLink& link = *workers_[worker];
  if (status.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
    // The worker ended the request before these rows were in: its Execute
    // stream, already over, says why.
    link.writer->Flush();
    status = link.stream->Finish();
  }
  return WorkerError(static_cast<int>(worker), status);
}

absl::Status Call::WorkerError(int rank, const grpc::Status& status) {
  CancelWorkers();
  const WorkerLink& link = *workers_[rank];
  if (status.error_code() == grpc::StatusCode::INVALID_ARGUMENT ||
      status.error_code() == grpc::StatusCode::UNIMPLEMENTED ||
      status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED ||
      status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    return absl::Status(
        static_cast<absl::StatusCode>(status.error_code()),
        absl::StrCat("worker ", rank, ": ", status.error_message()));
  }
  // Whether the worker itself is gone is for its heartbeats to tell: a live
  // worker reports a peer it lost with UNAVAILABLE too.
  return absl::UnavailableError(
      absl::StrCat("worker ", rank, " (", link.member.address,
                   ") failed during the request: ", status.error_message(),
                   "; retry once the cluster is ready"));
}

void Call::CancelWorkers() {
  for (auto& link : workers_) {
    link->context.TryCancel();
    for (auto& row : link->row_streams) row->context.TryCancel();
  }
}

absl::Status Call::Upload() {
  const Clock::time_point start = Clock::now();
  StartSharedUpload();
  const absl::Status read = ReadChunks();
  EndSharedUpload();
  RINGATTN_RETURN_IF_ERROR(read);
  RINGATTN_RETURN_IF_ERROR(CheckComplete());
  if (appending_) {
    // The workers store the new rows while the query starts; a worker waits
    // for its rows before it reads them (Compute checks that they were
    // stored).
    RINGATTN_RETURN_IF_ERROR(append_->CheckComplete());
    append_->EndWrites();
  }
  upload_seconds_ = SecondsSince(start);
  return absl::OkStatus();
}

void Call::StartSharedUpload() {
  const int streams = spec_proto_.upload_streams();
  const int download_streams = spec_proto_.download_streams();
  if (streams <= 1 && download_streams <= 1) return;
  const std::string token = NewUploadToken();
  const absl::Time attach_deadline = absl::Now() + state_.options.ring_timeout;
  if (streams > 1) {
    shared_upload_ = std::make_shared<SharedUpload>(
        request_id_, token, streams - 1, attach_deadline, context_,
        [this](v1::TensorChunk& chunk, int64_t index) {
          return RouteChunk(chunk, index);
        });
    state_.uploads->Add(shared_upload_);
  }
  if (download_streams > 1) {
    shared_download_ = std::make_shared<SharedDownload>(
        request_id_, token, download_streams - 1, attach_deadline, context_);
    state_.downloads->Add(shared_download_);
  }
  context_->AddInitialMetadata(kRequestIdKey, request_id_);
  context_->AddInitialMetadata(kUploadTokenKey, token);
  stream_->SendInitialMetadata();
}

void Call::EndSharedUpload() {
  if (shared_upload_ == nullptr) return;
  state_.uploads->Remove(request_id_);
  shared_upload_->Close();
  shared_upload_.reset();
}

absl::Status Call::ReadChunks() {
  v1::AttendRequest request;
  int64_t index = 0;
  while (stream_->Read(&request)) {
    ++index;
    if (request.has_header()) {
      return absl::InvalidArgumentError(
          absl::StrCat("message ", index,
                       " is a second header; send the header once, then "
                       "tensor chunks"));
    }
    if (!request.has_chunk()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "message ", index, " is empty (neither header nor chunk)"));
    }
    RINGATTN_RETURN_IF_ERROR(
        shared_upload_ != nullptr
            ? shared_upload_->Take(/*stream=*/0, *request.mutable_chunk(),
                                   index)
            : RouteChunk(*request.mutable_chunk(), index));
  }
  if (shared_upload_ != nullptr) {
    // An attached stream's failure cancels this call: it comes first.
    RINGATTN_RETURN_IF_ERROR(shared_upload_->AwaitAttachedStreams());
  }
  if (context_->IsCancelled()) {
    return absl::CancelledError(
        "the client cancelled or went away during upload");
  }
  return absl::OkStatus();
}

absl::Status Call::RouteChunk(v1::TensorChunk& chunk, int64_t index) {
  const v1::TensorName tensor = chunk.tensor();
  if (tensor != v1::Q && tensor != v1::K && tensor != v1::V) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk ", index, ": field 'tensor' must be Q, K or V, got ",
        static_cast<int>(tensor)));
  }
  const char* name = TensorLabel(tensor);
  const bool keys = tensor != v1::Q;
  if (keys && appending_) return append_->Route(chunk, index);
  if (keys && resident_.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk ", index,
                     ": a Query sends only Q chunks unless its header sets "
                     "append_length; K and V come from context '",
                     resident_->name, "'"));
  }
  RINGATTN_RETURN_IF_ERROR(CheckChunkRows(spec_, dtype_, chunk, index));
  const int64_t begin = chunk.token_offset();
  const int64_t count = chunk.token_count();
  const int64_t row_bytes = ChunkRowBytes(spec_, dtype_, tensor);
  const int tensor_index = tensor == v1::Q ? 0 : tensor == v1::K ? 1 : 2;
  RowCoverage& coverage = coverage_[tensor_index * spec_.batch + chunk.batch()];
  if (std::optional<Range> twice = coverage.Mark(begin, begin + count)) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk ", index, ": tensor ", name, " batch ",
                     chunk.batch(), " tokens [", twice->begin, ", ", twice->end,
                     ") were already sent (duplicate or overlapping chunk)"));
  }
  bytes_in_ += static_cast<int64_t>(chunk.data().size());
  if (!keys && strategy_ == v1::BROADCAST_Q) {
    // Every worker gets every query row (no Hilbert order: positions are
    // tokens).
    v1::ExecuteRequest request;
    v1::ShardRows* rows = request.mutable_rows();
    rows->set_tensor(tensor);
    rows->set_batch(chunk.batch());
    rows->set_first_position(begin);
    rows->set_count(count);
    rows->set_data(std::move(*chunk.mutable_data()));
    // The last worker takes the request itself; the others, copies.
    const int64_t last = static_cast<int64_t>(workers_.size()) - 1;
    for (int64_t w = 0; w < last; ++w) {
      RINGATTN_RETURN_IF_ERROR(SendToWorker(w, request));
    }
    return SendToWorker(last, std::move(request));
  }
  for (const RequestLayout::Piece& piece : layout_->Route(keys, begin, count)) {
    v1::ExecuteRequest request;
    FillShardRows(&chunk, piece, row_bytes, request.mutable_rows());
    RINGATTN_RETURN_IF_ERROR(SendToWorker(piece.worker, std::move(request)));
  }
  return absl::OkStatus();
}

absl::Status Call::CheckComplete() {
  for (int tensor = 0; tensor < 3; ++tensor) {
    for (int64_t b = 0; b < spec_.batch; ++b) {
      const RowCoverage& coverage = coverage_[tensor * spec_.batch + b];
      if (std::optional<Range> missing = coverage.FirstMissing()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor ", TensorLabel(static_cast<v1::TensorName>(tensor + 1)),
            " batch ", b, " is missing tokens [", missing->begin, ", ",
            missing->end, "); send every token row exactly once"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Call::StartWorkers() {
  // Once a worker's rows are written, 'run' goes straight to it, closing
  // the stream's writes in the same step; a small request's one message
  // carries it.
  v1::ExecuteRequest run;
  run.set_run(true);
  for (size_t w = 0; w < workers_.size(); ++w) {
    WorkerLink& link = *workers_[w];
    if (link.whole.has_value()) {
      if (appending_ && append_->with_query()) {
        if (std::optional<v1::StoreContextHeader> rows =
                append_->TakeRowsFor(static_cast<int>(w))) {
          *link.whole->mutable_header()->mutable_append() = std::move(*rows);
        }
      }
      link.whole->mutable_header()->set_run(true);
      if (!executes_.has_value()) executes_.emplace();
      executes_->Start(*link.member.stub, &link.context, static_cast<int>(w),
                       *link.whole);
      link.whole.reset();
      continue;
    }
    RINGATTN_RETURN_IF_ERROR(FinishRowStreams(static_cast<int64_t>(w)));
    if (!link.writer->Flush() ||
        !link.stream->Write(run, grpc::WriteOptions().set_last_message())) {
      return WorkerError(static_cast<int>(w), link.stream->Finish());
    }
  }
  if (executes_.has_value()) {
    streams_running_ = workers_.size();
    return absl::OkStatus();
  }
  // Each worker's output comes over its Execute stream and its AttachRows
  // streams at once, each read on a thread of its own. When the client takes
  // output over several streams (and so places chunks by offset), those
  // threads send it on themselves: one thread would hold every row to token
  // order.
  forward_output_ = shared_download_ != nullptr &&
                    strategy_ != v1::BROADCAST_Q && !spec_.hilbert.has_value();
  auto read = [this](int rank, ExecuteStream* stream) {
    v1::ExecuteResponse response;
    while (stream->Read(&response)) {
      if (forward_output_ && response.has_output()) {
        absl::Status forwarded = ForwardOutput(*response.mutable_output());
        if (!forwarded.ok()) {
          {
            absl::MutexLock lock(&mutex_);
            if (forward_failure_.ok()) forward_failure_ = std::move(forwarded);
          }
          CancelWorkers();
        }
        response.clear_output();
        if (!response.has_done()) continue;
      }
      absl::MutexLock lock(&mutex_);
      events_.push_back({rank, std::move(response), grpc::Status::OK});
    }
    grpc::Status status = stream->Finish();
    absl::MutexLock lock(&mutex_);
    events_.push_back({rank, std::nullopt, status});
  };
  for (size_t w = 0; w < workers_.size(); ++w) {
    WorkerLink& link = *workers_[w];
    const int rank = static_cast<int>(w);
    readers_.emplace_back(read, rank, link.stream.get());
    for (auto& row : link.row_streams) {
      readers_.emplace_back(read, rank, row->stream.get());
    }
    streams_running_ += 1 + link.row_streams.size();
  }
  return absl::OkStatus();
}

std::optional<WorkerEvent> Call::NextEvent(absl::Duration timeout) {
  if (executes_.has_value()) return executes_->Next(timeout);
  absl::MutexLock lock(&mutex_);
  auto has_event = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return !events_.empty();
  };
  if (!mutex_.AwaitWithTimeout(absl::Condition(&has_event), timeout)) {
    return std::nullopt;
  }
  WorkerEvent event = std::move(events_.front());
  events_.pop_front();
  return event;
}

absl::Status Call::TakeResponse(int rank, v1::ExecuteResponse& response) {
  if (response.has_output()) {
    if (strategy_ == v1::BROADCAST_Q && merge_ != v1::MERGE_ON_WORKERS) {
      RINGATTN_RETURN_IF_ERROR(MergePartial(response.output()));
    } else {
      if (merge_ == v1::MERGE_ON_WORKERS && rank != 0) {
        CancelWorkers();
        return absl::InternalError(absl::StrCat(
            "worker ", rank,
            " sent output rows, but broadcast-Q merged on the workers "
            "returns them from rank 0 alone"));
      }
      RINGATTN_RETURN_IF_ERROR(TakeOutput(*response.mutable_output()));
      RINGATTN_RETURN_IF_ERROR(EmitReady(/*flush=*/true));
    }
  }
  if (response.has_done()) done_[rank] = response.done();
  return absl::OkStatus();
}

absl::Status Call::Compute() {
  const Clock::time_point start = Clock::now();
  RINGATTN_RETURN_IF_ERROR(StartWorkers());
  start_seconds_ = SecondsSince(start);
  if (appending_ && !append_->with_query()) {
    // The query counts only if every worker stored its new rows.
    if (absl::Status stored = append_->Finish(); !stored.ok()) {
      CancelWorkers();
      return stored;
    }
  }
  size_t finished = 0;
  while (finished < streams_running_) {
    // Wakes now and then to notice a client that went away during compute.
    std::optional<WorkerEvent> event = NextEvent(absl::Milliseconds(200));
    RINGATTN_RETURN_IF_ERROR(ForwardFailure());
    if (!event.has_value()) {
      if (context_->IsCancelled()) {
        CancelWorkers();
        return absl::CancelledError("the client went away during compute");
      }
      continue;
    }
    if (!event->response.has_value()) {
      ++finished;
      if (!event->status.ok()) return WorkerError(event->rank, event->status);
      continue;
    }
    RINGATTN_RETURN_IF_ERROR(TakeResponse(event->rank, *event->response));
  }
  streams_ended_ = true;
  if (appending_ && append_->with_query()) {
    RINGATTN_RETURN_IF_ERROR(append_->FinishWithQuery(done_));
  }
  compute_seconds_ = SecondsSince(start);
  if (strategy_ == v1::BROADCAST_Q && merge_ != v1::MERGE_ON_WORKERS) {
    RINGATTN_RETURN_IF_ERROR(EmitMerged());
  }
  const int64_t rows = next_row_ + rows_forwarded_.load();
  if (rows != spec_.batch * spec_.q_len) {
    return absl::InternalError(absl::StrCat("workers returned ", rows, " of ",
                                            spec_.batch * spec_.q_len,
                                            " output rows"));
  }
  bytes_out_ += bytes_forwarded_.load();
  return absl::OkStatus();
}

absl::StatusOr<DType> Call::CheckOutputSize(
    const v1::ShardOutput& output) const {
  absl::StatusOr<DType> dtype = output.dtype() == v1::DTYPE_UNSPECIFIED
                                    ? DType::kFloat32
                                    : DTypeFromProto(output.dtype());
  const int64_t count = output.count();
  if (!dtype.ok() || count < 0 || output.batch() < 0 ||
      output.batch() >= spec_.batch ||
      static_cast<int64_t>(output.data().size()) !=
          count * spec_.q_heads * spec_.head_dim * DTypeSize(*dtype) ||
      static_cast<int64_t>(output.lse().size()) != count * spec_.q_heads * 4) {
    return absl::InternalError("a worker sent a malformed output chunk");
  }
  return dtype;
}

absl::Status Call::TakeOutput(v1::ShardOutput& output) {
  absl::StatusOr<DType> dtype = CheckOutputSize(output);
  if (!dtype.ok()) return dtype.status();
  const int64_t row_values = spec_.q_heads * spec_.head_dim;
  const int64_t in_row_bytes = row_values * DTypeSize(*dtype);
  const int64_t out_row_bytes = row_values * DTypeSize(output_dtype_);
  const int64_t count = output.count();
  const float* lse = reinterpret_cast<const float*>(output.lse().data());
  auto key_of = [&](int64_t i) {
    const int64_t position = output.positions_size() > 0
                                 ? output.positions(i)
                                 : output.first_position() + i;
    return output.batch() * spec_.q_len + layout_->TokenAt(position);
  };
  // Split into runs of consecutive caller tokens, each converted at once; an
  // output that is one new run already in the output dtype is taken whole.
  for (int64_t begin = 0, end; begin < count; begin = end) {
    const int64_t key = key_of(begin);
    end = begin + 1;
    while (end < count && key_of(end) == key + (end - begin)) ++end;
    OutputRun& run = pending_[key];
    const int64_t rows = end - begin;
    if (run.count == 0 && rows == count && *dtype == output_dtype_) {
      run.o = std::move(*output.mutable_data());
    } else {
      const size_t at = run.o.size();
      run.o.resize(at + static_cast<size_t>(rows * out_row_bytes));
      ConvertDType(*dtype, output.data().data() + begin * in_row_bytes,
                   output_dtype_, &run.o[at], rows * row_values);
    }
    run.lse.insert(run.lse.end(), lse + begin * spec_.q_heads,
                   lse + end * spec_.q_heads);
    run.count += rows;
  }
  return absl::OkStatus();
}

absl::Status Call::ForwardOutput(v1::ShardOutput& output) {
  absl::StatusOr<DType> dtype = CheckOutputSize(output);
  if (!dtype.ok()) return dtype.status();
  const int64_t first = output.first_position();
  const int64_t count = output.count();
  if (output.positions_size() > 0 || first < 0 || first + count > spec_.q_len) {
    return absl::InternalError("a worker sent output rows outside the query");
  }
  v1::AttendResponse response;
  v1::OutputChunk& chunk = *response.mutable_output();
  chunk.set_batch(output.batch());
  chunk.set_token_offset(first);
  chunk.set_token_count(count);
  if (*dtype == output_dtype_) {
    *chunk.mutable_data() = std::move(*output.mutable_data());
  } else {
    const int64_t values = count * spec_.q_heads * spec_.head_dim;
    std::string& data = *chunk.mutable_data();
    data.resize(static_cast<size_t>(values * DTypeSize(output_dtype_)));
    ConvertDType(*dtype, output.data().data(), output_dtype_, data.data(),
                 values);
  }
  if (spec_proto_.return_lse()) {
    chunk.set_lse(ChunkLse(reinterpret_cast<const float*>(output.lse().data()),
                           count, spec_.q_heads));
  }
  const int64_t bytes =
      static_cast<int64_t>(chunk.data().size() + chunk.lse().size());
  absl::StatusOr<bool> queued = shared_download_->Deal(response);
  if (!queued.ok()) return queued.status();
  if (!*queued) {
    // The call's own stream's turn: readers take it one at a time.
    absl::MutexLock lock(&forward_writes_);
    if (!stream_->Write(response)) {
      return absl::CancelledError("the client went away while output streamed");
    }
  }
  rows_forwarded_ += count;
  bytes_forwarded_ += bytes;
  return absl::OkStatus();
}

absl::Status Call::ForwardFailure() {
  absl::MutexLock lock(&mutex_);
  return forward_failure_;
}

absl::Status Call::MergePartial(const v1::ShardOutput& output) {
  absl::StatusOr<DType> dtype = CheckOutputSize(output);
  if (!dtype.ok()) return dtype.status();
  if (*dtype != DType::kFloat32) {
    return absl::InternalError(
        "a worker sent broadcast-Q partial output that is not fp32");
  }
  const int64_t first = output.first_position();
  const int64_t count = output.count();
  if (output.positions_size() > 0 || first < 0 || count < 0 ||
      first + count > spec_.q_len) {
    return absl::InternalError(
        "a worker sent broadcast-Q output rows outside the query");
  }
  const int64_t row = output.batch() * spec_.q_len + first;
  const Shape o_shape{1, count, spec_.q_heads, spec_.head_dim};
  const Shape lse_shape{1, count, spec_.q_heads, 1};
  MergeWithLse(
      View<float>(merged_o_.data() + row * spec_.q_heads * spec_.head_dim,
                  o_shape),
      View<float>(merged_lse_.data() + row * spec_.q_heads, lse_shape),
      View<const float>(reinterpret_cast<const float*>(output.data().data()),
                        o_shape),
      View<const float>(reinterpret_cast<const float*>(output.lse().data()),
                        lse_shape));
  merged_rows_ += count;
  return absl::OkStatus();
}

absl::Status Call::EmitMerged() {
  const int64_t rows = spec_.batch * spec_.q_len;
  const int64_t expected = rows * static_cast<int64_t>(workers_.size());
  if (merged_rows_ != expected) {
    return absl::InternalError(absl::StrCat("workers returned ", merged_rows_,
                                            " of ", expected,
                                            " partial output rows"));
  }
  OutputRun& all = pending_[0];
  all.count = rows;
  all.o.resize(merged_o_.size() *
               static_cast<size_t>(DTypeSize(output_dtype_)));
  ConvertDType(DType::kFloat32, merged_o_.data(), output_dtype_, all.o.data(),
               static_cast<int64_t>(merged_o_.size()));
  merged_o_ = {};
  all.lse = std::move(merged_lse_);
  return EmitReady(/*flush=*/true);
}

absl::Status Call::EmitReady(bool flush) {
  const int64_t row_bytes =
      spec_.q_heads * spec_.head_dim * DTypeSize(output_dtype_);
  const int64_t rows_per_chunk =
      std::max<int64_t>(1, state_.options.output_chunk_bytes / row_bytes);
  std::vector<float> lse_rows;  // [rows, Hq] of the chunk being built
  auto send = [&]() -> absl::Status {
    if (chunk_.token_count() == 0) return absl::OkStatus();
    if (spec_proto_.return_lse()) {
      chunk_.set_lse(
          ChunkLse(lse_rows.data(), chunk_.token_count(), spec_.q_heads));
    }
    v1::AttendResponse response;
    *response.mutable_output() = std::move(chunk_);
    bytes_out_ += static_cast<int64_t>(response.output().data().size() +
                                       response.output().lse().size());
    chunk_ = v1::OutputChunk();
    lse_rows.clear();
    if (shared_download_ != nullptr) {
      absl::StatusOr<bool> queued = shared_download_->Deal(response);
      if (!queued.ok()) return queued.status();
      if (*queued) return absl::OkStatus();
    }
    if (!stream_->Write(response)) {
      return absl::CancelledError("the client went away while output streamed");
    }
    return absl::OkStatus();
  };
  while (!pending_.empty() && pending_.begin()->first == next_row_) {
    OutputRun run = std::move(pending_.begin()->second);
    pending_.erase(pending_.begin());
    if (chunk_.token_count() == 0 && run.count <= rows_per_chunk &&
        next_row_ / spec_.q_len == (next_row_ + run.count - 1) / spec_.q_len) {
      // A run that fits one chunk of one batch entry becomes that chunk as
      // it is.
      chunk_.set_batch(next_row_ / spec_.q_len);
      chunk_.set_token_offset(next_row_ % spec_.q_len);
      chunk_.set_token_count(run.count);
      *chunk_.mutable_data() = std::move(run.o);
      lse_rows = std::move(run.lse);
      next_row_ += run.count;
      continue;
    }
    for (int64_t i = 0; i < run.count; ++i, ++next_row_) {
      const int64_t batch = next_row_ / spec_.q_len;
      const int64_t token = next_row_ % spec_.q_len;
      if (chunk_.token_count() > 0 &&
          (chunk_.batch() != batch || chunk_.token_count() >= rows_per_chunk)) {
        RINGATTN_RETURN_IF_ERROR(send());
      }
      if (chunk_.token_count() == 0) {
        chunk_.set_batch(batch);
        chunk_.set_token_offset(token);
      }
      chunk_.mutable_data()->append(run.o, static_cast<size_t>(i * row_bytes),
                                    static_cast<size_t>(row_bytes));
      lse_rows.insert(lse_rows.end(), run.lse.begin() + i * spec_.q_heads,
                      run.lse.begin() + (i + 1) * spec_.q_heads);
      chunk_.set_token_count(chunk_.token_count() + 1);
    }
  }
  return flush ? send() : absl::OkStatus();
}

v1::Summary Call::MakeSummary() {
  v1::Summary summary;
  summary.set_request_id(request_id_);
  auto timing = [&](const char* phase, double seconds) {
    v1::PhaseTiming* t = summary.add_timings();
    t->set_phase(phase);
    t->set_seconds(seconds);
  };
  timing("upload", upload_seconds_);
  timing("compute", compute_seconds_);
  summary.set_seconds(SecondsSince(start_));
  double flops = 0;
  for (const v1::ExecuteDone& done : done_) flops += done.flops();
  summary.set_flops(flops);
  summary.set_flops_per_second(compute_seconds_ > 0 ? flops / compute_seconds_
                                                    : 0);
  summary.set_bytes_in(bytes_in_);
  summary.set_bytes_out(bytes_out_);
  for (size_t w = 0; w < done_.size(); ++w) {
    v1::WorkerUsage* usage = summary.add_workers();
    usage->set_rank(static_cast<int>(w));
    usage->set_peak_bytes(done_[w].peak_bytes());
    usage->set_compute_seconds(done_[w].compute_seconds());
    *usage->mutable_kernel_launches() = done_[w].kernel_launches();
    for (const auto& [kernel, launches] : done_[w].kernel_launches()) {
      (*summary.mutable_kernel_launches())[kernel] += launches;
    }
    usage->set_tokens(
        strategy_ == v1::BROADCAST_Q
            ? spec_.q_len
            : layout_->q_layout().ShardLength(static_cast<int64_t>(w)));
    summary.set_ring_steps(
        std::max(summary.ring_steps(), done_[w].ring_steps()));
    summary.set_ring_transfers(summary.ring_transfers() + done_[w].transfers());
  }
  summary.set_strategy(strategy_);
  summary.set_partial_merge(merge_);
  if (spec_.block_sparse.has_value() &&
      spec_proto_.block_sparse().return_mask()) {
    const BlockMask mask =
        BlockMask::FromRules(*spec_.block_sparse, spec_.kv_len);
    std::string bits(static_cast<size_t>(mask.num_blocks() * mask.num_blocks()),
                     '\0');
    for (int64_t i = 0; i < mask.num_blocks(); ++i) {
      for (int64_t j = 0; j < mask.num_blocks(); ++j) {
        bits[i * mask.num_blocks() + j] = mask.Allowed(i, j) ? 1 : 0;
      }
    }
    summary.set_mask_blocks(mask.num_blocks());
    summary.set_block_mask(std::move(bits));
  }
  return summary;
}

absl::Status Call::Run() {
  const absl::Status status = RunSteps();
  if (appending_) {
    // A decode step commits its rows only if the query succeeded; otherwise
    // the workers that stored them drop them again, and refuse them should
    // they still arrive (ResidentContext::undone_appends).
    std::optional<ResidentContext> committed;
    if (status.ok()) {
      committed = append_->after();
    } else if (append_ != nullptr) {
      append_.reset();
      committed = *resident_;
      ++committed->undone_appends;
      DropOnWorkers(state_, resident_->name, resident_->length,
                    committed->undone_appends);
    }
    state_.contexts->EndUpload(resident_->name, std::move(committed));
  }
  return status;
}

absl::Status Call::RunSteps() {
  RINGATTN_RETURN_IF_ERROR(ReadHeader());
  RINGATTN_RETURN_IF_ERROR(CheckSize());
  RINGATTN_RETURN_IF_ERROR(OpenWorkers());
  spdlog::info("request {}: {} x {} tokens, {} workers, {}{}, uploading",
               request_id_, spec_.q_len, spec_.kv_len, workers_.size(),
               v1::Strategy_Name(strategy_),
               merge_ == v1::MERGE_AUTO
                   ? ""
                   : absl::StrCat(" (", v1::PartialMerge_Name(merge_), ")"));
  RINGATTN_RETURN_IF_ERROR(Upload());
  RINGATTN_RETURN_IF_ERROR(Compute());
  if (shared_download_ != nullptr) {
    // The summary comes once every attached stream took its share.
    RINGATTN_RETURN_IF_ERROR(shared_download_->Finish());
  }
  communicator_.Succeeded();
  v1::AttendResponse response;
  *response.mutable_summary() = MakeSummary();
  state_.metrics->Observe("ringattn_phase_seconds", {{"phase", "upload"}},
                          upload_seconds_);
  state_.metrics->Observe("ringattn_phase_seconds", {{"phase", "compute"}},
                          compute_seconds_);
  state_.metrics->Add("ringattn_strategy_requests_total",
                      {{"strategy", v1::Strategy_Name(strategy_)}}, 1);
  if (strategy_ == v1::BROADCAST_Q) {
    state_.metrics->Add(
        "ringattn_partial_merge_requests_total",
        {{"merge", merge_ == v1::MERGE_ON_WORKERS ? "workers" : "coordinator"}},
        1);
  }
  for (const auto& [kernel, launches] : response.summary().kernel_launches()) {
    state_.metrics->Add("ringattn_kernel_launches_total", {{"kernel", kernel}},
                        static_cast<double>(launches));
  }
  state_.metrics->Add("ringattn_tokens_total", {},
                      static_cast<double>(spec_.batch * spec_.q_len));
  state_.metrics->Add("ringattn_flops_total", {}, response.summary().flops());
  state_.metrics->Add("ringattn_bytes_in_total", {},
                      static_cast<double>(bytes_in_));
  state_.metrics->Add("ringattn_bytes_out_total", {},
                      static_cast<double>(bytes_out_));
  if (!stream_->WriteLast(response)) {
    return absl::CancelledError("the client went away before the summary");
  }
  spdlog::info(
      "request {}: done in {:.3f} s (upload {:.3f} ms, 'run' handed to the "
      "workers in {:.3f} ms, compute {:.3f} ms; {:.1f} GFLOP/s compute)",
      request_id_, response.summary().seconds(), 1e3 * upload_seconds_,
      1e3 * start_seconds_, 1e3 * compute_seconds_,
      response.summary().flops_per_second() / 1e9);
  return absl::OkStatus();
}

}  // namespace

grpc::Status RunAttendCall(const CoordinatorState& state,
                           grpc::ServerContext* context, RequestStream* stream,
                           const std::string& request_id) {
  Call call(state, context, stream, request_id);
  const absl::Status status = call.Run();
  if (!status.ok()) {
    spdlog::info("request {}: failed: {}", request_id, status.ToString());
  }
  return ToGrpcStatus(status);
}

}  // namespace ringattn
