// WorkerService through real gRPC channels: bad streams get precise statuses
// (wrong byte counts, duplicate rows, rows of another rank, missing rows,
// limits), a share sent as one message (the header carrying its rows and
// 'run') computes what separate messages do, two services computing one
// request together over Gloo return what the float64 reference says, in the
// wire dtype they were given, and requests that carry one communicator key
// ring over one kept communicator until a failed run retires it; rows dealt
// over AttachRows streams compute what one stream's do; context pieces over
// AttachRows streams.

#include "worker/worker_service.h"

#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/notification.h"
#include "core/dtype.h"
#include "core/ring_plan.h"
#include "core/shard_layout.h"
#include "gloo/rendezvous/hash_store.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "kernels/cpu/reference_attention.h"
#include "proto/spec_conversion.h"
#include "worker/gloo_communicator.h"

namespace ringattn {
namespace {

// One WorkerService behind a gRPC server on 127.0.0.1, with its own Gloo
// device, meeting other workers in `store`.
class TestWorker {
 public:
  TestWorker(gloo::rendezvous::Store& store,
             const WorkerServiceOptions& options) {
    absl::StatusOr<std::shared_ptr<gloo::transport::Device>> device =
        CreateGlooTcpDevice("127.0.0.1");
    EXPECT_TRUE(device.ok()) << device.status();
    connector_ = std::make_unique<GlooConnector>(store, *device);
    service_ = std::make_unique<WorkerService>(*connector_, options);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    stub_ = v1::Worker::NewStub(
        grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                            grpc::InsecureChannelCredentials()));
  }
  ~TestWorker() { server_->Shutdown(); }

  v1::Worker::Stub& stub() { return *stub_; }
  const WorkerService& service() const { return *service_; }

 private:
  std::unique_ptr<GlooConnector> connector_;
  std::unique_ptr<WorkerService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::Worker::Stub> stub_;
};

// `count` workers with `options` that meet through `store`.
std::vector<std::unique_ptr<TestWorker>> Workers(
    gloo::rendezvous::Store& store, int count,
    const WorkerServiceOptions& options = WorkerServiceOptions()) {
  std::vector<std::unique_ptr<TestWorker>> workers;
  for (int r = 0; r < count; ++r) {
    workers.push_back(std::make_unique<TestWorker>(store, options));
  }
  return workers;
}

struct ExecuteResult {
  grpc::Status status;
  std::vector<v1::ExecuteResponse> responses;
};

// Half-closes an Execute stream, reads its responses and its status.
ExecuteResult Finish(
    grpc::ClientReaderWriter<v1::ExecuteRequest, v1::ExecuteResponse>& stream) {
  stream.WritesDone();
  ExecuteResult result;
  v1::ExecuteResponse response;
  while (stream.Read(&response)) result.responses.push_back(response);
  result.status = stream.Finish();
  return result;
}

ExecuteResult Execute(v1::Worker::Stub& stub,
                      const std::vector<v1::ExecuteRequest>& requests,
                      absl::Duration deadline = absl::Seconds(30)) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  auto stream = stub.Execute(&context);
  for (const v1::ExecuteRequest& request : requests) {
    if (!stream->Write(request)) break;
  }
  return Finish(*stream);
}

AttentionSpec Spec(int64_t n, bool causal) {
  AttentionSpec spec;
  spec.batch = 2;
  spec.q_len = spec.kv_len = n;
  spec.q_heads = 4;
  spec.kv_heads = 2;
  spec.head_dim = 16;
  spec.causal = causal;
  return spec;
}

v1::ExecuteRequest Header(const AttentionSpec& spec, DType dtype, int rank,
                          int world_size, const std::string& prefix,
                          double timeout_seconds = 20) {
  v1::ExecuteRequest request;
  v1::ExecuteHeader* header = request.mutable_header();
  header->set_request_id("test-" + prefix);
  *header->mutable_spec() = SpecToProto(spec);
  header->mutable_spec()->set_wire_dtype(DTypeToProto(dtype));
  header->set_rank(rank);
  header->set_world_size(world_size);
  header->set_rendezvous_prefix(prefix);
  header->set_timeout_seconds(timeout_seconds);
  return request;
}

v1::ExecuteRequest RunMessage() {
  v1::ExecuteRequest request;
  request.set_run(true);
  return request;
}

// Rows [first, first + count) of `tensor` for batch `batch`, all zeros.
v1::ExecuteRequest ZeroRows(v1::TensorName tensor, int64_t batch, int64_t first,
                            int64_t count, int64_t row_bytes) {
  v1::ExecuteRequest request;
  v1::ShardRows* rows = request.mutable_rows();
  rows->set_tensor(tensor);
  rows->set_batch(batch);
  rows->set_first_position(first);
  rows->set_count(count);
  rows->set_data(std::string(static_cast<size_t>(count * row_bytes), '\0'));
  return request;
}

// The messages of a stream (a header, rows, then perhaps 'run') as the one
// message a small request sends: the header carrying the rest.
v1::ExecuteRequest Whole(const std::vector<v1::ExecuteRequest>& requests) {
  v1::ExecuteRequest whole = requests.front();
  for (size_t i = 1; i < requests.size(); ++i) {
    if (requests[i].has_rows()) {
      *whole.mutable_header()->add_rows() = requests[i].rows();
    } else {
      whole.mutable_header()->set_run(requests[i].run());
    }
  }
  return whole;
}

class WorkerServiceErrors : public ::testing::Test {
 protected:
  WorkerServiceErrors() : worker_(store_, WorkerServiceOptions()) {}

  // Every row of a one-rank request (N = 10), fp32 zeros.
  std::vector<v1::ExecuteRequest> AllRows() {
    std::vector<v1::ExecuteRequest> requests = {
        Header(spec_, DType::kFloat32, 0, 1, "errors")};
    for (int64_t b = 0; b < 2; ++b) {
      requests.push_back(ZeroRows(v1::Q, b, 0, 10, 4 * 16 * 4));
      requests.push_back(ZeroRows(v1::K, b, 0, 10, 2 * 16 * 4));
      requests.push_back(ZeroRows(v1::V, b, 0, 10, 2 * 16 * 4));
    }
    return requests;
  }

  void ExpectInvalid(const std::vector<v1::ExecuteRequest>& requests,
                     const std::string& fragment) {
    const ExecuteResult result = Execute(worker_.stub(), requests);
    EXPECT_EQ(result.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << result.status.error_message();
    EXPECT_NE(result.status.error_message().find(fragment), std::string::npos)
        << result.status.error_message();
  }

  gloo::rendezvous::HashStore store_;
  TestWorker worker_;
  const AttentionSpec spec_ = Spec(10, false);
};

TEST_F(WorkerServiceErrors, CompleteOneRankRequestSucceeds) {
  std::vector<v1::ExecuteRequest> requests = AllRows();
  requests.push_back(RunMessage());
  const ExecuteResult result = Execute(worker_.stub(), requests);
  ASSERT_TRUE(result.status.ok()) << result.status.error_message();
  ASSERT_FALSE(result.responses.empty());
  EXPECT_TRUE(result.responses.back().has_done());
}

TEST_F(WorkerServiceErrors, LastOutputRowsTravelWithTheDone) {
  std::vector<v1::ExecuteRequest> requests = AllRows();
  requests.push_back(RunMessage());
  const ExecuteResult result = Execute(worker_.stub(), requests);
  ASSERT_TRUE(result.status.ok()) << result.status.error_message();
  // Each batch's 10 rows fit one message; the second one ends the stream.
  ASSERT_EQ(result.responses.size(), 2u);
  EXPECT_TRUE(result.responses[0].has_output());
  EXPECT_FALSE(result.responses[0].has_done());
  EXPECT_EQ(result.responses[0].output().batch(), 0);
  EXPECT_TRUE(result.responses[1].has_done());
  ASSERT_TRUE(result.responses[1].has_output());
  EXPECT_EQ(result.responses[1].output().batch(), 1);
  EXPECT_EQ(result.responses[1].output().count(), 10);
}

TEST_F(WorkerServiceErrors, WholeRequestInOneMessageSucceeds) {
  std::vector<v1::ExecuteRequest> requests = AllRows();
  requests.push_back(RunMessage());
  const ExecuteResult result = Execute(worker_.stub(), {Whole(requests)});
  ASSERT_TRUE(result.status.ok()) << result.status.error_message();
  int64_t rows = 0;
  for (const v1::ExecuteResponse& response : result.responses) {
    rows += response.output().count();
  }
  EXPECT_EQ(rows, 20);
  EXPECT_TRUE(result.responses.back().has_done());
}

TEST_F(WorkerServiceErrors, WholeRequestMissingRowsFailsOnRun) {
  std::vector<v1::ExecuteRequest> requests = AllRows();
  requests.erase(requests.begin() + 5);  // K of batch 1
  requests.push_back(RunMessage());
  ExpectInvalid({Whole(requests)}, "missing rows: 10 rows");
}

TEST_F(WorkerServiceErrors, WrongByteCount) {
  std::vector<v1::ExecuteRequest> requests = AllRows();
  requests[1].mutable_rows()->mutable_data()->resize(10);
  ExpectInvalid(requests, "holds 10 bytes, but 10 rows of 4 x 16 fp32");
}

TEST_F(WorkerServiceErrors, DuplicateRows) {
  std::vector<v1::ExecuteRequest> requests = AllRows();
  requests.push_back(ZeroRows(v1::K, 1, 3, 1, 2 * 16 * 4));
  ExpectInvalid(requests, "duplicate row: K batch 1 position 3");
}

TEST_F(WorkerServiceErrors, RowOutsideTheSequence) {
  std::vector<v1::ExecuteRequest> requests = AllRows();
  v1::ExecuteRequest listed = ZeroRows(v1::V, 0, 0, 1, 2 * 16 * 4);
  listed.mutable_rows()->set_count(0);
  listed.mutable_rows()->add_positions(12);
  requests.insert(requests.begin() + 1, listed);
  ExpectInvalid(requests, "position 12 is outside [0, 10)");
}

TEST_F(WorkerServiceErrors, RowOfAnotherRank) {
  // Rank 0 of 2 holds positions [0, 5) of a contiguous layout.
  ExpectInvalid({Header(spec_, DType::kFloat32, 0, 2, "other-rank"),
                 ZeroRows(v1::Q, 0, 4, 2, 4 * 16 * 4)},
                "position 5 belongs to rank 1, not to this worker (rank 0)");
}

TEST_F(WorkerServiceErrors, MissingRowsOnRun) {
  std::vector<v1::ExecuteRequest> requests = AllRows();
  requests.erase(requests.begin() + 5);  // K of batch 1
  requests.push_back(RunMessage());
  ExpectInvalid(requests, "missing rows: 10 rows");
}

TEST_F(WorkerServiceErrors, RowsBeforeHeaderAndRunWithoutIt) {
  ExpectInvalid({ZeroRows(v1::Q, 0, 0, 1, 4 * 16 * 4)}, "before the header");
  ExpectInvalid({RunMessage()}, "before the header");
  ExpectInvalid({}, "the stream ended before 'run'");
}

TEST_F(WorkerServiceErrors, BadHeader) {
  v1::ExecuteRequest bad_rank = Header(spec_, DType::kFloat32, 2, 2, "x");
  ExpectInvalid({bad_rank}, "rank 2 is not a rank of world size 2");
  v1::ExecuteRequest no_dtype = Header(spec_, DType::kFloat32, 0, 1, "x");
  no_dtype.mutable_header()->mutable_spec()->set_wire_dtype(
      v1::DTYPE_UNSPECIFIED);
  ExpectInvalid({no_dtype}, "wire_dtype");
  v1::ExecuteRequest bad_spec = Header(spec_, DType::kFloat32, 0, 1, "x");
  bad_spec.mutable_header()->mutable_spec()->set_kv_heads(3);
  ExpectInvalid({bad_spec}, "kv_heads");
}

// The header of positions `piece` of context `name` (fp32, 2 heads of 16).
v1::StoreContextRequest PieceHeader(const std::string& name, bool create,
                                    const Range& piece) {
  v1::StoreContextRequest request;
  v1::StoreContextHeader* h = request.mutable_header();
  h->set_name(name);
  h->set_create(create);
  h->set_batch(1);
  h->set_kv_heads(2);
  h->set_head_dim(16);
  h->set_wire_dtype(v1::FP32);
  h->set_first_position(piece.begin);
  h->set_count(piece.size());
  return request;
}

// Stores positions `piece` of context `name` (fp32 zeros, 2 heads of 16):
// the header, then K and V rows, or with `whole` the header carrying the
// rows of `tensors`.
grpc::Status StoreZeros(v1::Worker::Stub& stub, const std::string& name,
                        bool create, const Range& piece, bool whole = false,
                        const std::vector<v1::TensorName>& tensors = {v1::K,
                                                                      v1::V}) {
  grpc::ClientContext context;
  v1::StoreContextResponse response;
  auto stream = stub.StoreContext(&context, &response);
  v1::StoreContextRequest header = PieceHeader(name, create, piece);
  v1::StoreContextHeader* h = header.mutable_header();
  std::vector<v1::ShardRows> rows;
  for (v1::TensorName tensor : tensors) {
    rows.push_back(
        ZeroRows(tensor, 0, piece.begin, piece.size(), 2 * 16 * 4).rows());
  }
  if (whole) {
    for (const v1::ShardRows& carried : rows) *h->add_rows() = carried;
    stream->WriteLast(header, grpc::WriteOptions());
    return stream->Finish();
  }
  stream->Write(header);
  for (const v1::ShardRows& own : rows) {
    v1::StoreContextRequest request;
    *request.mutable_rows() = own;
    stream->Write(request);
  }
  stream->WritesDone();
  return stream->Finish();
}

// A one-rank query of 2 rows against context `name` as positions [0, 10).
std::vector<v1::ExecuteRequest> QueryOfTenPositions(const std::string& name,
                                                    double timeout_seconds) {
  AttentionSpec spec = Spec(10, false);
  spec.batch = 1;
  spec.q_len = 2;
  std::vector<v1::ExecuteRequest> requests = {
      Header(spec, DType::kFloat32, 0, 1, name, timeout_seconds)};
  v1::ExecuteHeader* header = requests[0].mutable_header();
  header->set_context(name);
  v1::KvChunks* layout = header->add_kv_layout();
  layout->add_begin(0);
  layout->add_end(10);
  requests.push_back(ZeroRows(v1::Q, 0, 0, 2, 4 * 16 * 4));
  requests.push_back(RunMessage());
  return requests;
}

// The rows a decode step appends travel on their own stream, and 'run' may
// come first: the query waits for them (up to the ring timeout), and fails
// with FAILED_PRECONDITION if they never come.
TEST(WorkerServiceContexts, QueryWaitsForRowsStillBeingStored) {
  gloo::rendezvous::HashStore store;
  TestWorker worker(store, WorkerServiceOptions());
  ASSERT_TRUE(StoreZeros(worker.stub(), "c", true, {0, 8}).ok());

  const absl::Time start = absl::Now();
  const ExecuteResult never =
      Execute(worker.stub(), QueryOfTenPositions("c", 0.5));
  EXPECT_EQ(never.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
      << never.status.error_message();
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(500));

  ExecuteResult result;
  std::thread query(
      [&] { result = Execute(worker.stub(), QueryOfTenPositions("c", 20)); });
  const grpc::Status stored = StoreZeros(worker.stub(), "c", false, {8, 10});
  query.join();
  ASSERT_TRUE(stored.ok()) << stored.error_message();
  ASSERT_TRUE(result.status.ok()) << result.status.error_message();
  int64_t rows = 0;
  for (const v1::ExecuteResponse& response : result.responses) {
    if (response.has_output()) rows += response.output().count();
  }
  EXPECT_EQ(rows, 2);
}

TEST(WorkerServiceContexts, RowsCarriedByTheHeaderAreStored) {
  gloo::rendezvous::HashStore store;
  TestWorker worker(store, WorkerServiceOptions());
  const grpc::Status k_only = StoreZeros(worker.stub(), "c", true, {0, 10},
                                         /*whole=*/true, {v1::K});
  EXPECT_EQ(k_only.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << k_only.error_message();
  const grpc::Status stored =
      StoreZeros(worker.stub(), "c", true, {0, 10}, /*whole=*/true);
  ASSERT_TRUE(stored.ok()) << stored.error_message();
  // Every position is held: the query need not wait for more.
  const ExecuteResult result =
      Execute(worker.stub(), QueryOfTenPositions("c", 0.5));
  ASSERT_TRUE(result.status.ok()) << result.status.error_message();
  int64_t rows = 0;
  for (const v1::ExecuteResponse& response : result.responses) {
    rows += response.output().count();
  }
  EXPECT_EQ(rows, 2);
}

// QueryOfTenPositions as a decode step: its header also carries the rows of
// positions [8, 10) to append (zeros) and the appends undone before it.
std::vector<v1::ExecuteRequest> QueryAppendingTwoPositions(
    const std::string& name, int64_t undone_appends) {
  std::vector<v1::ExecuteRequest> requests = QueryOfTenPositions(name, 20);
  v1::StoreContextHeader* append =
      requests[0].mutable_header()->mutable_append();
  append->set_name(name);
  append->set_batch(1);
  append->set_kv_heads(2);
  append->set_head_dim(16);
  append->set_wire_dtype(v1::FP32);
  append->set_first_position(8);
  append->set_count(2);
  append->set_undone_appends(undone_appends);
  for (v1::TensorName tensor : {v1::K, v1::V}) {
    *append->add_rows() = ZeroRows(tensor, 0, 8, 2, 2 * 16 * 4).rows();
  }
  return requests;
}

int64_t OutputRows(const ExecuteResult& result) {
  int64_t rows = 0;
  for (const v1::ExecuteResponse& response : result.responses) {
    rows += response.output().count();
  }
  return rows;
}

// A decode step's header brings the new rows: the worker stores them before
// it reads the context, and reports what it then holds in the done message.
TEST(WorkerServiceContexts, QueryStoresTheRowsItsHeaderAppends) {
  gloo::rendezvous::HashStore store;
  TestWorker worker(store, WorkerServiceOptions());
  ASSERT_TRUE(StoreZeros(worker.stub(), "c", true, {0, 8}).ok());
  const ExecuteResult result =
      Execute(worker.stub(), QueryAppendingTwoPositions("c", 0));
  ASSERT_TRUE(result.status.ok()) << result.status.error_message();
  EXPECT_EQ(OutputRows(result), 2);
  // fp32 K and V of 10 positions, 2 heads of 16, in buffers grown an eighth
  // beyond them (to 11 rows) for the append.
  EXPECT_EQ(result.responses.back().done().context_bytes(),
            2 * 11 * 2 * 16 * 4);
  // The rows stay: a plain query of the 10 positions finds them.
  std::vector<v1::ExecuteRequest> plain = QueryOfTenPositions("c", 0.5);
  plain[0].mutable_header()->set_rendezvous_prefix("plain");
  const ExecuteResult later = Execute(worker.stub(), plain);
  ASSERT_TRUE(later.status.ok()) << later.status.error_message();
}

// The coordinator undoes a failed decode step's append on every worker; rows
// of that step that reach a worker only afterwards are refused, so the next
// step can append at the same positions.
TEST(WorkerServiceContexts, AppendOfAnUndoneQueryIsRefused) {
  gloo::rendezvous::HashStore store;
  TestWorker worker(store, WorkerServiceOptions());
  ASSERT_TRUE(StoreZeros(worker.stub(), "c", true, {0, 8}).ok());
  grpc::ClientContext context;
  v1::DropContextRequest undo;
  undo.set_name("c");
  undo.set_keep_length(8);
  undo.set_undone_appends(1);
  v1::DropContextResponse dropped;
  ASSERT_TRUE(worker.stub().DropContext(&context, undo, &dropped).ok());
  const ExecuteResult late =
      Execute(worker.stub(), QueryAppendingTwoPositions("c", 0));
  EXPECT_EQ(late.status.error_code(), grpc::StatusCode::ABORTED)
      << late.status.error_message();
  const ExecuteResult next =
      Execute(worker.stub(), QueryAppendingTwoPositions("c", 1));
  ASSERT_TRUE(next.status.ok()) << next.status.error_message();
  EXPECT_EQ(OutputRows(next), 2);
}

TEST(WorkerServiceContexts, AppendMustAddToTheQueriedContext) {
  gloo::rendezvous::HashStore store;
  TestWorker worker(store, WorkerServiceOptions());
  ASSERT_TRUE(StoreZeros(worker.stub(), "c", true, {0, 8}).ok());
  ASSERT_TRUE(StoreZeros(worker.stub(), "d", true, {0, 8}).ok());
  std::vector<v1::ExecuteRequest> other = QueryAppendingTwoPositions("c", 0);
  other[0].mutable_header()->mutable_append()->set_name("d");
  const ExecuteResult result = Execute(worker.stub(), other);
  EXPECT_EQ(result.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << result.status.error_message();
  std::vector<v1::ExecuteRequest> missing = QueryAppendingTwoPositions("c", 0);
  missing[0].mutable_header()->mutable_append()->mutable_rows()->RemoveLast();
  const ExecuteResult incomplete = Execute(worker.stub(), missing);
  EXPECT_EQ(incomplete.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << incomplete.status.error_message();
  // Neither stored anything: the step appends the rows now.
  const ExecuteResult result_after =
      Execute(worker.stub(), QueryAppendingTwoPositions("c", 0));
  ASSERT_TRUE(result_after.status.ok()) << result_after.status.error_message();
}

TEST(WorkerServiceLimits, TooManyConcurrentStreams) {
  gloo::rendezvous::HashStore store;
  WorkerServiceOptions options;
  options.max_concurrent_executions = 1;
  TestWorker worker(store, options);
  grpc::ClientContext first_context;
  auto first = worker.stub().Execute(&first_context);
  first->WaitForInitialMetadata();  // admitted
  const ExecuteResult second = Execute(worker.stub(), {});
  EXPECT_EQ(second.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << second.status.error_message();
  first->WritesDone();
  first->Finish();
}

TEST(WorkerServiceLimits, RequestLargerThanMemory) {
  gloo::rendezvous::HashStore store;
  WorkerServiceOptions options;
  options.memory_bytes = 1000;
  TestWorker worker(store, options);
  const ExecuteResult result = Execute(
      worker.stub(), {Header(Spec(100, false), DType::kFloat32, 0, 1, "big")});
  EXPECT_EQ(result.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(result.status.error_message().find("only 1000 of its 1000"),
            std::string::npos)
      << result.status.error_message();
}

TEST(WorkerServiceLimits, RankThatNeverJoinsEndsTheStreamInTime) {
  gloo::rendezvous::HashStore store;
  TestWorker worker(store, WorkerServiceOptions());
  const AttentionSpec spec = Spec(4, false);
  // Rank 0 of 2 holds positions [0, 2).
  std::vector<v1::ExecuteRequest> requests = {
      Header(spec, DType::kFloat32, 0, 2, "lonely", 0.5)};
  for (int64_t b = 0; b < 2; ++b) {
    requests.push_back(ZeroRows(v1::Q, b, 0, 2, 4 * 16 * 4));
    requests.push_back(ZeroRows(v1::K, b, 0, 2, 2 * 16 * 4));
    requests.push_back(ZeroRows(v1::V, b, 0, 2, 2 * 16 * 4));
  }
  requests.push_back(RunMessage());
  const absl::Time start = absl::Now();
  const ExecuteResult result = Execute(worker.stub(), requests);
  // The ring timeout ran out, not the call's deadline (it has none): the peer
  // is unavailable.
  EXPECT_EQ(result.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(result.status.error_message().find("rank 1 did not join"),
            std::string::npos)
      << result.status.error_message();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

// A two-rank ring whose transfers never complete until aborted: it reports
// when a wait starts, when it is aborted and when it is destroyed.
class HangingCommunicator final : public RingCommunicator {
 public:
  struct Events {
    absl::Notification waiting, aborted, destroyed;
  };
  explicit HangingCommunicator(Events& events) : events_(events) {}
  ~HangingCommunicator() override { events_.destroyed.Notify(); }

  int rank() const override { return 0; }
  int world_size() const override { return 2; }
  absl::Status StartSend(const void*, int64_t, int) override {
    return absl::OkStatus();
  }
  absl::Status StartReceive(void*, int64_t, int) override {
    return absl::OkStatus();
  }
  absl::Status Wait(absl::Time) override {
    events_.waiting.Notify();
    events_.aborted.WaitForNotification();
    return absl::CancelledError("aborted");
  }
  void Abort() override {
    if (!events_.aborted.HasBeenNotified()) events_.aborted.Notify();
  }

 private:
  Events& events_;
};

class HangingConnector final : public RingConnector {
 public:
  absl::StatusOr<std::unique_ptr<RingCommunicator>> Connect(
      const std::string&, int, int, absl::Duration,
      const std::atomic<bool>*) override {
    return std::make_unique<HangingCommunicator>(events);
  }
  HangingCommunicator::Events events;
};

TEST(WorkerServiceCancel, CancellingTheStreamAbortsTheRing) {
  HangingConnector connector;
  WorkerService service(connector, WorkerServiceOptions());
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  std::unique_ptr<v1::Worker::Stub> stub = v1::Worker::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                          grpc::InsecureChannelCredentials()));

  const AttentionSpec spec = Spec(4, false);
  grpc::ClientContext context;
  auto stream = stub->Execute(&context);
  ASSERT_TRUE(stream->Write(Header(spec, DType::kFloat32, 0, 2, "hang")));
  for (int64_t b = 0; b < 2; ++b) {
    ASSERT_TRUE(stream->Write(ZeroRows(v1::Q, b, 0, 2, 4 * 16 * 4)));
    ASSERT_TRUE(stream->Write(ZeroRows(v1::K, b, 0, 2, 2 * 16 * 4)));
    ASSERT_TRUE(stream->Write(ZeroRows(v1::V, b, 0, 2, 2 * 16 * 4)));
  }
  ASSERT_TRUE(stream->Write(RunMessage()));
  ASSERT_TRUE(connector.events.waiting.WaitForNotificationWithTimeout(
      absl::Seconds(10)));
  context.TryCancel();
  EXPECT_TRUE(connector.events.aborted.WaitForNotificationWithTimeout(
      absl::Seconds(10)));
  EXPECT_TRUE(connector.events.destroyed.WaitForNotificationWithTimeout(
      absl::Seconds(10)));
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::CANCELLED);
  server->Shutdown();
  EXPECT_EQ(service.active_executions(), 0);
}

// Two workers compute one request; the rows go in the wire dtype, K as
// explicit position lists in reverse order, Q and V as runs, while the
// fp32 request's pages are faulted in behind them (BackgroundPageFaults).
// Pass-KV and pass-Q take the same shards and return the same rows.
class WorkerServiceRing : public ::testing::TestWithParam<v1::Strategy> {};

TEST_P(WorkerServiceRing, TwoWorkersMatchTheReference) {
  for (DType dtype : {DType::kFloat16, DType::kFloat32}) {
    SCOPED_TRACE(DTypeName(dtype));
    AttentionSpec spec = Spec(37, true);
    constexpr int kRanks = 2;
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    // The values as the wire dtype carries them.
    auto make = [&](int64_t heads) {
      Tensor<float> t({spec.batch, spec.q_len, heads, spec.head_dim});
      for (float& x : t.values()) {
        uint16_t half = 0;
        const float value = uniform(rng);
        x = value;
        if (dtype == DType::kFloat16) {
          ConvertFromFloat(dtype, &value, &half, 1);
          ConvertToFloat(dtype, &half, &x, 1);
        }
      }
      return t;
    };
    const Tensor<float> q = make(4), k = make(2), v = make(2);
    Tensor<double> o_ref(q.shape());
    Tensor<double> lse_ref({spec.batch, spec.q_len, spec.q_heads, 1});
    ReferenceAttention(spec, q.view(), k.view(), v.view(), o_ref.view(),
                       lse_ref.view());

    gloo::rendezvous::HashStore store;
    WorkerServiceOptions options;
    if (dtype == DType::kFloat32) options.background_page_fault_bytes = 0;
    std::vector<std::unique_ptr<TestWorker>> workers =
        Workers(store, kRanks, options);
    const ShardLayout layout = QueryLayoutFor(spec, kRanks);
    const std::string prefix =
        std::string("ring-") + DTypeName(dtype) + v1::Strategy_Name(GetParam());
    std::vector<ExecuteResult> results(kRanks);
    std::vector<std::thread> threads;
    for (int r = 0; r < kRanks; ++r) {
      std::vector<v1::ExecuteRequest> requests = {
          Header(spec, dtype, r, kRanks, prefix)};
      requests[0].mutable_header()->mutable_spec()->set_strategy(GetParam());
      auto rows = [&](v1::TensorName name, const Tensor<float>& t,
                      int64_t batch, const Range& chunk, bool listed) {
        v1::ExecuteRequest request;
        v1::ShardRows* out = request.mutable_rows();
        out->set_tensor(name);
        out->set_batch(batch);
        const int64_t values = t.shape().heads * t.shape().dim;
        std::string& data = *out->mutable_data();
        data.resize(chunk.size() * values * DTypeSize(dtype));
        for (int64_t i = 0; i < chunk.size(); ++i) {
          const int64_t p = listed ? chunk.end - 1 - i : chunk.begin + i;
          if (listed) out->add_positions(p);
          ConvertFromFloat(dtype, t.view().Row(batch, p, 0),
                           &data[i * values * DTypeSize(dtype)], values);
        }
        if (!listed) {
          out->set_first_position(chunk.begin);
          out->set_count(chunk.size());
        }
        return request;
      };
      for (int64_t b = 0; b < spec.batch; ++b) {
        for (const Range& chunk : layout.Chunks(r)) {
          requests.push_back(rows(v1::Q, q, b, chunk, false));
          requests.push_back(rows(v1::K, k, b, chunk, true));
          requests.push_back(rows(v1::V, v, b, chunk, false));
        }
      }
      requests.push_back(RunMessage());
      threads.emplace_back([&, r, requests] {
        results[r] = Execute(workers[r]->stub(), requests);
      });
    }
    for (std::thread& t : threads) t.join();

    Tensor<float> o(q.shape());
    Tensor<float> lse({spec.batch, spec.q_len, spec.q_heads, 1});
    std::vector<bool> seen(spec.batch * spec.q_len, false);
    for (int r = 0; r < kRanks; ++r) {
      ASSERT_TRUE(results[r].status.ok())
          << "rank " << r << ": " << results[r].status.error_message();
      ASSERT_TRUE(results[r].responses.back().has_done());
      EXPECT_EQ(results[r].responses.back().done().ring_steps(), kRanks);
      for (const v1::ExecuteResponse& response : results[r].responses) {
        if (!response.has_output()) continue;
        const v1::ShardOutput& out = response.output();
        const int64_t row_values = spec.q_heads * spec.head_dim;
        ASSERT_EQ(out.data().size(), out.count() * row_values * 4);
        ASSERT_EQ(out.lse().size(), out.count() * spec.q_heads * 4);
        for (int64_t i = 0; i < out.count(); ++i) {
          const int64_t p = out.first_position() + i;
          seen[out.batch() * spec.q_len + p] = true;
          std::memcpy(o.view().Row(out.batch(), p, 0),
                      out.data().data() + i * row_values * 4, row_values * 4);
          std::memcpy(lse.view().Row(out.batch(), p, 0),
                      out.lse().data() + i * spec.q_heads * 4,
                      spec.q_heads * 4);
        }
      }
    }
    for (bool s : seen) ASSERT_TRUE(s) << "an output row is missing";
    for (size_t i = 0; i < o.values().size(); ++i) {
      const double want = o_ref.values()[i];
      ASSERT_NEAR(o.values()[i], want, 2e-5 * (1 + std::fabs(want))) << i;
    }
    for (size_t i = 0; i < lse.values().size(); ++i) {
      const double want = lse_ref.values()[i];
      ASSERT_NEAR(lse.values()[i], want, 2e-5 * (1 + std::fabs(want))) << i;
    }
  }
}

// Every message of rank `rank`'s share of a two-rank pass-KV request over
// `spec`, fp32 values from `seed`, ringing over the communicator of `key`.
std::vector<v1::ExecuteRequest> KeyedRingRequests(const AttentionSpec& spec,
                                                  int rank,
                                                  const std::string& prefix,
                                                  const std::string& key,
                                                  double timeout_seconds) {
  constexpr int kRanks = 2;
  std::vector<v1::ExecuteRequest> requests = {
      Header(spec, DType::kFloat32, rank, kRanks, prefix, timeout_seconds)};
  requests[0].mutable_header()->set_communicator_key(key);
  const ShardLayout layout = QueryLayoutFor(spec, kRanks);
  for (int64_t b = 0; b < spec.batch; ++b) {
    for (const Range& chunk : layout.Chunks(rank)) {
      for (v1::TensorName name : {v1::Q, v1::K, v1::V}) {
        const int64_t values =
            (name == v1::Q ? spec.q_heads : spec.kv_heads) * spec.head_dim;
        std::vector<float> data(chunk.size() * values);
        for (size_t i = 0; i < data.size(); ++i) {
          const int64_t at = (b * spec.q_len + chunk.begin) * values + i;
          data[i] = static_cast<float>((at * 7 + name * 13) % 17) / 17 - 0.5f;
        }
        v1::ExecuteRequest request;
        v1::ShardRows* rows = request.mutable_rows();
        rows->set_tensor(name);
        rows->set_batch(b);
        rows->set_first_position(chunk.begin);
        rows->set_count(chunk.size());
        rows->set_data(data.data(), data.size() * sizeof(float));
        requests.push_back(std::move(request));
      }
    }
  }
  requests.push_back(RunMessage());
  return requests;
}

// Runs one keyed request on both workers at once; with `whole`, each
// rank's share goes as one message.
std::vector<ExecuteResult> RunKeyedRing(
    std::vector<std::unique_ptr<TestWorker>>& workers,
    const AttentionSpec& spec, const std::string& prefix,
    const std::string& key, bool whole = false) {
  std::vector<ExecuteResult> results(workers.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < workers.size(); ++r) {
    threads.emplace_back([&, r] {
      std::vector<v1::ExecuteRequest> requests =
          KeyedRingRequests(spec, static_cast<int>(r), prefix, key, 20);
      if (whole) requests = {Whole(requests)};
      results[r] = Execute(workers[r]->stub(), requests);
    });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

TEST(WorkerServiceCommunicatorKey, RequestsOfOneKeyShareOneCommunicator) {
  gloo::rendezvous::HashStore store;
  std::vector<std::unique_ptr<TestWorker>> workers = Workers(store, 2);
  const AttentionSpec spec = Spec(21, true);
  const std::vector<ExecuteResult> first =
      RunKeyedRing(workers, spec, "keyed-1", "communicator/c/epoch-1/gen-1");
  const std::vector<ExecuteResult> second =
      RunKeyedRing(workers, spec, "keyed-2", "communicator/c/epoch-1/gen-1");
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(first[r].status.ok()) << first[r].status.error_message();
    ASSERT_TRUE(second[r].status.ok()) << second[r].status.error_message();
    ASSERT_EQ(first[r].responses.size(), second[r].responses.size());
    for (size_t i = 0; i < first[r].responses.size(); ++i) {
      EXPECT_EQ(first[r].responses[i].output().data(),
                second[r].responses[i].output().data())
          << "rank " << r << " message " << i;
    }
    EXPECT_EQ(workers[r]->service().cached_communicator_creations(), 1)
        << "the second request reused rank " << r << "'s communicator";
  }
}

TEST(WorkerServiceWholeMessages, OneMessagePerRankComputesTheSameRows) {
  gloo::rendezvous::HashStore store;
  std::vector<std::unique_ptr<TestWorker>> workers = Workers(store, 2);
  const AttentionSpec spec = Spec(21, true);
  const std::vector<ExecuteResult> separate =
      RunKeyedRing(workers, spec, "separate", "");
  const std::vector<ExecuteResult> whole =
      RunKeyedRing(workers, spec, "whole", "", /*whole=*/true);
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(separate[r].status.ok()) << separate[r].status.error_message();
    ASSERT_TRUE(whole[r].status.ok()) << whole[r].status.error_message();
    ASSERT_EQ(separate[r].responses.size(), whole[r].responses.size());
    for (size_t i = 0; i < whole[r].responses.size(); ++i) {
      EXPECT_GT(whole[r].responses[i].output().count(), 0);
      EXPECT_EQ(separate[r].responses[i].output().data(),
                whole[r].responses[i].output().data())
          << "rank " << r << " message " << i;
    }
  }
}

TEST(WorkerServiceCommunicatorKey, FailedRunRetiresTheKeyAndTheNextKeyWorks) {
  gloo::rendezvous::HashStore store;
  std::vector<std::unique_ptr<TestWorker>> workers = Workers(store, 2);
  const AttentionSpec spec = Spec(21, false);
  const std::string key = "communicator/c/epoch-1/gen-1";
  for (const ExecuteResult& result :
       RunKeyedRing(workers, spec, "fail-1", key)) {
    ASSERT_TRUE(result.status.ok()) << result.status.error_message();
  }
  // Rank 1 never runs: rank 0 rings over the kept communicator alone and
  // fails with UNAVAILABLE once the ring timeout runs out.
  const ExecuteResult lonely = Execute(
      workers[0]->stub(), KeyedRingRequests(spec, 0, "fail-2", key, 0.5));
  EXPECT_EQ(lonely.status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << lonely.status.error_message();
  // The coordinator names the next generation after a failure.
  for (const ExecuteResult& result :
       RunKeyedRing(workers, spec, "fail-3", "communicator/c/epoch-1/gen-2")) {
    EXPECT_TRUE(result.status.ok()) << result.status.error_message();
  }
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(workers[r]->service().cached_communicator_creations(), 2);
  }
}

// One AttachRows stream to a worker under `key`, written and read on a
// thread of its own: it may have to wait for its Execute stream's header.
// It sends `requests`, closes its side, and then reads what the worker
// answers: rows_stored, then output rows.
class AttachedStream {
 public:
  AttachedStream(v1::Worker::Stub& stub, const std::string& key,
                 std::vector<v1::ExecuteRequest> requests,
                 absl::Duration deadline = absl::Seconds(30)) {
    context_.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
    if (!key.empty()) context_.AddMetadata(kRowsKeyMetadata, key);
    stream_ = stub.AttachRows(&context_);
    thread_ = std::thread([this, requests = std::move(requests)] {
      for (const v1::ExecuteRequest& request : requests) {
        if (!stream_->Write(request)) break;
      }
      stream_->WritesDone();
      v1::ExecuteResponse response;
      if (stream_->Read(&response)) {
        EXPECT_FALSE(response.has_output() || response.has_done());
        rows_stored_ = response.rows_stored();
        stored_.Notify();
        while (stream_->Read(&response)) output_.push_back(response);
      } else {
        stored_.Notify();
      }
      status_ = stream_->Finish();
    });
  }
  ~AttachedStream() { Join(); }

  // Waits until the worker said how many rows it stored (or the stream
  // ended); that count.
  int64_t WaitStored() {
    stored_.WaitForNotification();
    return rows_stored_;
  }

  // Waits until the stream ended; its status.
  grpc::Status Join() {
    if (thread_.joinable()) thread_.join();
    return status_;
  }
  // The output rows it brought; valid after Join.
  const std::vector<v1::ExecuteResponse>& output() const { return output_; }

 private:
  grpc::ClientContext context_;
  std::unique_ptr<
      grpc::ClientReaderWriter<v1::ExecuteRequest, v1::ExecuteResponse>>
      stream_;
  absl::Notification stored_;
  int64_t rows_stored_ = -1;
  std::vector<v1::ExecuteResponse> output_;
  grpc::Status status_;
  std::thread thread_;
};

// Rank `rank`'s share of KeyedRingRequests, its rows dealt over the Execute
// stream and `attached` AttachRows streams (the first opened before the
// Execute stream), 'run' sent once those said their rows are stored. The
// responses of all streams, the Execute stream's last.
ExecuteResult ExecuteWithAttachedRows(v1::Worker::Stub& stub,
                                      std::vector<v1::ExecuteRequest> requests,
                                      const std::string& key, int attached) {
  requests.front().mutable_header()->set_rows_key(key);
  std::vector<v1::ExecuteRequest> own;
  std::vector<std::vector<v1::ExecuteRequest>> dealt(attached);
  int64_t dealt_rows = 0;
  for (size_t i = 0; i + 1 < requests.size(); ++i) {
    const int lane = static_cast<int>(i % (attached + 1));
    if (i == 0 || lane == attached) {
      own.push_back(requests[i]);
      continue;
    }
    dealt[lane].push_back(requests[i]);
    dealt_rows += requests[i].rows().count();
  }
  std::vector<std::unique_ptr<AttachedStream>> streams;
  streams.push_back(std::make_unique<AttachedStream>(stub, key, dealt[0]));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  auto stream = stub.Execute(&context);
  for (const v1::ExecuteRequest& request : own) stream->Write(request);
  for (int lane = 1; lane < attached; ++lane) {
    streams.push_back(std::make_unique<AttachedStream>(stub, key, dealt[lane]));
  }
  int64_t stored_rows = 0;
  for (auto& attached_stream : streams) {
    stored_rows += attached_stream->WaitStored();
  }
  EXPECT_EQ(stored_rows, dealt_rows);
  stream->Write(requests.back());
  ExecuteResult own_result = Finish(*stream);
  ExecuteResult result;
  for (auto& attached_stream : streams) {
    const grpc::Status status = attached_stream->Join();
    EXPECT_TRUE(status.ok()) << status.error_message();
    for (const v1::ExecuteResponse& response : attached_stream->output()) {
      result.responses.push_back(response);
    }
  }
  for (v1::ExecuteResponse& response : own_result.responses) {
    result.responses.push_back(std::move(response));
  }
  result.status = own_result.status;
  return result;
}

// Every output row of `responses` by (batch, position): its O and LSE bytes.
std::map<std::pair<int64_t, int64_t>, std::string> OutputRows(
    const std::vector<v1::ExecuteResponse>& responses) {
  std::map<std::pair<int64_t, int64_t>, std::string> rows;
  for (const v1::ExecuteResponse& response : responses) {
    if (!response.has_output()) continue;
    const v1::ShardOutput& out = response.output();
    const size_t o_bytes = out.data().size() / out.count();
    const size_t lse_bytes = out.lse().size() / out.count();
    for (int64_t i = 0; i < out.count(); ++i) {
      const auto key = std::make_pair(out.batch(), out.first_position() + i);
      EXPECT_EQ(rows.count(key), 0u) << "row sent twice";
      rows[key] = out.data().substr(i * o_bytes, o_bytes) +
                  out.lse().substr(i * lse_bytes, lse_bytes);
    }
  }
  return rows;
}

TEST(WorkerServiceAttachedRows, RowsAndOutputOverSeveralStreamsMatchOneStream) {
  gloo::rendezvous::HashStore store;
  std::vector<std::unique_ptr<TestWorker>> workers = Workers(store, 2);
  const AttentionSpec spec = Spec(23, true);
  const std::vector<ExecuteResult> plain =
      RunKeyedRing(workers, spec, "plain", "");
  std::vector<ExecuteResult> attached(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      attached[r] = ExecuteWithAttachedRows(
          workers[r]->stub(), KeyedRingRequests(spec, r, "attached", "", 20),
          "attached/" + std::to_string(r), /*attached=*/2);
    });
  }
  for (std::thread& thread : threads) thread.join();
  size_t rows = 0;
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(plain[r].status.ok()) << plain[r].status.error_message();
    ASSERT_TRUE(attached[r].status.ok()) << attached[r].status.error_message();
    ASSERT_TRUE(attached[r].responses.back().has_done());
    const auto expected = OutputRows(plain[r].responses);
    rows += expected.size();
    EXPECT_EQ(OutputRows(attached[r].responses), expected) << "rank " << r;
  }
  EXPECT_EQ(rows, static_cast<size_t>(spec.batch * spec.q_len));
}

TEST(WorkerServiceAttachedRows, StreamCarryingAHeaderIsInvalidArgument) {
  gloo::rendezvous::HashStore store;
  TestWorker worker(store, WorkerServiceOptions());
  const AttentionSpec spec = Spec(10, false);
  std::vector<v1::ExecuteRequest> requests =
      KeyedRingRequests(spec, 0, "stray", "", 20);
  requests.front().mutable_header()->set_world_size(1);
  requests.front().mutable_header()->set_rows_key("stray/0");
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  auto stream = worker.stub().Execute(&context);
  ASSERT_TRUE(stream->Write(requests.front()));
  AttachedStream stray(worker.stub(), "stray/0", {requests.front()});
  const grpc::Status status = stray.Join();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("carries rows only"), std::string::npos)
      << status.error_message();
  context.TryCancel();
  Finish(*stream);
}

// A whole request of Spec(10, false) for a world of one, zero rows, under
// `rows_key` (none if empty).
std::vector<v1::ExecuteRequest> WorldOfOneRequests(
    const std::string& prefix, const std::string& rows_key) {
  const AttentionSpec spec = Spec(10, false);
  v1::ExecuteRequest header = KeyedRingRequests(spec, 0, prefix, "", 20)[0];
  header.mutable_header()->set_world_size(1);
  header.mutable_header()->set_rows_key(rows_key);
  // A world of one holds every row: rank 0 of two held half.
  std::vector<v1::ExecuteRequest> requests = {header};
  for (int64_t b = 0; b < spec.batch; ++b) {
    requests.push_back(ZeroRows(v1::Q, b, 0, 10, 4 * 16 * 4));
    requests.push_back(ZeroRows(v1::K, b, 0, 10, 2 * 16 * 4));
    requests.push_back(ZeroRows(v1::V, b, 0, 10, 2 * 16 * 4));
  }
  requests.push_back(RunMessage());
  return requests;
}

TEST(WorkerServiceAttachedRows, StreamAfterRunIsRefused) {
  gloo::rendezvous::HashStore store;
  TestWorker worker(store, WorkerServiceOptions());
  const ExecuteResult result =
      Execute(worker.stub(), WorldOfOneRequests("late", "late/0"));
  ASSERT_TRUE(result.status.ok()) << result.status.error_message();
  AttachedStream late(worker.stub(), "late/0",
                      {ZeroRows(v1::Q, 0, 0, 1, 4 * 16 * 4)});
  const grpc::Status status = late.Join();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
      << status.error_message();
}

// An Execute stream cancelled once its attached streams stored their rows
// ends them with its error, from its own thread (OutputLanes::End): each
// ends CANCELLED, none hangs, and the worker takes the next request. Many
// rounds: ending them used to race with their deletion (a use-after-free
// seen once in 58 runs of the netns test).
TEST(WorkerServiceAttachedRows, CancelledExecuteStreamEndsItsWaitingStreams) {
  gloo::rendezvous::HashStore store;
  TestWorker worker(store, WorkerServiceOptions());
  const AttentionSpec spec = Spec(10, false);
  for (int round = 0; round < 30; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    const std::string key = absl::StrCat("cancelled/", round);
    const std::vector<v1::ExecuteRequest> requests =
        WorldOfOneRequests(absl::StrCat("cancelled-", round), key);
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    auto stream = worker.stub().Execute(&context);
    ASSERT_TRUE(stream->Write(requests.front()));
    // The rows go on attached streams, Q on one, K and V on the other; 'run'
    // never comes.
    std::vector<v1::ExecuteRequest> queries, keys;
    for (const v1::ExecuteRequest& request : requests) {
      if (!request.has_rows()) continue;
      (request.rows().tensor() == v1::Q ? queries : keys).push_back(request);
    }
    AttachedStream with_queries(worker.stub(), key, queries);
    AttachedStream with_keys(worker.stub(), key, keys);
    EXPECT_EQ(with_queries.WaitStored(), 10 * spec.batch);
    EXPECT_EQ(with_keys.WaitStored(), 2 * 10 * spec.batch);
    context.TryCancel();
    for (AttachedStream* attached : {&with_queries, &with_keys}) {
      const grpc::Status status = attached->Join();
      EXPECT_EQ(status.error_code(), grpc::StatusCode::CANCELLED)
          << status.error_message();
      EXPECT_TRUE(attached->output().empty());
    }
    EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  // Every cancelled stream gave its execution slot back.
  const ExecuteResult after =
      Execute(worker.stub(), WorldOfOneRequests("after", ""));
  EXPECT_TRUE(after.status.ok()) << after.status.error_message();
}

TEST(WorkerServiceAttachedRows, StreamWithoutKeyOrHeaderEndsWithAStatus) {
  gloo::rendezvous::HashStore store;
  TestWorker worker(store, WorkerServiceOptions());
  AttachedStream unnamed(worker.stub(), "", {});
  const grpc::Status no_key = unnamed.Join();
  EXPECT_EQ(no_key.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(no_key.error_message().find(kRowsKeyMetadata), std::string::npos)
      << no_key.error_message();
  // No Execute stream ever names this key: the stream's deadline ends it.
  AttachedStream orphan(worker.stub(), "never/0", {}, absl::Milliseconds(300));
  EXPECT_EQ(orphan.Join().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
}

// A StoreContext stream for positions `piece` of new context `name` (fp32,
// 2 heads of 16) whose header names `key`: its rows come on AttachRows
// streams.
class KeyedPieceStream {
 public:
  KeyedPieceStream(v1::Worker::Stub& stub, const std::string& name,
                   const Range& piece, const std::string& key) {
    context_.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    stream_ = stub.StoreContext(&context_, &response_);
    v1::StoreContextRequest request = PieceHeader(name, true, piece);
    request.mutable_header()->set_rows_key(key);
    EXPECT_TRUE(stream_->Write(request));
  }

  // Closes the stream's side; the piece is stored if every row is in.
  grpc::Status Finish() {
    stream_->WritesDone();
    return stream_->Finish();
  }
  // Cancels the stream instead, as the coordinator does when the upload
  // failed elsewhere.
  grpc::Status Cancel() {
    context_.TryCancel();
    return stream_->Finish();
  }
  int64_t bytes() const { return response_.bytes(); }

 private:
  grpc::ClientContext context_;
  v1::StoreContextResponse response_;
  std::unique_ptr<grpc::ClientWriter<v1::StoreContextRequest>> stream_;
};

constexpr int64_t kPieceRowBytes = 2 * 16 * 4;

// A large context piece arrives over AttachRows streams, one of them opened
// before its StoreContext header: the worker stores it once the stream
// closes, and the attached streams end OK with it; queries then read it.
TEST(WorkerServiceAttachedRows, ContextPieceRowsOverAttachedStreamsAreStored) {
  gloo::rendezvous::HashStore store;
  TestWorker worker(store, WorkerServiceOptions());
  AttachedStream early(worker.stub(), "piece/0",
                       {ZeroRows(v1::K, 0, 0, 6, kPieceRowBytes),
                        ZeroRows(v1::V, 0, 6, 4, kPieceRowBytes)});
  KeyedPieceStream piece(worker.stub(), "c", {0, 10}, "piece/0");
  AttachedStream late(worker.stub(), "piece/0",
                      {ZeroRows(v1::V, 0, 0, 6, kPieceRowBytes),
                       ZeroRows(v1::K, 0, 6, 4, kPieceRowBytes)});
  EXPECT_EQ(early.WaitStored(), 10);
  EXPECT_EQ(late.WaitStored(), 10);
  const grpc::Status stored = piece.Finish();
  ASSERT_TRUE(stored.ok()) << stored.error_message();
  EXPECT_EQ(piece.bytes(), 2 * 10 * kPieceRowBytes);
  EXPECT_TRUE(early.Join().ok()) << early.Join().error_message();
  EXPECT_TRUE(late.Join().ok()) << late.Join().error_message();
  EXPECT_TRUE(early.output().empty());
  const ExecuteResult query =
      Execute(worker.stub(), QueryOfTenPositions("c", 20));
  EXPECT_TRUE(query.status.ok()) << query.status.error_message();
}

// Rows the attached streams never brought fail the piece: nothing is stored,
// and every stream of the piece ends with the error that names them.
TEST(WorkerServiceAttachedRows, ContextPieceMissingAttachedRowsStoresNothing) {
  gloo::rendezvous::HashStore store;
  TestWorker worker(store, WorkerServiceOptions());
  KeyedPieceStream piece(worker.stub(), "c", {0, 10}, "short/0");
  AttachedStream attached(worker.stub(), "short/0",
                          {ZeroRows(v1::K, 0, 0, 10, kPieceRowBytes),
                           ZeroRows(v1::V, 0, 0, 9, kPieceRowBytes)});
  EXPECT_EQ(attached.WaitStored(), 19);
  const grpc::Status refused = piece.Finish();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(refused.error_message().find("position 9"), std::string::npos)
      << refused.error_message();
  const grpc::Status ended = attached.Join();
  EXPECT_EQ(ended.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(ended.error_message(), refused.error_message());
  const ExecuteResult query =
      Execute(worker.stub(), QueryOfTenPositions("c", 0.5));
  EXPECT_FALSE(query.status.ok());
}

// A piece whose stream is cancelled with all its rows in is not stored, and
// its attached streams end CANCELLED (many rounds: a cancel also fails the
// stream's read, which gRPC may report before OnCancel).
TEST(WorkerServiceAttachedRows, CancelledContextPieceStoresNothing) {
  gloo::rendezvous::HashStore store;
  TestWorker worker(store, WorkerServiceOptions());
  for (int round = 0; round < 30; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    const std::string name = absl::StrCat("c", round);
    const std::string key = absl::StrCat("cancelled-piece/", round);
    KeyedPieceStream piece(worker.stub(), name, {0, 10}, key);
    AttachedStream attached(worker.stub(), key,
                            {ZeroRows(v1::K, 0, 0, 10, kPieceRowBytes),
                             ZeroRows(v1::V, 0, 0, 10, kPieceRowBytes)});
    EXPECT_EQ(attached.WaitStored(), 20);
    EXPECT_EQ(piece.Cancel().error_code(), grpc::StatusCode::CANCELLED);
    const grpc::Status ended = attached.Join();
    EXPECT_EQ(ended.error_code(), grpc::StatusCode::CANCELLED)
        << ended.error_message();
    const ExecuteResult query =
        Execute(worker.stub(), QueryOfTenPositions(name, 0.5));
    EXPECT_EQ(query.status.error_code(), grpc::StatusCode::NOT_FOUND)
        << query.status.error_message();
  }
}

// A piece whose header is refused: the attached streams waiting for its key
// are refused at once too, not left to wait out their deadline.
TEST(WorkerServiceAttachedRows, AttachedStreamsOfARefusedPieceAreRefused) {
  gloo::rendezvous::HashStore store;
  TestWorker worker(store, WorkerServiceOptions());
  AttachedStream waiting(worker.stub(), "refused/0",
                         {ZeroRows(v1::K, 0, 0, 10, kPieceRowBytes)});
  // A piece without a name.
  KeyedPieceStream piece(worker.stub(), "", {0, 10}, "refused/0");
  EXPECT_EQ(piece.Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  const grpc::Status refused = waiting.Join();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
      << refused.error_message();
}

// A context holds no queries: Q rows on an attached stream of a piece are
// refused by name, and duplicates across streams are refused too.
TEST(WorkerServiceAttachedRows, ContextPieceRefusesQueryAndDuplicateRows) {
  gloo::rendezvous::HashStore store;
  TestWorker worker(store, WorkerServiceOptions());
  KeyedPieceStream piece(worker.stub(), "c", {0, 10}, "odd/0");
  AttachedStream query_rows(worker.stub(), "odd/0",
                            {ZeroRows(v1::Q, 0, 0, 2, kPieceRowBytes)});
  const grpc::Status no_q = query_rows.Join();
  EXPECT_EQ(no_q.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(no_q.error_message().find("takes no Q rows"), std::string::npos)
      << no_q.error_message();
  AttachedStream first(worker.stub(), "odd/0",
                       {ZeroRows(v1::K, 0, 0, 10, kPieceRowBytes)});
  EXPECT_EQ(first.WaitStored(), 10);
  AttachedStream again(worker.stub(), "odd/0",
                       {ZeroRows(v1::K, 0, 3, 1, kPieceRowBytes)});
  const grpc::Status twice = again.Join();
  EXPECT_EQ(twice.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(twice.error_message().find("arrived twice"), std::string::npos)
      << twice.error_message();
  EXPECT_EQ(piece.Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

INSTANTIATE_TEST_SUITE_P(
    Strategies, WorkerServiceRing, ::testing::Values(v1::PASS_KV, v1::PASS_Q),
    [](const ::testing::TestParamInfo<v1::Strategy>& info) {
      return v1::Strategy_Name(info.param);
    });

}  // namespace
}  // namespace ringattn
