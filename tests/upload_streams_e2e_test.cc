// One Attend request uploaded over several streams (upload_streams, the
// AttachUpload RPC) and its output brought back over several
// (download_streams, AttachDownload), end to end against a real coordinator
// and CPU workers: results equal to one stream's, and the row checks, ticket
// checks and cancellation across streams; context uploads over several
// streams. Raw streams are written by hand where the client library never
// would send what the test needs.

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "client/chunking.h"
#include "core/dtype.h"
#include "gtest/gtest.h"
#include "tests/attention_checks.h"
#include "tests/test_cluster.h"

namespace ringattn {
namespace {

// How long a raw call may take before the test counts it as hung.
constexpr std::chrono::seconds kCallLimit(30);
// The coordinator's --ring_timeout, which also bounds the wait for attached
// streams to arrive.
constexpr int kRingTimeoutSeconds = 5;

constexpr char kAttachedOk[] =
    "ringattn_requests_total{method=\"AttachUpload\",code=\"OK\"}";
constexpr char kAttachedDownloadOk[] =
    "ringattn_requests_total{method=\"AttachDownload\",code=\"OK\"}";

class UploadStreams : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<std::unique_ptr<TestCluster>> cluster = TestCluster::Start(
        {.workers = 3,
         .coordinator_flags = {
             absl::StrCat("--ring_timeout_seconds=", kRingTimeoutSeconds)}});
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = cluster->release();
  }
  static void TearDownTestSuite() { delete cluster_; }

  static std::unique_ptr<Client> ClientWith(int upload_streams,
                                            int64_t chunk_bytes) {
    ClientOptions options;
    options.upload_streams = upload_streams;
    options.chunk_bytes = chunk_bytes;
    return cluster_->NewClient(std::move(options));
  }

  static std::unique_ptr<v1::Attention::Stub> Stub() {
    return v1::Attention::NewStub(grpc::CreateChannel(
        cluster_->target(), grpc::InsecureChannelCredentials()));
  }

  static void LimitCall(grpc::ClientContext* context) {
    context->set_deadline(std::chrono::system_clock::now() + kCallLimit);
  }

  // The header of context `name`: 8 tokens, one head, D=4, fp32, over
  // `streams` streams.
  static v1::ContextUpload ContextHeader(const std::string& name, int streams) {
    v1::ContextUpload header;
    v1::ContextHeader* h = header.mutable_header();
    h->set_name(name);
    h->set_batch(1);
    h->set_kv_heads(1);
    h->set_head_dim(4);
    h->set_length(8);
    h->set_wire_dtype(v1::FP32);
    h->set_upload_streams(streams);
    return header;
  }

  // N=8, one head, D=4, fp32 (16 bytes a row), over `streams` streams.
  static v1::AttendRequest Header(int streams) {
    v1::AttendRequest request;
    v1::AttentionSpec* spec = request.mutable_header();
    spec->set_batch(1);
    spec->set_q_len(8);
    spec->set_kv_len(8);
    spec->set_q_heads(1);
    spec->set_kv_heads(1);
    spec->set_head_dim(4);
    spec->set_wire_dtype(v1::FP32);
    spec->set_upload_streams(streams);
    return request;
  }

  static v1::TensorChunk Rows(v1::TensorName tensor, int64_t offset,
                              int64_t count) {
    v1::TensorChunk chunk;
    chunk.set_tensor(tensor);
    chunk.set_token_offset(offset);
    chunk.set_token_count(count);
    chunk.set_data(std::string(static_cast<size_t>(count * 16), '\0'));
    return chunk;
  }

  static v1::AttendRequest OnAttend(v1::TensorChunk chunk) {
    v1::AttendRequest request;
    *request.mutable_chunk() = std::move(chunk);
    return request;
  }

  static v1::AttachUploadRequest OnAttached(v1::TensorChunk chunk) {
    v1::AttachUploadRequest request;
    *request.mutable_chunk() = std::move(chunk);
    return request;
  }

  // The ticket in an Attend call's initial metadata (empty fields if none).
  static v1::UploadTicket TicketOf(const grpc::ClientContext& context) {
    v1::UploadTicket ticket;
    for (const auto& [key, value] : context.GetServerInitialMetadata()) {
      const std::string text(value.data(), value.size());
      if (key == "ringattn-request-id") ticket.set_request_id(text);
      if (key == "ringattn-upload-token") ticket.set_token(text);
    }
    return ticket;
  }

  static v1::AttachUploadRequest TicketMessage(v1::UploadTicket ticket) {
    v1::AttachUploadRequest request;
    *request.mutable_ticket() = std::move(ticket);
    return request;
  }

  // An Attend call in flight, its header written.
  struct AttendCall {
    grpc::ClientContext context;
    std::unique_ptr<
        grpc::ClientReaderWriter<v1::AttendRequest, v1::AttendResponse>>
        stream;
  };

  // Starts an Attend call whose header announces `streams` streams.
  static std::unique_ptr<AttendCall> StartAttend(v1::Attention::Stub& stub,
                                                 int streams) {
    auto call = std::make_unique<AttendCall>();
    LimitCall(&call->context);
    call->stream = stub.Attend(&call->context);
    call->stream->Write(Header(streams));
    return call;
  }

  // Starts an Attend call of one upload stream and `downloads` download
  // streams; returns once its ticket is in.
  static std::unique_ptr<AttendCall> StartWithDownloads(
      v1::Attention::Stub& stub, int downloads) {
    auto call = std::make_unique<AttendCall>();
    LimitCall(&call->context);
    call->stream = stub.Attend(&call->context);
    v1::AttendRequest header = Header(1);
    header.mutable_header()->set_download_streams(downloads);
    call->stream->Write(header);
    call->stream->WaitForInitialMetadata();
    return call;
  }

  // An AttachUpload stream in flight, its first message written.
  struct AttachCall {
    grpc::ClientContext context;
    v1::AttachUploadResponse carried;
    std::unique_ptr<grpc::ClientWriter<v1::AttachUploadRequest>> stream;
    bool first_written = false;
  };

  // Starts an AttachUpload stream with `first` (a ticket, as a rule).
  static std::unique_ptr<AttachCall> StartAttach(
      v1::Attention::Stub& stub, const v1::AttachUploadRequest& first) {
    auto call = std::make_unique<AttachCall>();
    LimitCall(&call->context);
    call->stream = stub.AttachUpload(&call->context, &call->carried);
    call->first_written = call->stream->Write(first);
    return call;
  }

  // Sends `first` on an AttachUpload stream, half-closes it, and returns how
  // it ended.
  static grpc::Status AttachOnly(v1::Attention::Stub& stub,
                                 const v1::AttachUploadRequest& first) {
    std::unique_ptr<AttachCall> call = StartAttach(stub, first);
    call->stream->WritesDone();
    return call->stream->Finish();
  }

  // Half-closes an Attend stream, drains its output and returns its status.
  static grpc::Status Close(
      grpc::ClientReaderWriter<v1::AttendRequest, v1::AttendResponse>& stream) {
    stream.WritesDone();
    v1::AttendResponse response;
    while (stream.Read(&response)) {
    }
    return stream.Finish();
  }

  static TestCluster* cluster_;
};

TestCluster* UploadStreams::cluster_ = nullptr;

TEST_F(UploadStreams, ManyStreamsGiveOneStreamsResultsExactly) {
  AttentionSpec batched = SelfAttentionSpec(301, 4, 1, 80, true);
  batched.batch = 2;
  struct Case {
    AttentionSpec spec;
    int streams;
  };
  for (const Case& c :
       {Case{SelfAttentionSpec(257, 8, 2, 64, false), 4}, Case{batched, 3},
        Case{SelfAttentionSpec(131, 6, 3, 32, true), 2}}) {
    const RandomInputs in = MakeRandomInputs(c.spec, 5);
    const v1::AttentionSpec request = RequestSpec(c.spec);
    // Two or three rows a chunk: every stream carries many chunks.
    const int64_t chunk_bytes = 3 * c.spec.q_heads * c.spec.head_dim * 4;
    absl::StatusOr<AttendResult> one =
        ClientWith(1, chunk_bytes)
            ->Attend(request, in.q.view(), in.k.view(), in.v.view());
    ASSERT_TRUE(one.ok()) << one.status();
    const std::string before = cluster_->Metrics().value_or("");
    absl::StatusOr<AttendResult> many =
        ClientWith(c.streams, chunk_bytes)
            ->Attend(request, in.q.view(), in.k.view(), in.v.view());
    ASSERT_TRUE(many.ok()) << many.status();
    const std::string after = cluster_->Metrics().value_or("");

    ExpectMatchesReference(c.spec, in, *many);
    EXPECT_EQ(many->output.values(), one->output.values());
    EXPECT_EQ(many->lse, one->lse);
    EXPECT_EQ(many->summary.bytes_in(), one->summary.bytes_in());
    EXPECT_EQ(
        SeriesValue(after, kAttachedOk) - SeriesValue(before, kAttachedOk),
        c.streams - 1);
  }
}

TEST_F(UploadStreams, ProgressRisesToTheWholeUploadOverAllStreams) {
  const AttentionSpec spec = SelfAttentionSpec(199, 4, 2, 64, true);
  const RandomInputs in = MakeRandomInputs(spec, 6);
  std::vector<Progress> uploads;
  ClientOptions options;
  options.upload_streams = 3;
  options.chunk_bytes = 4 * spec.q_heads * spec.head_dim * 4;
  options.progress = [&uploads](const Progress& progress) {
    if (progress.phase == Progress::Phase::kUpload) uploads.push_back(progress);
  };
  absl::StatusOr<AttendResult> result =
      cluster_->NewClient(std::move(options))
          ->Attend(RequestSpec(spec), in.q.view(), in.k.view(), in.v.view());
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_FALSE(uploads.empty());
  const int64_t total = (199 * 4 + 2 * 199 * 2) * 64 * 4;
  for (size_t i = 1; i < uploads.size(); ++i) {
    EXPECT_GE(uploads[i].bytes_done, uploads[i - 1].bytes_done);
    EXPECT_EQ(uploads[i].bytes_total, total);
  }
  EXPECT_EQ(uploads.back().bytes_done, total);
}

TEST_F(UploadStreams, ChunkRepeatedOnAnotherStreamIsInvalidArgument) {
  auto stub = Stub();
  grpc::ClientContext context;
  LimitCall(&context);
  auto attend = stub->Attend(&context);
  ASSERT_TRUE(attend->Write(Header(2)));
  attend->WaitForInitialMetadata();
  const v1::UploadTicket ticket = TicketOf(context);
  ASSERT_FALSE(ticket.token().empty());

  grpc::ClientContext attached_context;
  LimitCall(&attached_context);
  v1::AttachUploadResponse carried;
  auto attached = stub->AttachUpload(&attached_context, &carried);
  ASSERT_TRUE(attached->Write(TicketMessage(ticket)));
  ASSERT_TRUE(attached->Write(OnAttached(Rows(v1::Q, 0, 8))));
  attached->WritesDone();
  // The attached stream ends only once its chunks were routed.
  ASSERT_TRUE(attached->Finish().ok());
  EXPECT_EQ(carried.chunks(), 1);
  EXPECT_EQ(carried.bytes(), 8 * 16);

  attend->Write(OnAttend(Rows(v1::Q, 2, 3)));
  const grpc::Status status = Close(*attend);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("tokens [2, 5) were already sent"),
            std::string::npos)
      << status.error_message();
}

// The chunks of a ChunkStream, then its first chunk once more.
class RepeatsFirstChunk : public ChunkSource {
 public:
  explicit RepeatsFirstChunk(ChunkStream* chunks) : chunks_(chunks) {}
  bool Next(v1::TensorChunk* chunk) override {
    if (chunks_->Next(chunk)) {
      if (!first_.has_value()) first_ = *chunk;
      return true;
    }
    if (repeated_ || !first_.has_value()) return false;
    repeated_ = true;
    *chunk = *first_;
    return true;
  }
  int64_t total_bytes() const override { return chunks_->total_bytes(); }

 private:
  ChunkStream* const chunks_;
  std::optional<v1::TensorChunk> first_;
  bool repeated_ = false;
};

TEST_F(UploadStreams, ClientReportsTheRefusedChunkWhicheverStreamCarriedIt) {
  const AttentionSpec spec = SelfAttentionSpec(97, 2, 1, 32, false);
  const RandomInputs in = MakeRandomInputs(spec, 9);
  for (int attempt = 0; attempt < 5; ++attempt) {
    ChunkStream chunks(DType::kFloat32, /*chunk_bytes=*/2 * 2 * 32 * 4);
    chunks.Add(v1::Q, in.q.view());
    chunks.Add(v1::K, in.k.view());
    chunks.Add(v1::V, in.v.view());
    RepeatsFirstChunk source(&chunks);
    absl::StatusOr<v1::Summary> summary = ClientWith(3, 1024)->AttendStreaming(
        RequestSpec(spec), source,
        [](const v1::OutputChunk&) { return absl::OkStatus(); });
    EXPECT_EQ(summary.status().code(), absl::StatusCode::kInvalidArgument)
        << summary.status();
    EXPECT_NE(summary.status().message().find("were already sent"),
              std::string::npos)
        << summary.status();
  }
}

TEST_F(UploadStreams, RowsMissingAcrossStreamsFailAsOnOneStream) {
  auto stub = Stub();
  std::unique_ptr<AttendCall> one = StartAttend(*stub, 1);
  one->stream->Write(OnAttend(Rows(v1::Q, 0, 8)));
  one->stream->Write(OnAttend(Rows(v1::K, 0, 8)));
  one->stream->Write(OnAttend(Rows(v1::V, 0, 6)));
  const grpc::Status on_one = Close(*one->stream);

  std::unique_ptr<AttendCall> two = StartAttend(*stub, 2);
  two->stream->WaitForInitialMetadata();
  std::unique_ptr<AttachCall> attached =
      StartAttach(*stub, TicketMessage(TicketOf(two->context)));
  attached->stream->Write(OnAttached(Rows(v1::K, 0, 8)));
  attached->stream->Write(OnAttached(Rows(v1::V, 0, 6)));
  attached->stream->WritesDone();
  ASSERT_TRUE(attached->stream->Finish().ok());
  two->stream->Write(OnAttend(Rows(v1::Q, 0, 8)));
  const grpc::Status on_two = Close(*two->stream);

  EXPECT_EQ(on_one.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(on_one.error_message().find("missing tokens [6, 8)"),
            std::string::npos)
      << on_one.error_message();
  EXPECT_EQ(on_two.error_code(), on_one.error_code());
  EXPECT_EQ(on_two.error_message(), on_one.error_message());
}

TEST_F(UploadStreams, TicketsAreCheckedAndFailedAttachesLeaveTheRequest) {
  auto stub = Stub();
  std::unique_ptr<AttendCall> attend = StartAttend(*stub, 2);
  attend->stream->WaitForInitialMetadata();
  const v1::UploadTicket ticket = TicketOf(attend->context);

  v1::UploadTicket wrong_token = ticket;
  wrong_token.set_token("0123456789abcdef0123456789abcdef");
  const grpc::Status denied = AttachOnly(*stub, TicketMessage(wrong_token));
  EXPECT_EQ(denied.error_code(), grpc::StatusCode::PERMISSION_DENIED)
      << denied.error_message();

  v1::UploadTicket unknown = ticket;
  unknown.set_request_id("no-such-request");
  const grpc::Status not_found = AttachOnly(*stub, TicketMessage(unknown));
  EXPECT_EQ(not_found.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(not_found.error_message().find("'no-such-request'"),
            std::string::npos)
      << not_found.error_message();

  const grpc::Status no_ticket =
      AttachOnly(*stub, OnAttached(Rows(v1::K, 0, 8)));
  EXPECT_EQ(no_ticket.error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  std::unique_ptr<AttachCall> attached =
      StartAttach(*stub, TicketMessage(ticket));
  ASSERT_TRUE(attached->first_written);
  ASSERT_TRUE(attached->stream->Write(OnAttached(Rows(v1::K, 0, 8))));
  attached->stream->WaitForInitialMetadata();
  // The header announced one attached stream, and it has joined.
  const grpc::Status one_too_many = AttachOnly(*stub, TicketMessage(ticket));
  EXPECT_EQ(one_too_many.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
      << one_too_many.error_message();

  attached->stream->Write(OnAttached(Rows(v1::V, 0, 8)));
  attached->stream->WritesDone();
  EXPECT_TRUE(attached->stream->Finish().ok());
  attend->stream->Write(OnAttend(Rows(v1::Q, 0, 8)));
  const grpc::Status status = Close(*attend->stream);
  EXPECT_TRUE(status.ok()) << status.error_message();
}

TEST_F(UploadStreams, CancelledRequestEndsItsAttachedStreams) {
  auto stub = Stub();
  std::unique_ptr<AttendCall> attend = StartAttend(*stub, 3);
  attend->stream->WaitForInitialMetadata();
  const v1::UploadTicket ticket = TicketOf(attend->context);
  std::unique_ptr<AttachCall> attached =
      StartAttach(*stub, TicketMessage(ticket));
  ASSERT_TRUE(attached->first_written);
  ASSERT_TRUE(attached->stream->Write(OnAttached(Rows(v1::K, 0, 8))));
  attached->stream->WaitForInitialMetadata();

  attend->context.TryCancel();
  // The attached stream never half-closes: only the coordinator ending it
  // makes Finish return before the call's limit.
  const grpc::Status ended = attached->stream->Finish();
  EXPECT_EQ(ended.error_code(), grpc::StatusCode::CANCELLED)
      << ended.error_message();
  EXPECT_EQ(attend->stream->Finish().error_code(), grpc::StatusCode::CANCELLED);

  // The request is gone from the coordinator, which serves the next one.
  const grpc::Status late = AttachOnly(*stub, TicketMessage(ticket));
  EXPECT_EQ(late.error_code(), grpc::StatusCode::NOT_FOUND)
      << late.error_message();
  const AttentionSpec spec = SelfAttentionSpec(64, 2, 1, 32, true);
  const RandomInputs in = MakeRandomInputs(spec, 7);
  absl::StatusOr<AttendResult> next = ClientWith(3, 1024)->Attend(
      RequestSpec(spec), in.q.view(), in.k.view(), in.v.view());
  ASSERT_TRUE(next.ok()) << next.status();
  ExpectMatchesReference(spec, in, *next);
}

TEST_F(UploadStreams, BrokenAttachedStreamFailsTheRequestSayingWhich) {
  auto stub = Stub();
  std::unique_ptr<AttendCall> attend = StartAttend(*stub, 2);
  attend->stream->WaitForInitialMetadata();
  attend->stream->Write(OnAttend(Rows(v1::Q, 0, 8)));
  attend->stream->WritesDone();
  std::unique_ptr<AttachCall> attached =
      StartAttach(*stub, TicketMessage(TicketOf(attend->context)));
  ASSERT_TRUE(attached->first_written);
  ASSERT_TRUE(attached->stream->Write(OnAttached(Rows(v1::K, 0, 8))));
  attached->stream->WaitForInitialMetadata();
  attached->context.TryCancel();
  attached->stream->Finish();

  v1::AttendResponse response;
  while (attend->stream->Read(&response)) {
  }
  const grpc::Status status = attend->stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_NE(status.error_message().find("attached upload stream 1"),
            std::string::npos)
      << status.error_message();
}

TEST_F(UploadStreams, StreamsThatNeverAttachEndTheRequestAfterRingTimeout) {
  auto stub = Stub();
  std::unique_ptr<AttendCall> attend = StartAttend(*stub, 2);
  attend->stream->Write(OnAttend(Rows(v1::Q, 0, 8)));
  attend->stream->Write(OnAttend(Rows(v1::K, 0, 8)));
  attend->stream->Write(OnAttend(Rows(v1::V, 0, 8)));
  const grpc::Status status = Close(*attend->stream);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_NE(status.error_message().find("only 0 of the 1 attached"),
            std::string::npos)
      << status.error_message();
}

TEST_F(UploadStreams, DownloadStreamsGiveOneStreamsResultsExactly) {
  // 4.2 MB of fp32 output: five 1 MiB chunks dealt over the streams.
  const AttentionSpec spec = SelfAttentionSpec(2053, 8, 2, 64, true);
  const RandomInputs in = MakeRandomInputs(spec, 9);
  v1::AttentionSpec request = RequestSpec(spec);
  request.set_return_lse(true);
  absl::StatusOr<AttendResult> one =
      ClientWith(1, 1 << 20)
          ->Attend(request, in.q.view(), in.k.view(), in.v.view());
  ASSERT_TRUE(one.ok()) << one.status();
  for (const auto& [uploads, downloads] :
       std::vector<std::pair<int, int>>{{1, 3}, {3, 2}, {2, 5}}) {
    SCOPED_TRACE(absl::StrCat(uploads, " up, ", downloads, " down"));
    ClientOptions options;
    options.upload_streams = uploads;
    options.download_streams = downloads;
    const std::string before = cluster_->Metrics().value_or("");
    absl::StatusOr<AttendResult> many =
        cluster_->NewClient(std::move(options))
            ->Attend(request, in.q.view(), in.k.view(), in.v.view());
    ASSERT_TRUE(many.ok()) << many.status();
    const std::string after = cluster_->Metrics().value_or("");
    ExpectMatchesReference(spec, in, *many);
    EXPECT_EQ(many->output.values(), one->output.values());
    EXPECT_EQ(many->lse, one->lse);
    EXPECT_EQ(many->summary.bytes_out(), one->summary.bytes_out());
    EXPECT_EQ(SeriesValue(after, kAttachedDownloadOk) -
                  SeriesValue(before, kAttachedDownloadOk),
              downloads - 1);
  }
}

TEST_F(UploadStreams, LargeRequestsTakeFourStreamsEachWayByDefault) {
  const AttentionSpec spec = SelfAttentionSpec(1031, 4, 2, 64, true);
  const RandomInputs in = MakeRandomInputs(spec, 12);
  const v1::AttentionSpec request = RequestSpec(spec);
  // Q, K and V are 2.1 MB of fp32 and O with its LSE 1.07 MB: both over
  // 1 MiB, both under 64 MiB.
  for (const auto& [min_bytes, attached] :
       std::vector<std::pair<int64_t, int>>{{1 << 20, 3}, {64 << 20, 0}}) {
    SCOPED_TRACE(absl::StrCat("auto_streams_min_bytes ", min_bytes));
    ClientOptions options;
    options.chunk_bytes = 64 << 10;
    options.auto_streams_min_bytes = min_bytes;
    const std::string before = cluster_->Metrics().value_or("");
    absl::StatusOr<AttendResult> result =
        cluster_->NewClient(std::move(options))
            ->Attend(request, in.q.view(), in.k.view(), in.v.view());
    ASSERT_TRUE(result.ok()) << result.status();
    const std::string after = cluster_->Metrics().value_or("");
    ExpectMatchesReference(spec, in, *result);
    EXPECT_EQ(
        SeriesValue(after, kAttachedOk) - SeriesValue(before, kAttachedOk),
        attached);
    EXPECT_EQ(SeriesValue(after, kAttachedDownloadOk) -
                  SeriesValue(before, kAttachedDownloadOk),
              attached);
  }
}

TEST_F(UploadStreams, StreamingOverDownloadStreamsHandsOnEveryRowOnce) {
  const AttentionSpec spec = SelfAttentionSpec(1499, 8, 1, 80, false);
  const RandomInputs in = MakeRandomInputs(spec, 10);
  ChunkStream source(DType::kFloat32, 1 << 20);
  source.Add(v1::Q, in.q.view());
  source.Add(v1::K, in.k.view());
  source.Add(v1::V, in.v.view());
  ClientOptions options;
  options.download_streams = 4;
  std::vector<int> seen(static_cast<size_t>(spec.q_len), 0);
  absl::StatusOr<v1::Summary> summary =
      cluster_->NewClient(std::move(options))
          ->AttendStreaming(
              RequestSpec(spec), source, [&seen](const v1::OutputChunk& chunk) {
                for (int64_t t = 0; t < chunk.token_count(); ++t) {
                  ++seen[chunk.token_offset() + t];
                }
                return absl::OkStatus();
              });
  ASSERT_TRUE(summary.ok()) << summary.status();
  for (int64_t t = 0; t < spec.q_len; ++t) {
    ASSERT_EQ(seen[t], 1) << "token " << t;
  }
}

TEST_F(UploadStreams, DownloadTicketsAreCheckedAndMissingStreamsEndTheRequest) {
  auto stub = Stub();
  v1::UploadTicket unknown;
  unknown.set_request_id("no-such-request");
  grpc::ClientContext lost;
  LimitCall(&lost);
  v1::AttendResponse response;
  auto nowhere = stub->AttachDownload(&lost, unknown);
  EXPECT_FALSE(nowhere->Read(&response));
  EXPECT_EQ(nowhere->Finish().error_code(), grpc::StatusCode::NOT_FOUND);

  // One stream up, two down: the call hands out its ticket at once.
  std::unique_ptr<AttendCall> attend = StartWithDownloads(*stub, 2);
  v1::UploadTicket ticket = TicketOf(attend->context);
  ASSERT_FALSE(ticket.token().empty());
  ticket.set_token("wrong");
  grpc::ClientContext guessing;
  LimitCall(&guessing);
  auto guessed = stub->AttachDownload(&guessing, ticket);
  EXPECT_FALSE(guessed->Read(&response));
  EXPECT_EQ(guessed->Finish().error_code(),
            grpc::StatusCode::PERMISSION_DENIED);

  // The announced stream never attaches: once the output is out on the
  // call's own stream, the request waits for it until the ring timeout.
  attend->stream->Write(OnAttend(Rows(v1::Q, 0, 8)));
  attend->stream->Write(OnAttend(Rows(v1::K, 0, 8)));
  attend->stream->Write(OnAttend(Rows(v1::V, 0, 8)));
  const grpc::Status status = Close(*attend->stream);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_NE(status.error_message().find("only 0 of the 1 attached download"),
            std::string::npos)
      << status.error_message();
}

TEST_F(UploadStreams, DownloadStreamBeyondTheAnnouncedIsRefused) {
  auto stub = Stub();
  std::unique_ptr<AttendCall> attend = StartWithDownloads(*stub, 2);
  const v1::UploadTicket ticket = TicketOf(attend->context);
  // One attached stream was announced and two come: whichever the
  // coordinator sees second is refused at once, while the other waits for
  // its share of output, which comes only once the rows are sent.
  std::vector<grpc::Status> statuses(2);
  std::vector<std::thread> downloads;
  std::atomic<int> ended{0};
  absl::Notification one_ended;
  for (grpc::Status& status : statuses) {
    downloads.emplace_back([&, status_out = &status] {
      grpc::ClientContext context;
      LimitCall(&context);
      auto stream = stub->AttachDownload(&context, ticket);
      v1::AttendResponse response;
      while (stream->Read(&response)) {
      }
      *status_out = stream->Finish();
      if (ended.fetch_add(1) == 0) one_ended.Notify();
    });
  }
  one_ended.WaitForNotification();
  attend->stream->Write(OnAttend(Rows(v1::Q, 0, 8)));
  attend->stream->Write(OnAttend(Rows(v1::K, 0, 8)));
  attend->stream->Write(OnAttend(Rows(v1::V, 0, 8)));
  const grpc::Status status = Close(*attend->stream);
  for (std::thread& download : downloads) download.join();
  EXPECT_TRUE(status.ok()) << status.error_message();
  const bool first_refused =
      statuses[0].error_code() == grpc::StatusCode::FAILED_PRECONDITION;
  const grpc::Status& refused = statuses[first_refused ? 0 : 1];
  const grpc::Status& served = statuses[first_refused ? 1 : 0];
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
      << refused.error_message();
  EXPECT_NE(refused.error_message().find("takes no more download streams"),
            std::string::npos)
      << refused.error_message();
  EXPECT_TRUE(served.ok()) << served.error_message();
}

// CreateContext and AppendContext take attached upload streams as Attend
// does; the context then answers queries as one uploaded over one stream.
TEST_F(UploadStreams, ContextsUploadAndAppendOverSeveralStreams) {
  const int64_t n = 1499, added = 263;
  AttentionSpec spec = SelfAttentionSpec(n + added, 8, 2, 64, true);
  spec.q_len = 17;
  const RandomInputs in = MakeRandomInputs(spec, 13);
  ClientOptions options;
  options.chunk_bytes = 16 << 10;
  options.upload_streams = 3;
  std::unique_ptr<Client> client = cluster_->NewClient(std::move(options));
  const std::string before = cluster_->Metrics().value_or("");
  ASSERT_TRUE(client
                  ->CreateContext("streamed", in.k.view().Slice(0, n),
                                  in.v.view().Slice(0, n))
                  .ok());
  absl::StatusOr<v1::ContextInfo> grown =
      client->AppendContext("streamed", in.k.view().Slice(n, n + added),
                            in.v.view().Slice(n, n + added));
  ASSERT_TRUE(grown.ok()) << grown.status();
  EXPECT_EQ(grown->length(), n + added);
  const std::string after = cluster_->Metrics().value_or("");
  EXPECT_EQ(SeriesValue(after, kAttachedOk) - SeriesValue(before, kAttachedOk),
            4);
  absl::StatusOr<AttendResult> result =
      client->Query("streamed", RequestSpec(spec), in.q.view());
  ASSERT_TRUE(result.ok()) << result.status();
  ExpectMatchesReference(spec, in, *result);
  EXPECT_TRUE(client->DeleteContext("streamed").ok());
  // Refused before it hands out a ticket: the server's reason, not the
  // attached streams' missing ticket.
  const absl::Status unknown =
      client
          ->AppendContext("streamed", in.k.view().Slice(0, n),
                          in.v.view().Slice(0, n))
          .status();
  EXPECT_EQ(unknown.code(), absl::StatusCode::kNotFound) << unknown;
}

// A context upload whose announced streams never attach fails once the ring
// timeout has passed, and leaves no context behind.
TEST_F(UploadStreams, ContextUploadWhoseStreamsNeverAttachLeavesNoContext) {
  std::unique_ptr<v1::Attention::Stub> stub = Stub();
  grpc::ClientContext context;
  LimitCall(&context);
  v1::ContextInfo info;
  std::unique_ptr<grpc::ClientWriter<v1::ContextUpload>> writer =
      stub->CreateContext(&context, &info);
  const v1::ContextUpload header = ContextHeader("never-attached", 2);
  ASSERT_TRUE(writer->Write(header));
  // Every row comes on this stream; the second one announced never does.
  for (v1::TensorName tensor : {v1::K, v1::V}) {
    v1::ContextUpload chunk;
    *chunk.mutable_chunk() = Rows(tensor, 0, 8);
    ASSERT_TRUE(writer->Write(chunk));
  }
  writer->WritesDone();
  const grpc::Status status = writer->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
      << status.error_message();
  EXPECT_NE(status.error_message().find("attached upload streams"),
            std::string::npos)
      << status.error_message();
  absl::StatusOr<std::vector<v1::ContextInfo>> listed =
      cluster_->NewClient()->ListContexts();
  ASSERT_TRUE(listed.ok()) << listed.status();
  for (const v1::ContextInfo& context_info : *listed) {
    EXPECT_NE(context_info.name(), "never-attached");
  }
}

TEST_F(UploadStreams, ContextUploadAskingTooManyStreamsIsInvalidArgument) {
  std::unique_ptr<v1::Attention::Stub> stub = Stub();
  grpc::ClientContext context;
  LimitCall(&context);
  v1::ContextInfo info;
  std::unique_ptr<grpc::ClientWriter<v1::ContextUpload>> writer =
      stub->CreateContext(&context, &info);
  const v1::ContextUpload header = ContextHeader("too-many-streams", 65);
  writer->Write(header);
  writer->WritesDone();
  const grpc::Status status = writer->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << status.error_message();
  EXPECT_NE(status.error_message().find("'upload_streams' must be in [0, 64]"),
            std::string::npos)
      << status.error_message();
}

}  // namespace
}  // namespace ringattn
