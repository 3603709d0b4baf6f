#include "client/client.h"

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <type_traits>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/attached_streams.h"
#include "client/chunking.h"
#include "core/status_macros.h"
#include "proto/grpc_status.h"
#include "proto/spec_conversion.h"

namespace ringattn {
namespace {

// Output chunks are ~1 MiB; the limit leaves room for larger ones while
// bounding what a single message can make the client allocate.
constexpr int kMaxReceiveMessageBytes = 64 << 20;
// Most streams one call may upload over (the server's limit too).
constexpr int kMostUploadStreams = 64;
// Calls that upload at most this much run on the calling thread
// (RunOnThisThread); larger ones overlap their upload and download through
// gRPC's asynchronous API.
constexpr int64_t kMostBlockingUploadBytes = 1 << 20;
// A query's header carries its first chunks, up to about this many bytes:
// the coordinator starts on a query once it has the header, which a 64-row
// query (512 KiB) sent whole reached 0.26 ms later (one H200 host).
constexpr int64_t kMostHeaderChunkBytes = int64_t{128} << 10;

// The first wait between attempts of a call (ClientOptions::max_attempts),
// doubled each time up to ClientOptions::kLongestRetryWait, each jittered down
// to half.
constexpr absl::Duration kFirstRetryWait = absl::Milliseconds(500);

// What a call that filled `output` returns; `answered`: whether any output
// came back.
absl::StatusOr<AttendResult> Finished(absl::StatusOr<v1::Summary> summary,
                                      OutputAssembler& output, bool& answered) {
  answered = output.bytes_received() > 0;
  if (!summary.ok()) return summary.status();
  return AttendResult{std::move(output.output()), std::move(output.lse()),
                      *std::move(summary)};
}

// `status`, carrying kUnchangedPayload if it is UNAVAILABLE and the
// coordinator marked the call unchanged.
absl::Status WithUnchangedMark(absl::Status status,
                               const grpc::ClientContext& context) {
  if (status.code() == absl::StatusCode::kUnavailable &&
      context.GetServerTrailingMetadata().count(kUnchangedKey) > 0) {
    status.SetPayload(kUnchangedPayload, absl::Cord("1"));
  }
  return status;
}

// A factor in [0.5, 1) for a wait between attempts.
double RetryJitter() {
  static thread_local std::mt19937 bits(std::random_device{}());
  return std::uniform_real_distribution<double>(0.5, 1.0)(bits);
}

std::string ShapeString(const Shape& shape) {
  return absl::StrCat("[", shape.batch, ", ", shape.seq, ", ", shape.heads,
                      ", ", shape.dim, "]");
}

// INVALID_ARGUMENT unless every extent of `expected` (what the request says)
// is >= 1 and `tensor` has that shape.
absl::Status CheckShape(absl::string_view name, const HostTensor& tensor,
                        const Shape& expected) {
  if (expected.batch < 1 || expected.seq < 1 || expected.heads < 1 ||
      expected.dim < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("the request gives ", name, " the shape ",
                     ShapeString(expected), "; every extent must be >= 1"));
  }
  if (tensor.shape() != expected) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " has shape ", ShapeString(tensor.shape()),
                     " but the request says ", ShapeString(expected)));
  }
  return absl::OkStatus();
}

// The spec to send: `spec` with FP32 in place of an unspecified wire dtype.
v1::AttentionSpec WithWireDType(const v1::AttentionSpec& spec) {
  v1::AttentionSpec result = spec;
  if (result.wire_dtype() == v1::DTYPE_UNSPECIFIED) {
    result.set_wire_dtype(v1::FP32);
  }
  return result;
}

// Passes a call's progress to the user's callback, one report at a time
// (upload and download reports come from different gRPC threads).
// Thread-safe.
class ProgressReporter {
 public:
  explicit ProgressReporter(
      const std::function<void(const Progress&)>& callback)
      : callback_(callback) {}

  void Report(Progress::Phase phase, int64_t done, int64_t total) {
    if (!callback_) return;
    std::lock_guard<std::mutex> lock(mu_);
    callback_(Progress{phase, done, total});
  }

 private:
  const std::function<void(const Progress&)>& callback_;
  std::mutex mu_;
};

// Lets the calling thread wait for a reactor's OnDone. Thread-safe.
class Completion {
 public:
  void Finish(const grpc::Status& status) {
    std::lock_guard<std::mutex> lock(mu_);
    status_ = status;
    done_ = true;
    done_cv_.notify_one();
  }

  grpc::Status Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [this] { return done_; });
    return status_;
  }

 private:
  std::mutex mu_;
  std::condition_variable done_cv_;
  bool done_ = false;
  grpc::Status status_;
};

// The messages of an upload stream: a header, then every chunk of a
// ChunkStream, all built in one reused message (the next chunk read ahead).
// Used by one write at a time.
// Reports progress unless `progress` is null.
template <typename Request>
class RequestSequence {
 public:
  RequestSequence(Request header, ChunkSource* chunks,
                  ProgressReporter* progress)
      : request_(std::move(header)), chunks_(chunks), progress_(progress) {
    has_next_chunk_ = chunks_->Next(&next_chunk_);
  }

  Request* First() { return &request_; }

  // Whether the message last handed out is the last one.
  bool AtLast() const { return !has_next_chunk_; }

  // Once the message last handed out is written: the next one, or null when
  // all are written.
  Request* Next() {
    uploaded_ += request_.chunk().data().size();
    if (progress_ != nullptr) {
      progress_->Report(Progress::Phase::kUpload, uploaded_,
                        chunks_->total_bytes());
    }
    if (!has_next_chunk_) return nullptr;
    request_.mutable_chunk()->Swap(&next_chunk_);
    has_next_chunk_ = chunks_->Next(&next_chunk_);
    return &request_;
  }

 private:
  Request request_;
  ChunkSource* chunks_;
  ProgressReporter* progress_;
  int64_t uploaded_ = 0;
  // The chunk after the one in request_, read ahead so that AtLast knows.
  v1::TensorChunk next_chunk_;
  bool has_next_chunk_ = false;
};

// What the responses of an Attend or Query call bring: output rows into an
// OutputAssembler, reporting download progress, then one summary. Output may
// also come on attached download streams, on threads of their own.
// Thread-safe.
class ResponseIntake {
 public:
  ResponseIntake(OutputAssembler* output, ProgressReporter* progress)
      : output_(output), progress_(progress) {}

  // A response of the call's own stream. INTERNAL for a response that breaks
  // the API.
  absl::Status Accept(const v1::AttendResponse& response) {
    absl::MutexLock lock(&mutex_);
    switch (response.kind_case()) {
      case v1::AttendResponse::kOutput:
        if (has_summary_) {
          return absl::InternalError(
              "the server sent output after the summary");
        }
        return AddOutput(response.output());
      case v1::AttendResponse::kSummary:
        if (has_summary_) {
          return absl::InternalError("the server sent two summaries");
        }
        summary_ = response.summary();
        has_summary_ = true;
        return absl::OkStatus();
      case v1::AttendResponse::KIND_NOT_SET:
        break;
    }
    return absl::InternalError("the server sent an empty response message");
  }

  // A response of an attached download stream: output only, which may still
  // be read after the call's own stream brought the summary.
  absl::Status AcceptAttached(const v1::AttendResponse& response) {
    absl::MutexLock lock(&mutex_);
    if (!response.has_output()) {
      return absl::InternalError(
          "the server sent an attached download stream something other than "
          "output");
    }
    return AddOutput(response.output());
  }

  // Once the call ended with `status`: the first failure of a response that
  // broke the API (`response_error`), the status, a missing summary or
  // missing output rows.
  absl::Status Finish(const absl::Status& response_error,
                      const grpc::Status& status) {
    absl::MutexLock lock(&mutex_);
    RINGATTN_RETURN_IF_ERROR(response_error);
    RINGATTN_RETURN_IF_ERROR(FromGrpcStatus(status));
    if (!has_summary_) {
      return absl::DataLossError("the server ended the call without a summary");
    }
    return output_->CheckComplete();
  }

  // Only once the call and its attached streams have ended.
  v1::Summary& summary() ABSL_NO_THREAD_SAFETY_ANALYSIS { return summary_; }

 private:
  absl::Status AddOutput(const v1::OutputChunk& chunk)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    if (output_->bytes_received() == 0) {
      progress_->Report(Progress::Phase::kDownload, 0, output_->total_bytes());
    }
    RINGATTN_RETURN_IF_ERROR(output_->Add(chunk));
    progress_->Report(Progress::Phase::kDownload, output_->bytes_received(),
                      output_->total_bytes());
    return absl::OkStatus();
  }

  absl::Mutex mutex_;
  OutputAssembler* output_ ABSL_PT_GUARDED_BY(mutex_);
  ProgressReporter* progress_ ABSL_PT_GUARDED_BY(mutex_);
  bool has_summary_ ABSL_GUARDED_BY(mutex_) = false;
  v1::Summary summary_ ABSL_GUARDED_BY(mutex_);
};

// One Attend or Query call: writes the request stream while reading the
// response stream into a ResponseIntake, with one write and one read
// outstanding at a time (which is the flow control). The ticket in the call's
// initial metadata goes to the attached streams given (`uploads`, which then
// report the upload's progress, and `downloads`, which read output into the
// same intake). Bind it to a call with the stub's async() method, then Run()
// it once.
template <typename Request>
class OutputCall final
    : public grpc::ClientBidiReactor<Request, v1::AttendResponse> {
 public:
  OutputCall(grpc::ClientContext* context, Request header, ChunkSource* chunks,
             ResponseIntake* intake, ProgressReporter* progress,
             AttachedStreams* uploads = nullptr,
             AttachedStreams* downloads = nullptr)
      : context_(context),
        requests_(std::move(header), chunks,
                  uploads == nullptr ? progress : nullptr),
        intake_(intake),
        uploads_(uploads),
        downloads_(downloads) {}

  // Starts the call and waits for it and its attached download streams to
  // end; the failure of either, or ResponseIntake::Finish's.
  absl::Status Run() {
    this->StartWrite(requests_.First());
    this->StartRead(&response_);
    this->StartCall();
    const grpc::Status status = completion_.Wait();
    if (downloads_ != nullptr) {
      // Their output counts before the output is checked.
      const absl::Status downloaded = downloads_->Finish(
          response_error_.ok() ? FromGrpcStatus(status) : response_error_);
      if (!downloaded.ok()) return downloaded;
    }
    return intake_->Finish(response_error_, status);
  }

 private:
  void OnWriteDone(bool ok) override {
    // Not ok: the call is over; OnDone brings its status.
    if (!ok) return;
    if (Request* next = requests_.Next()) {
      this->StartWrite(next);
    } else {
      this->StartWritesDone();
    }
  }

  void OnReadInitialMetadataDone(bool ok) override {
    if (!ok) return;
    for (AttachedStreams* attached : {uploads_, downloads_}) {
      if (attached != nullptr) {
        attached->TakeTicket(context_->GetServerInitialMetadata());
      }
    }
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;
    response_error_ = intake_->Accept(response_);
    if (!response_error_.ok()) {
      context_->TryCancel();
      return;
    }
    this->StartRead(&response_);
  }

  void OnDone(const grpc::Status& status) override {
    completion_.Finish(status);
  }

  grpc::ClientContext* context_;
  RequestSequence<Request> requests_;
  ResponseIntake* intake_;
  AttachedStreams* uploads_;
  AttachedStreams* downloads_;
  v1::AttendResponse response_;
  // Written by read reactions, read by Run() after OnDone.
  absl::Status response_error_;
  Completion completion_;
};

// A small Attend or Query call on the calling thread, through gRPC's
// synchronous API: its whole upload written, then its responses read. The
// asynchronous API runs each reaction on a gRPC thread and hands over to the
// next, which a decode step's latency feels; here no thread changes hands.
// Writing everything first cannot deadlock: the coordinator reads a request's
// whole upload before it writes any output.
template <typename Request>
absl::Status RunOnThisThread(
    grpc::ClientContext& context,
    grpc::ClientReaderWriter<Request, v1::AttendResponse>& stream,
    RequestSequence<Request>& requests, ResponseIntake& intake) {
  // A failed write means the call is over; Finish brings its status.
  bool open = true;
  for (Request* message = requests.First(); message != nullptr && open;
       message = requests.Next()) {
    // The last message closes the writes in the same step.
    open = stream.Write(*message, requests.AtLast()
                                      ? grpc::WriteOptions().set_last_message()
                                      : grpc::WriteOptions());
  }
  absl::Status response_error;
  v1::AttendResponse response;
  while (stream.Read(&response)) {
    response_error = intake.Accept(response);
    if (!response_error.ok()) {
      context.TryCancel();
      while (stream.Read(&response)) {
      }
      break;
    }
  }
  return intake.Finish(response_error, stream.Finish());
}

// One CreateContext or AppendContext call: writes the upload stream, one
// message outstanding at a time, and hands the ticket in its initial metadata
// to `uploads` (which then report the progress) if given. Bind it to a call
// with the stub's async() method, then Run() it once.
class ContextUploadCall final
    : public grpc::ClientWriteReactor<v1::ContextUpload> {
 public:
  ContextUploadCall(grpc::ClientContext* context, v1::ContextUpload header,
                    ChunkSource* chunks, ProgressReporter* progress,
                    AttachedStreams* uploads = nullptr)
      : context_(context),
        requests_(std::move(header), chunks,
                  uploads == nullptr ? progress : nullptr),
        uploads_(uploads) {}

  // Starts the call and waits for it to end; returns its status.
  absl::Status Run() {
    StartWrite(requests_.First());
    StartCall();
    return FromGrpcStatus(completion_.Wait());
  }

 private:
  void OnWriteDone(bool ok) override {
    if (!ok) return;
    if (v1::ContextUpload* next = requests_.Next()) {
      StartWrite(next);
    } else {
      StartWritesDone();
    }
  }

  void OnReadInitialMetadataDone(bool ok) override {
    if (ok && uploads_ != nullptr) {
      uploads_->TakeTicket(context_->GetServerInitialMetadata());
    }
  }

  void OnDone(const grpc::Status& status) override {
    completion_.Finish(status);
  }

  grpc::ClientContext* context_;
  RequestSequence<v1::ContextUpload> requests_;
  AttachedStreams* uploads_;
  Completion completion_;
};

// The spec in a request's header.
v1::AttentionSpec* SpecOf(v1::AttendRequest& header) {
  return header.mutable_header();
}
v1::AttentionSpec* SpecOf(v1::QueryRequest& header) {
  return header.mutable_header()->mutable_spec();
}

// Starts `call` as the RPC its request type names.
void Start(v1::Attention::Stub& stub, grpc::ClientContext* context,
           OutputCall<v1::AttendRequest>* call) {
  stub.async()->Attend(context, call);
}
void Start(v1::Attention::Stub& stub, grpc::ClientContext* context,
           OutputCall<v1::QueryRequest>* call) {
  stub.async()->Query(context, call);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(
    const std::string& target, ClientOptions options) {
  if (target.empty()) {
    return absl::InvalidArgumentError("the target address is empty");
  }
  if (options.chunk_bytes < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ClientOptions.chunk_bytes must be >= 1, got ", options.chunk_bytes));
  }
  if (options.deadline <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("ClientOptions.deadline must be positive, got ",
                     absl::FormatDuration(options.deadline)));
  }
  for (auto [name, streams] :
       {std::pair{"upload_streams", options.upload_streams},
        std::pair{"download_streams", options.download_streams}}) {
    if (streams < 0 || streams > kMostUploadStreams) {
      return absl::InvalidArgumentError(
          absl::StrCat("ClientOptions.", name, " must be in [0, ",
                       kMostUploadStreams, "] (0: automatic), got ", streams));
    }
  }
  if (options.auto_streams_min_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("ClientOptions.auto_streams_min_bytes must be >= 0, got ",
                     options.auto_streams_min_bytes));
  }
  if (options.max_attempts < 1 ||
      options.max_attempts > ClientOptions::kMostAttempts) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ClientOptions.max_attempts must be in [1, ",
        ClientOptions::kMostAttempts, "], got ", options.max_attempts));
  }
  if (options.reconnect_backoff <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("ClientOptions.reconnect_backoff must be positive, got ",
                     absl::FormatDuration(options.reconnect_backoff)));
  }
  grpc::ChannelArguments arguments;
  arguments.SetMaxReceiveMessageSize(kMaxReceiveMessageBytes);
  if (options.reconnect_backoff != absl::InfiniteDuration()) {
    const int ms = static_cast<int>(std::clamp<int64_t>(
        absl::ToInt64Milliseconds(options.reconnect_backoff), 1, INT32_MAX));
    arguments.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, ms);
    arguments.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, ms);
  }
  const std::shared_ptr<grpc::ChannelCredentials> credentials =
      options.credentials ? options.credentials
                          : grpc::InsecureChannelCredentials();
  std::unique_ptr<v1::Attention::Stub> stub = v1::Attention::NewStub(
      grpc::CreateCustomChannel(target, credentials, arguments));
  std::vector<std::unique_ptr<v1::Attention::Stub>> attached_stubs;
  const int most_streams =
      std::max({options.upload_streams, options.download_streams,
                options.upload_streams == 0 || options.download_streams == 0
                    ? ClientOptions::kAutoStreams
                    : 1});
  for (int i = 1; i < most_streams; ++i) {
    // Channels whose arguments differ never share a connection.
    grpc::ChannelArguments own = arguments;
    own.SetInt("ringattn.attached_stream", i);
    attached_stubs.push_back(v1::Attention::NewStub(
        grpc::CreateCustomChannel(target, credentials, own)));
  }
  return std::unique_ptr<Client>(new Client(
      std::move(stub), std::move(attached_stubs), std::move(options)));
}

Client::Client(std::unique_ptr<v1::Attention::Stub> stub,
               std::vector<std::unique_ptr<v1::Attention::Stub>> attached_stubs,
               ClientOptions options)
    : stub_(std::move(stub)),
      attached_stubs_(std::move(attached_stubs)),
      options_(std::move(options)) {}

void Client::Prepare(grpc::ClientContext* context) const {
  context->set_wait_for_ready(options_.wait_for_ready);
  if (options_.deadline != absl::InfiniteDuration()) {
    context->set_deadline(absl::ToChronoTime(absl::Now() + options_.deadline));
  }
  if (options_.bearer_token.has_value()) {
    context->AddMetadata("authorization",
                         absl::StrCat("Bearer ", *options_.bearer_token));
  }
}

absl::StatusOr<AttendResult> Client::Attend(const v1::AttentionSpec& spec,
                                            const HostTensor& q,
                                            const HostTensor& k,
                                            const HostTensor& v) {
  v1::AttendRequest header;
  *header.mutable_header() = WithWireDType(spec);
  const v1::AttentionSpec& sent = header.header();
  absl::StatusOr<DType> dtype = DTypeFromProto(sent.wire_dtype());
  if (!dtype.ok()) return dtype.status();
  const Shape q_shape{sent.batch(), sent.q_len(), sent.q_heads(),
                      sent.head_dim()};
  const Shape kv_shape{sent.batch(), sent.kv_len(), sent.kv_heads(),
                       sent.head_dim()};
  RINGATTN_RETURN_IF_ERROR(CheckShape("Q", q, q_shape));
  RINGATTN_RETURN_IF_ERROR(CheckShape("K", k, kv_shape));
  RINGATTN_RETURN_IF_ERROR(CheckShape("V", v, kv_shape));

  absl::StatusOr<DType> output_dtype = OutputDType(sent);
  if (!output_dtype.ok()) return output_dtype.status();
  return Retrying(/*appends=*/false, [&](bool& answered) {
    ChunkStream chunks(*dtype, options_.chunk_bytes);
    chunks.Add(v1::Q, q);
    chunks.Add(v1::K, k);
    chunks.Add(v1::V, v);
    OutputAssembler output(q_shape, sent.return_lse(), *output_dtype);
    return Finished(Run(header, chunks, output), output, answered);
  });
}

absl::StatusOr<AttendResult> Client::Retrying(
    bool appends,
    absl::FunctionRef<absl::StatusOr<AttendResult>(bool& answered)> attempt)
    const {
  absl::Duration wait = kFirstRetryWait;
  for (int n = 1;; ++n) {
    bool answered = false;
    absl::StatusOr<AttendResult> result = attempt(answered);
    if (result.ok() || answered || n >= options_.max_attempts ||
        result.status().code() != absl::StatusCode::kUnavailable) {
      return result;
    }
    // A call that appends rows goes again only on the coordinator's word
    // that it appended nothing: a connection lost after the coordinator
    // finished (output and all) looks the same to this side.
    if (appends && !result.status().GetPayload(kUnchangedPayload)) {
      return result;
    }
    // A wait between attempts, not a synchronization: jittered so that
    // clients refused together do not come back together.
    absl::SleepFor(wait * RetryJitter());
    wait = std::min(2 * wait, ClientOptions::kLongestRetryWait);
  }
}

absl::StatusOr<v1::Summary> Client::AttendStreaming(
    const v1::AttentionSpec& spec, ChunkSource& source,
    OutputAssembler::Consumer consumer) {
  v1::AttendRequest header;
  *header.mutable_header() = WithWireDType(spec);
  return RunStreaming(std::move(header), source, std::move(consumer));
}

absl::StatusOr<v1::Summary> Client::QueryStreaming(
    const std::string& context, const v1::AttentionSpec& spec,
    ChunkSource& source, OutputAssembler::Consumer consumer) {
  v1::QueryRequest header;
  header.mutable_header()->set_context(context);
  *header.mutable_header()->mutable_spec() = WithWireDType(spec);
  return RunStreaming(std::move(header), source, std::move(consumer));
}

template <typename Request>
absl::StatusOr<v1::Summary> Client::RunStreaming(
    Request header, ChunkSource& source, OutputAssembler::Consumer consumer) {
  const v1::AttentionSpec& sent = *SpecOf(header);
  absl::StatusOr<DType> output_dtype = OutputDType(sent);
  if (!output_dtype.ok()) return output_dtype.status();
  const Shape q_shape{sent.batch(), sent.q_len(), sent.q_heads(),
                      sent.head_dim()};
  if (q_shape.batch < 1 || q_shape.seq < 1 || q_shape.heads < 1 ||
      q_shape.dim < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("the request gives Q the shape ", ShapeString(q_shape),
                     "; every extent must be >= 1"));
  }
  OutputAssembler output(q_shape, sent.return_lse(), *output_dtype,
                         std::move(consumer));
  return Run(std::move(header), source, output);
}

int Client::StreamsFor(int asked, int64_t bytes) const {
  if (asked > 0) return asked;
  return bytes >= options_.auto_streams_min_bytes ? ClientOptions::kAutoStreams
                                                  : 1;
}

template <typename Request>
absl::StatusOr<v1::Summary> Client::Run(Request header, ChunkSource& source,
                                        OutputAssembler& output) {
  ProgressReporter progress(options_.progress);
  grpc::ClientContext context;
  Prepare(&context);
  const int uploads = StreamsFor(options_.upload_streams, source.total_bytes());
  const int downloads =
      StreamsFor(options_.download_streams, output.total_bytes());
  // The options decide the streams, whatever the caller's spec said.
  SpecOf(header)->set_upload_streams(uploads > 1 ? uploads : 0);
  SpecOf(header)->set_download_streams(downloads > 1 ? downloads : 0);
  if (uploads > 1 || downloads > 1) {
    SharedChunks chunks(
        &source, uploads, [&progress](int64_t done, int64_t total) {
          progress.Report(Progress::Phase::kUpload, done, total);
        });
    SharedChunkStream own(&chunks, 0);
    ResponseIntake intake(&output, &progress);
    const AttachedStreams::Prepare prepare = [this](grpc::ClientContext* c) {
      Prepare(c);
    };
    const auto cancel = [&context] { context.TryCancel(); };
    // Destroyed (cancelled and joined) before what they write into.
    std::optional<AttachedStreams> attached_uploads;
    std::optional<AttachedStreams> attached_downloads;
    if (uploads > 1) {
      attached_uploads.emplace(attached_stubs_, uploads - 1, "upload", prepare,
                               AttachedStreams::Upload(&chunks), cancel);
    }
    if (downloads > 1) {
      attached_downloads.emplace(
          attached_stubs_, downloads - 1, "download", prepare,
          AttachedStreams::Download(
              [&intake](const v1::AttendResponse& response) {
                return intake.AcceptAttached(response);
              }),
          cancel);
    }
    OutputCall<Request> call(
        &context, std::move(header), uploads > 1 ? &own : &source, &intake,
        &progress, attached_uploads ? &*attached_uploads : nullptr,
        attached_downloads ? &*attached_downloads : nullptr);
    Start(*stub_, &context, &call);
    absl::Status status = call.Run();
    if (attached_uploads.has_value()) {
      status = attached_uploads->Finish(status);
    }
    RINGATTN_RETURN_IF_ERROR(WithUnchangedMark(status, context));
    return std::move(intake.summary());
  }
  if (source.total_bytes() <= kMostBlockingUploadBytes) {
    // The metadata goes out with the first message.
    context.set_initial_metadata_corked(true);
    std::unique_ptr<grpc::ClientReaderWriter<Request, v1::AttendResponse>>
        stream;
    if constexpr (std::is_same_v<Request, v1::AttendRequest>) {
      stream = stub_->Attend(&context);
    } else {
      stream = stub_->Query(&context);
    }
    if constexpr (std::is_same_v<Request, v1::QueryRequest>) {
      // Its first chunks ride in the header, so that a small query is one
      // message; the rest follow in messages of their own, each forwarded to
      // the workers by the coordinator while the next one comes.
      v1::QueryHeader* query = header.mutable_header();
      int64_t carried = 0;
      while (carried < kMostHeaderChunkBytes) {
        v1::TensorChunk* chunk = query->add_chunks();
        if (!source.Next(chunk)) {
          query->mutable_chunks()->RemoveLast();
          break;
        }
        carried += static_cast<int64_t>(chunk->data().size());
      }
    }
    RequestSequence<Request> requests(std::move(header), &source, &progress);
    ResponseIntake intake(&output, &progress);
    RINGATTN_RETURN_IF_ERROR(WithUnchangedMark(
        RunOnThisThread(context, *stream, requests, intake), context));
    return std::move(intake.summary());
  }
  ResponseIntake intake(&output, &progress);
  OutputCall<Request> call(&context, std::move(header), &source, &intake,
                           &progress);
  Start(*stub_, &context, &call);
  RINGATTN_RETURN_IF_ERROR(WithUnchangedMark(call.Run(), context));
  return std::move(intake.summary());
}

absl::StatusOr<AttendResult> Client::Query(const std::string& context_name,
                                           const v1::AttentionSpec& spec,
                                           const HostTensor& q) {
  return RunQuery(context_name, spec, q, nullptr, nullptr);
}

absl::StatusOr<AttendResult> Client::Query(const std::string& context_name,
                                           const v1::AttentionSpec& spec,
                                           const HostTensor& q,
                                           const HostTensor& k_new,
                                           const HostTensor& v_new) {
  return RunQuery(context_name, spec, q, &k_new, &v_new);
}

absl::StatusOr<AttendResult> Client::RunQuery(const std::string& context_name,
                                              const v1::AttentionSpec& spec,
                                              const HostTensor& q,
                                              const HostTensor* k_new,
                                              const HostTensor* v_new) {
  v1::QueryRequest header;
  header.mutable_header()->set_context(context_name);
  *header.mutable_header()->mutable_spec() = WithWireDType(spec);
  const v1::AttentionSpec& sent = header.header().spec();
  absl::StatusOr<DType> dtype = DTypeFromProto(sent.wire_dtype());
  if (!dtype.ok()) return dtype.status();
  const Shape q_shape{sent.batch(), sent.q_len(), sent.q_heads(),
                      sent.head_dim()};
  RINGATTN_RETURN_IF_ERROR(CheckShape("Q", q, q_shape));

  if (k_new != nullptr) {
    const Shape kv_shape{sent.batch(), k_new->shape().seq, sent.kv_heads(),
                         sent.head_dim()};
    RINGATTN_RETURN_IF_ERROR(CheckShape("new K", *k_new, kv_shape));
    RINGATTN_RETURN_IF_ERROR(CheckShape("new V", *v_new, kv_shape));
    header.mutable_header()->set_append_length(kv_shape.seq);
  }
  absl::StatusOr<DType> output_dtype = OutputDType(sent);
  if (!output_dtype.ok()) return output_dtype.status();
  return Retrying(/*appends=*/k_new != nullptr, [&](bool& answered) {
    ChunkStream chunks(*dtype, options_.chunk_bytes);
    chunks.Add(v1::Q, q);
    if (k_new != nullptr) {
      chunks.Add(v1::K, *k_new);
      chunks.Add(v1::V, *v_new);
    }
    OutputAssembler output(q_shape, sent.return_lse(), *output_dtype);
    return Finished(Run(header, chunks, output), output, answered);
  });
}

absl::StatusOr<v1::ContextInfo> Client::CreateContext(const std::string& name,
                                                      const HostTensor& k,
                                                      const HostTensor& v,
                                                      v1::DType wire_dtype) {
  return UploadContext(/*create=*/true, name, k, v, wire_dtype);
}

absl::StatusOr<v1::ContextInfo> Client::AppendContext(const std::string& name,
                                                      const HostTensor& k,
                                                      const HostTensor& v,
                                                      v1::DType wire_dtype) {
  return UploadContext(/*create=*/false, name, k, v, wire_dtype);
}

absl::StatusOr<v1::ContextInfo> Client::UploadContext(bool create,
                                                      const std::string& name,
                                                      const HostTensor& k,
                                                      const HostTensor& v,
                                                      v1::DType wire_dtype) {
  absl::StatusOr<DType> dtype = DTypeFromProto(wire_dtype);
  if (!dtype.ok()) return dtype.status();
  RINGATTN_RETURN_IF_ERROR(CheckShape("K", k, k.shape()));
  RINGATTN_RETURN_IF_ERROR(CheckShape("V", v, k.shape()));
  v1::ContextHeader header;
  header.set_name(name);
  header.set_batch(k.shape().batch);
  header.set_kv_heads(k.shape().heads);
  header.set_head_dim(k.shape().dim);
  header.set_length(k.shape().seq);
  header.set_wire_dtype(wire_dtype);
  ChunkStream chunks(*dtype, options_.chunk_bytes);
  chunks.Add(v1::K, k);
  chunks.Add(v1::V, v);
  return UploadContextStreaming(create, header, chunks);
}

absl::StatusOr<v1::ContextInfo> Client::UploadContextStreaming(
    bool create, const v1::ContextHeader& header, ChunkSource& source) {
  v1::ContextUpload first;
  *first.mutable_header() = header;
  const int uploads = StreamsFor(options_.upload_streams, source.total_bytes());
  first.mutable_header()->set_upload_streams(uploads > 1 ? uploads : 0);
  ProgressReporter progress(options_.progress);
  grpc::ClientContext context;
  Prepare(&context);
  std::optional<SharedChunks> chunks;
  std::optional<SharedChunkStream> own;
  // Destroyed (cancelled and joined) before what it reads from.
  std::optional<AttachedStreams> attached;
  if (uploads > 1) {
    chunks.emplace(&source, uploads, [&progress](int64_t done, int64_t total) {
      progress.Report(Progress::Phase::kUpload, done, total);
    });
    own.emplace(&*chunks, 0);
    attached.emplace(
        attached_stubs_, uploads - 1, "upload",
        [this](grpc::ClientContext* c) { Prepare(c); },
        AttachedStreams::Upload(&*chunks), [&context] { context.TryCancel(); });
  }
  v1::ContextInfo info;
  ContextUploadCall call(&context, std::move(first),
                         own.has_value() ? &*own : &source, &progress,
                         attached ? &*attached : nullptr);
  if (create) {
    stub_->async()->CreateContext(&context, &info, &call);
  } else {
    stub_->async()->AppendContext(&context, &info, &call);
  }
  absl::Status status = call.Run();
  if (attached.has_value()) status = attached->Finish(status);
  RINGATTN_RETURN_IF_ERROR(status);
  return info;
}

absl::StatusOr<v1::ClusterInfo> Client::GetClusterInfo() {
  grpc::ClientContext context;
  Prepare(&context);
  v1::ClusterInfo info;
  RINGATTN_RETURN_IF_ERROR(FromGrpcStatus(
      stub_->GetClusterInfo(&context, v1::GetClusterInfoRequest(), &info)));
  return info;
}

absl::Status Client::DeleteContext(const std::string& name) {
  grpc::ClientContext context;
  Prepare(&context);
  v1::DeleteContextRequest request;
  request.set_name(name);
  v1::DeleteContextResponse response;
  return FromGrpcStatus(stub_->DeleteContext(&context, request, &response));
}

absl::StatusOr<std::vector<v1::ContextInfo>> Client::ListContexts() {
  grpc::ClientContext context;
  Prepare(&context);
  v1::ListContextsResponse response;
  RINGATTN_RETURN_IF_ERROR(FromGrpcStatus(
      stub_->ListContexts(&context, v1::ListContextsRequest(), &response)));
  return std::vector<v1::ContextInfo>(response.contexts().begin(),
                                      response.contexts().end());
}

}  // namespace ringattn
