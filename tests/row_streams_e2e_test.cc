// A large upload reaching each worker over several connections (the
// coordinator's --worker_row_streams, the Worker service's AttachRows), end to
// end against a real coordinator and CPU workers: results against the float64
// reference (output back over the same streams, forwarded to one or several
// download streams), the streams counted on /metrics, a worker killed
// mid-upload or while its output streams failing the request with UNAVAILABLE
// in time (a context upload too, leaving no context), queries of a resident
// context, context uploads and appends over the same streams (one cancelled
// by its client midway), streams that carry no rows, and out-of-range flags
// stopping the coordinator at start.

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/child_process.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "ringattn/v1/attention.grpc.pb.h"
#include "tests/attention_checks.h"
#include "tests/test_cluster.h"

namespace ringattn {
namespace {

constexpr char kRowStreams[] = "ringattn_worker_row_streams_total";

class RowStreams : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    // Every upload past one message uses three streams per worker.
    absl::StatusOr<std::unique_ptr<TestCluster>> cluster = TestCluster::Start(
        {.workers = 2,
         .coordinator_flags = {"--worker_row_streams=3",
                               "--row_streams_min_bytes=1"}});
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = cluster->release();
  }
  static void TearDownTestSuite() { delete cluster_; }

  static double StreamsOpened() {
    absl::StatusOr<std::string> metrics = cluster_->Metrics();
    EXPECT_TRUE(metrics.ok()) << metrics.status();
    return metrics.ok() ? SeriesValue(*metrics, kRowStreams) : -1;
  }

  // Sends `spec` in chunks of 64 KiB (so that every stream carries some),
  // takes the output over `download_streams`, and checks the result; the
  // request must open 2 AttachRows streams per worker.
  static void ExpectMatchesOverRowStreams(const AttentionSpec& spec,
                                          v1::DType wire, uint32_t seed,
                                          int download_streams) {
    const double before = StreamsOpened();
    const RandomInputs in = MakeRandomInputs(spec, seed, wire);
    ClientOptions options;
    options.chunk_bytes = 64 << 10;
    options.download_streams = download_streams;
    absl::StatusOr<AttendResult> result =
        cluster_->NewClient(std::move(options))
            ->Attend(RequestSpec(spec, wire), in.q.view(), in.k.view(),
                     in.v.view());
    ASSERT_TRUE(result.ok()) << result.status();
    ExpectMatchesReference(spec, in, *result);
    EXPECT_EQ(StreamsOpened() - before, 4);
  }

  static TestCluster* cluster_;
};

TestCluster* RowStreams::cluster_ = nullptr;

TEST_F(RowStreams, CausalGqaPrimeLengthMatchesReference) {
  // Q alone is 2.1 MB of fp32, past the one-message path.
  ExpectMatchesOverRowStreams(SelfAttentionSpec(1031, 8, 2, 64, true), v1::FP32,
                              3, /*download_streams=*/1);
}

TEST_F(RowStreams, DenseBfloat16WithHeadDim80MatchesReference) {
  ExpectMatchesOverRowStreams(SelfAttentionSpec(1499, 8, 1, 80, false),
                              v1::BF16, 4, /*download_streams=*/1);
}

// The workers' output over their row streams, forwarded by the threads that
// read them to the client's attached download streams.
TEST_F(RowStreams, OutputForwardedToDownloadStreamsMatchesReference) {
  ExpectMatchesOverRowStreams(SelfAttentionSpec(1031, 8, 2, 64, true), v1::FP32,
                              5, /*download_streams=*/3);
  ExpectMatchesOverRowStreams(SelfAttentionSpec(1499, 8, 1, 80, false),
                              v1::BF16, 6, /*download_streams=*/2);
}

// Queries of a resident context take the client's attached streams both ways
// and reach the workers over their row streams, whichever strategy runs; a
// decode step's new K/V rows travel the same way and join the context.
TEST_F(RowStreams, QueriesOverAttachedStreamsMatchReferenceInEveryStrategy) {
  constexpr char kAttached[] =
      "ringattn_requests_total{method=\"AttachUpload\",code=\"OK\"}";
  constexpr char kAttachedDownload[] =
      "ringattn_requests_total{method=\"AttachDownload\",code=\"OK\"}";
  const int64_t n = 1499, appended = 41;
  // 601 query rows, 1.2 MB of fp32: past the one-message path.
  AttentionSpec spec = SelfAttentionSpec(n, 8, 2, 64, true);
  spec.q_len = 601;
  const RandomInputs in = MakeRandomInputs(spec, 11);
  ClientOptions options;
  options.chunk_bytes = 64 << 10;
  options.upload_streams = 3;
  options.download_streams = 2;
  std::unique_ptr<Client> client = cluster_->NewClient(std::move(options));
  ASSERT_TRUE(client->CreateContext("streamed", in.k.view(), in.v.view()).ok());
  const std::pair<v1::Strategy, v1::PartialMerge> runs[] = {
      {v1::PASS_KV, v1::MERGE_AUTO},
      {v1::PASS_Q, v1::MERGE_AUTO},
      {v1::BROADCAST_Q, v1::MERGE_AT_COORDINATOR},
      {v1::BROADCAST_Q, v1::MERGE_ON_WORKERS}};
  for (const auto& [strategy, merge] : runs) {
    SCOPED_TRACE(absl::StrCat(v1::Strategy_Name(strategy), " ",
                              v1::PartialMerge_Name(merge)));
    v1::AttentionSpec request = RequestSpec(spec);
    request.set_strategy(strategy);
    request.set_partial_merge(merge);
    const std::string metrics_before = cluster_->Metrics().value_or("");
    const double rows_before = StreamsOpened();
    absl::StatusOr<AttendResult> result =
        client->Query("streamed", request, in.q.view());
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->summary.strategy(), strategy);
    ExpectMatchesReference(spec, in, *result);
    const std::string metrics_after = cluster_->Metrics().value_or("");
    EXPECT_EQ(SeriesValue(metrics_after, kAttached) -
                  SeriesValue(metrics_before, kAttached),
              2);
    EXPECT_EQ(SeriesValue(metrics_after, kAttachedDownload) -
                  SeriesValue(metrics_before, kAttachedDownload),
              1);
    EXPECT_EQ(StreamsOpened() - rows_before, 4);
  }
  // A decode step of many rows: its new K and V go over the streams too.
  AttentionSpec grown_spec = spec;
  grown_spec.kv_len = n + appended;
  RandomInputs grown = MakeRandomInputs(grown_spec, 12);
  CopyView(in.k.view(), grown.k.view().Slice(0, n));
  CopyView(in.v.view(), grown.v.view().Slice(0, n));
  absl::StatusOr<AttendResult> stepped =
      client->Query("streamed", RequestSpec(grown_spec), grown.q.view(),
                    grown.k.view().Slice(n, n + appended),
                    grown.v.view().Slice(n, n + appended));
  ASSERT_TRUE(stepped.ok()) << stepped.status();
  ExpectMatchesReference(grown_spec, grown, *stepped);
  absl::StatusOr<std::vector<v1::ContextInfo>> listed = client->ListContexts();
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].length(), n + appended);
  EXPECT_TRUE(client->DeleteContext("streamed").ok());
}

// A context upload and a large append reach their workers over the row
// streams too, and queries of the context then match the reference.
TEST_F(RowStreams, ContextUploadsAndAppendsGoOverRowStreams) {
  const int64_t n = 1499, appended = 1301;
  AttentionSpec spec = SelfAttentionSpec(n + appended, 8, 2, 64, true);
  spec.q_len = 601;
  const RandomInputs in = MakeRandomInputs(spec, 13);
  ClientOptions options;
  options.chunk_bytes = 64 << 10;
  std::unique_ptr<Client> client = cluster_->NewClient(std::move(options));
  // 1.5 MB of K and V: past the one-message path, so both workers take
  // their halves over two more streams each.
  double before = StreamsOpened();
  ASSERT_TRUE(client
                  ->CreateContext("piecewise", in.k.view().Slice(0, n),
                                  in.v.view().Slice(0, n))
                  .ok());
  EXPECT_EQ(StreamsOpened() - before, 4);
  // 1.3 MB more, all of it for the worker holding the context's end (within
  // the append slack of an even share).
  before = StreamsOpened();
  absl::StatusOr<v1::ContextInfo> grown =
      client->AppendContext("piecewise", in.k.view().Slice(n, n + appended),
                            in.v.view().Slice(n, n + appended));
  ASSERT_TRUE(grown.ok()) << grown.status();
  EXPECT_EQ(grown->length(), n + appended);
  EXPECT_EQ(StreamsOpened() - before, 2);
  absl::StatusOr<AttendResult> result =
      client->Query("piecewise", RequestSpec(spec), in.q.view());
  ASSERT_TRUE(result.ok()) << result.status();
  ExpectMatchesReference(spec, in, *result);
  EXPECT_TRUE(client->DeleteContext("piecewise").ok());
}

// A client that cancels its context upload once the coordinator opened the
// row streams, with part of the rows sent: the upload ends CANCELLED, no
// context of that name is left, and the same upload then succeeds.
TEST_F(RowStreams, ClientThatCancelsAContextUploadLeavesNoContext) {
  constexpr char kCancelled[] =
      "ringattn_requests_total{method=\"CreateContext\",code=\"CANCELLED\"}";
  // 4096 tokens of two heads of 64 fp32 values: 2 MiB each of K and V.
  const int64_t n = 4096, row_bytes = 2 * 64 * 4;
  const double before = StreamsOpened();
  absl::StatusOr<std::string> metrics = cluster_->Metrics();
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  const double cancelled_before = SeriesValue(*metrics, kCancelled);
  {
    auto stub = v1::Attention::NewStub(grpc::CreateChannel(
        cluster_->target(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(30));
    v1::ContextInfo info;
    std::unique_ptr<grpc::ClientWriter<v1::ContextUpload>> writer =
        stub->CreateContext(&context, &info);
    v1::ContextUpload header;
    v1::ContextHeader* h = header.mutable_header();
    h->set_name("cancelled");
    h->set_batch(1);
    h->set_kv_heads(2);
    h->set_head_dim(64);
    h->set_length(n);
    h->set_wire_dtype(v1::FP32);
    ASSERT_TRUE(writer->Write(header));
    v1::ContextUpload chunk;
    v1::TensorChunk* rows = chunk.mutable_chunk();
    rows->set_tensor(v1::K);
    rows->set_token_count(n / 2);
    rows->set_data(std::string(static_cast<size_t>(n / 2 * row_bytes), '\1'));
    ASSERT_TRUE(writer->Write(chunk));
    // Two more streams to each worker once the coordinator read the header.
    const absl::Time give_up = absl::Now() + absl::Seconds(20);
    while (StreamsOpened() - before < 4 && absl::Now() < give_up) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    ASSERT_EQ(StreamsOpened() - before, 4);
    context.TryCancel();
    EXPECT_EQ(writer->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  // The client's side ends at once; the coordinator's call ends once it has
  // seen the cancel and let go of the upload (until then a new upload of the
  // name is refused ABORTED, "retry after it"), and counts it then.
  const absl::Time give_up = absl::Now() + absl::Seconds(20);
  double cancelled = cancelled_before;
  while (cancelled == cancelled_before && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(10));
    metrics = cluster_->Metrics();
    ASSERT_TRUE(metrics.ok()) << metrics.status();
    cancelled = SeriesValue(*metrics, kCancelled);
  }
  ASSERT_EQ(cancelled, cancelled_before + 1);
  std::unique_ptr<Client> client = cluster_->NewClient();
  absl::StatusOr<std::vector<v1::ContextInfo>> listed = client->ListContexts();
  ASSERT_TRUE(listed.ok()) << listed.status();
  for (const v1::ContextInfo& info : *listed) {
    EXPECT_NE(info.name(), "cancelled");
  }
  AttentionSpec spec = SelfAttentionSpec(n, 4, 2, 64, true);
  spec.q_len = 97;
  const RandomInputs in = MakeRandomInputs(spec, 11);
  ASSERT_TRUE(
      client->CreateContext("cancelled", in.k.view(), in.v.view()).ok());
  absl::StatusOr<AttendResult> result =
      client->Query("cancelled", RequestSpec(spec), in.q.view());
  ASSERT_TRUE(result.ok()) << result.status();
  ExpectMatchesReference(spec, in, *result);
  EXPECT_TRUE(client->DeleteContext("cancelled").ok());
}

// Two workers, each reached over four streams for any upload past one
// message.
absl::StatusOr<std::unique_ptr<TestCluster>> StartFaultCluster() {
  return TestCluster::Start(
      {.workers = 2,
       .coordinator_flags = {"--worker_row_streams=4",
                             "--row_streams_min_bytes=1",
                             "--ring_timeout_seconds=10"}});
}

// Client options that kill worker 1 of `cluster` once half of an upload is
// out (rows are then on their way over every stream), setting `killed`.
ClientOptions KillingAtHalfUpload(TestCluster& cluster,
                                  std::atomic<bool>& killed) {
  ClientOptions options;
  options.chunk_bytes = 64 << 10;
  options.progress = [&cluster, &killed](const Progress& progress) {
    if (progress.phase == Progress::Phase::kUpload &&
        progress.bytes_done * 2 >= progress.bytes_total &&
        !killed.exchange(true)) {
      cluster.KillWorker(1);
    }
  };
  return options;
}

// Waits for the coordinator to find the killed worker gone, then starts one
// that takes its rank, and waits until the cluster is ready again.
absl::Status ReplaceKilledWorker(TestCluster& cluster) {
  if (absl::Status gone = cluster.WaitReady(false, absl::Seconds(10));
      !gone.ok()) {
    return gone;
  }
  if (absl::Status started = cluster.StartWorker(); !started.ok()) {
    return started;
  }
  return cluster.WaitReady(true, absl::Seconds(20));
}

// More streams than a worker gets chunks: the row streams that carry no rows
// still reach their worker and end, for a request, a context upload and a
// query of it alike, instead of waiting out their deadline.
TEST(RowStreamCounts, StreamsThatCarryNoRowsStillEnd) {
  absl::StatusOr<std::unique_ptr<TestCluster>> cluster =
      TestCluster::Start({.workers = 2,
                          .coordinator_flags = {"--worker_row_streams=16",
                                                "--row_streams_min_bytes=1",
                                                "--ring_timeout_seconds=10"}});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  // 1.5 MB per tensor: six chunks each, fewer than the 15 row streams of a
  // worker.
  const AttentionSpec spec = SelfAttentionSpec(1499, 4, 2, 64, true);
  const RandomInputs in = MakeRandomInputs(spec, 10);
  std::unique_ptr<Client> client = (*cluster)->NewClient();
  const absl::Time start = absl::Now();
  absl::StatusOr<AttendResult> result =
      client->Attend(RequestSpec(spec), in.q.view(), in.k.view(), in.v.view());
  ASSERT_TRUE(result.ok()) << result.status();
  ExpectMatchesReference(spec, in, *result);
  ASSERT_TRUE(
      client->CreateContext("few-chunks", in.k.view(), in.v.view()).ok());
  result = client->Query("few-chunks", RequestSpec(spec), in.q.view());
  ASSERT_TRUE(result.ok()) << result.status();
  ExpectMatchesReference(spec, in, *result);
  EXPECT_LT(absl::Now() - start, absl::Seconds(8))
      << "a stream without rows must not wait out its deadline";
}

TEST(RowStreamFaults, WorkerKilledMidUploadFailsTheRequestInTime) {
  absl::StatusOr<std::unique_ptr<TestCluster>> cluster = StartFaultCluster();
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const AttentionSpec spec = SelfAttentionSpec(6000, 4, 2, 64, false);
  const RandomInputs in = MakeRandomInputs(spec, 7);
  std::atomic<bool> killed{false};
  const ClientOptions options = KillingAtHalfUpload(**cluster, killed);
  const absl::Time start = absl::Now();
  absl::StatusOr<AttendResult> result = (*cluster)->NewClient(options)->Attend(
      RequestSpec(spec), in.q.view(), in.k.view(), in.v.view());
  ASSERT_TRUE(killed);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable)
      << result.status();
  EXPECT_NE(result.status().message().find("worker"), std::string::npos);
  EXPECT_LT(absl::Now() - start, absl::Seconds(20))
      << "failure must not wait out a hang";

  // The coordinator finds the worker gone; a new one takes its rank.
  ASSERT_TRUE(ReplaceKilledWorker(**cluster).ok());
  const AttentionSpec next = SelfAttentionSpec(1031, 4, 2, 64, true);
  const RandomInputs again = MakeRandomInputs(next, 8);
  absl::StatusOr<AttendResult> healed = (*cluster)->NewClient()->Attend(
      RequestSpec(next), again.q.view(), again.k.view(), again.v.view());
  ASSERT_TRUE(healed.ok()) << healed.status();
  ExpectMatchesReference(next, again, *healed);
}

TEST(RowStreamFaults, WorkerKilledMidContextUploadFailsItInTime) {
  absl::StatusOr<std::unique_ptr<TestCluster>> cluster = StartFaultCluster();
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  AttentionSpec spec = SelfAttentionSpec(6000, 4, 2, 64, false);
  spec.q_len = 64;
  const RandomInputs in = MakeRandomInputs(spec, 9);
  std::atomic<bool> killed{false};
  const ClientOptions options = KillingAtHalfUpload(**cluster, killed);
  const absl::Time start = absl::Now();
  absl::StatusOr<v1::ContextInfo> created =
      (*cluster)->NewClient(options)->CreateContext("lost", in.k.view(),
                                                    in.v.view());
  ASSERT_TRUE(killed);
  EXPECT_EQ(created.status().code(), absl::StatusCode::kUnavailable)
      << created.status();
  EXPECT_NE(created.status().message().find("failed while storing context"),
            std::string::npos)
      << created.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(20))
      << "failure must not wait out a hang";

  ASSERT_TRUE(ReplaceKilledWorker(**cluster).ok());
  std::unique_ptr<Client> client = (*cluster)->NewClient();
  absl::StatusOr<std::vector<v1::ContextInfo>> listed = client->ListContexts();
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_TRUE(listed->empty());
  ASSERT_TRUE(client->CreateContext("lost", in.k.view(), in.v.view()).ok());
  absl::StatusOr<AttendResult> result =
      client->Query("lost", RequestSpec(spec), in.q.view());
  ASSERT_TRUE(result.ok()) << result.status();
  ExpectMatchesReference(spec, in, *result);
}

TEST(RowStreamFaults, WorkerKilledWhileOutputStreamsEndsTheRequestInTime) {
  absl::StatusOr<std::unique_ptr<TestCluster>> cluster = StartFaultCluster();
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  // 33 MB of fp32 output, 16 per worker, for little compute: worker 1 is
  // killed when the first output reaches the client, most likely while its
  // own output is still on its four streams.
  const AttentionSpec spec = SelfAttentionSpec(2000, 32, 4, 128, false);
  const RandomInputs in = MakeRandomInputs(spec, 9);
  std::atomic<bool> killed{false};
  ClientOptions options;
  options.chunk_bytes = 64 << 10;
  options.download_streams = 3;
  options.progress = [&](const Progress& progress) {
    if (progress.phase == Progress::Phase::kDownload &&
        progress.bytes_done > 0 && !killed.exchange(true)) {
      (*cluster)->KillWorker(1);
    }
  };
  const absl::Time start = absl::Now();
  absl::StatusOr<AttendResult> result = (*cluster)->NewClient(options)->Attend(
      RequestSpec(spec), in.q.view(), in.k.view(), in.v.view());
  ASSERT_TRUE(killed);
  EXPECT_LT(absl::Now() - start, absl::Seconds(20))
      << "failure must not wait out a hang";
  if (result.ok()) {
    // Worker 1 had sent all its rows before it died: the output is whole.
    ExpectMatchesReference(spec, in, *result);
  } else {
    EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable)
        << result.status();
  }

  // The cluster heals for the next request.
  ASSERT_TRUE(ReplaceKilledWorker(**cluster).ok());
  const AttentionSpec next = SelfAttentionSpec(1031, 4, 2, 64, true);
  const RandomInputs again = MakeRandomInputs(next, 10);
  absl::StatusOr<AttendResult> healed = (*cluster)->NewClient()->Attend(
      RequestSpec(next), again.q.view(), again.k.view(), again.v.view());
  ASSERT_TRUE(healed.ok()) << healed.status();
  ExpectMatchesReference(next, again, *healed);
}

TEST(RowStreamFlags, OutOfRangeValuesStopTheCoordinatorWithExit2) {
  const std::string binary = absl::StrCat(
      std::getenv("TEST_SRCDIR"), "/ringattn/server/", "ringattn-coordinator");
  for (const char* flag : {"--worker_row_streams=0", "--worker_row_streams=17",
                           "--row_streams_min_bytes=-1"}) {
    absl::StatusOr<ChildProcess> coordinator = ChildProcess::Spawn(
        binary, {"--world_size=1", "--port=0", "--http_port=0", flag});
    ASSERT_TRUE(coordinator.ok()) << coordinator.status();
    const std::optional<ExitStatus> exit =
        coordinator->WaitUntil(absl::Now() + absl::Seconds(30));
    ASSERT_TRUE(exit.has_value()) << flag << ": the coordinator kept running";
    EXPECT_EQ(exit->code, 2) << flag << ": " << exit->ToString();
  }
}

}  // namespace
}  // namespace ringattn
