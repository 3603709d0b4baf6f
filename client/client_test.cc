#include "client/client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "client/chunking.h"
#include "client/fake_attention.h"
#include "core/dtype.h"
#include "grpc/grpc.h"
#include "gtest/gtest.h"

namespace ringattn {
namespace {

// gRPC shuts itself down when its last object goes, and that shutdown may
// wait up to 10 s for a polling thread; each test's server would be the last.
// Kept initialised for the whole binary instead.
const bool kGrpcKeptInitialised = [] {
  grpc_init();
  return true;
}();

Tensor<float> Random(Shape shape, uint32_t seed) {
  Tensor<float> tensor(shape);
  uint32_t state = seed;
  for (float& value : tensor.values()) {
    state = state * 1664525u + 1013904223u;
    value = static_cast<float>(state >> 8) / (1 << 24) * 8.0f - 4.0f;
  }
  return tensor;
}

// The values `tensor` holds once it has travelled as `dtype`.
std::vector<float> Rounded(const Tensor<float>& tensor, DType dtype) {
  std::vector<float> values;
  for (float value : tensor.values()) {
    values.push_back(dtype == DType::kFloat16 ? HalfToFloat(FloatToHalf(value))
                     : dtype == DType::kBFloat16
                         ? BFloat16ToFloat(FloatToBFloat16(value))
                         : value);
  }
  return values;
}

v1::AttentionSpec SpecFor(const Shape& q, const Shape& kv) {
  v1::AttentionSpec spec;
  spec.set_batch(q.batch);
  spec.set_q_len(q.seq);
  spec.set_kv_len(kv.seq);
  spec.set_q_heads(q.heads);
  spec.set_kv_heads(kv.heads);
  spec.set_head_dim(q.dim);
  return spec;
}

class ClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port_);
    builder.RegisterService(&service_);
    builder.SetMaxReceiveMessageSize(16 << 20);  // as the real coordinator
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
  }

  void TearDown() override {
    if (!service_.released()) service_.Release();
    server_->Shutdown();
  }

  std::unique_ptr<Client> Connect(ClientOptions options = {}) {
    absl::StatusOr<std::unique_ptr<Client>> client =
        Client::Connect(target(), std::move(options));
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  std::string target() const { return "127.0.0.1:" + std::to_string(port_); }

  FakeAttention service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  const Shape q_shape_{2, 7, 4, 8};  // 128 fp32 bytes a row
  const Shape kv_shape_{2, 5, 2, 8};
  const Tensor<float> q_ = Random(q_shape_, 1);
  const Tensor<float> k_ = Random(kv_shape_, 2);
  const Tensor<float> v_ = Random(kv_shape_, 3);
};

TEST_F(ClientTest, AttendUploadsChunksAndReassemblesTheOutput) {
  ClientOptions options;
  options.chunk_bytes = 300;  // two rows of Q, four of K/V
  std::unique_ptr<Client> client = Connect(options);
  v1::AttentionSpec spec = SpecFor(q_shape_, kv_shape_);
  spec.set_return_lse(true);
  absl::StatusOr<AttendResult> result =
      client->Attend(spec, q_.view(), k_.view(), v_.view());
  ASSERT_TRUE(result.ok()) << result.status();

  EXPECT_EQ(result->output.shape(), q_shape_);
  EXPECT_EQ(result->output.values(), q_.values());
  ASSERT_EQ(result->lse.size(), 2u * 4 * 7);
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t h = 0; h < 4; ++h) {
      for (int64_t n = 0; n < 7; ++n) {
        EXPECT_EQ(result->lse[(b * 4 + h) * 7 + n], b * 10000 + h * 100 + n);
      }
    }
  }
  EXPECT_EQ(result->summary.request_id(), "fake-1");

  // Q first, then K, then V; whole rows; every row once; within the budget.
  const std::vector<v1::TensorName> order = service_.chunk_order();
  EXPECT_TRUE(std::is_sorted(order.begin(), order.end()));
  for (v1::TensorName name : {v1::Q, v1::K, v1::V}) {
    const ReceivedTensor received = service_.received(name);
    const int64_t rows_per_chunk = name == v1::Q ? 2 : 4;
    for (const v1::TensorChunk& chunk : received.chunks) {
      EXPECT_LE(chunk.token_count(), rows_per_chunk);
    }
    for (int count : received.row_count) EXPECT_EQ(count, 1);
  }
  EXPECT_EQ(service_.received(v1::Q).chunks.size(), 2u * 4);
  EXPECT_EQ(service_.received(v1::K).tensor.values(), k_.values());
  EXPECT_EQ(service_.received(v1::V).tensor.values(), v_.values());
}

TEST_F(ClientTest, AttendSendsTheWireDtype) {
  std::unique_ptr<Client> client = Connect();
  for (const auto& [wire, dtype] :
       {std::pair<v1::DType, DType>{v1::FP16, DType::kFloat16},
        {v1::BF16, DType::kBFloat16},
        {v1::DTYPE_UNSPECIFIED, DType::kFloat32}}) {
    v1::AttentionSpec spec = SpecFor(q_shape_, kv_shape_);
    spec.set_wire_dtype(wire);
    absl::StatusOr<AttendResult> result =
        client->Attend(spec, q_.view(), k_.view(), v_.view());
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->output.values(), Rounded(q_, dtype)) << DTypeName(dtype);
    EXPECT_TRUE(result->lse.empty());
    EXPECT_EQ(service_.received(v1::K).tensor.values(), Rounded(k_, dtype));
    EXPECT_EQ(service_.received(v1::V).tensor.values(), Rounded(v_, dtype));
  }
}

TEST_F(ClientTest, ServerErrorKeepsCodeAndMessage) {
  service_.set_behavior(FakeBehavior::kFail);
  ClientOptions options;
  options.chunk_bytes = 64 << 10;
  std::unique_ptr<Client> client = Connect(options);
  // Enough data that the server fails while the upload is still going.
  const Shape big{1, 8192, 8, 64};
  const Tensor<float> q = Random(big, 4);
  absl::StatusOr<AttendResult> result =
      client->Attend(SpecFor(big, big), q.view(), q.view(), q.view());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(result.status().message(), kFakeFailMessage);
}

TEST_F(ClientTest, DuplicateOutputRowIsInternal) {
  service_.set_behavior(FakeBehavior::kDuplicateRow);
  std::unique_ptr<Client> client = Connect();
  absl::StatusOr<AttendResult> result = client->Attend(
      SpecFor(q_shape_, kv_shape_), q_.view(), k_.view(), v_.view());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInternal);
  EXPECT_NE(result.status().message().find("row 0 of batch entry 0 twice"),
            std::string::npos)
      << result.status();
}

TEST_F(ClientTest, MissingOutputRowIsDataLoss) {
  service_.set_behavior(FakeBehavior::kMissingRow);
  std::unique_ptr<Client> client = Connect();
  absl::StatusOr<AttendResult> result = client->Attend(
      SpecFor(q_shape_, kv_shape_), q_.view(), k_.view(), v_.view());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(result.status().message().find("token 6 of batch entry 0"),
            std::string::npos)
      << result.status();
}

TEST_F(ClientTest, MissingSummaryIsDataLoss) {
  service_.set_behavior(FakeBehavior::kNoSummary);
  std::unique_ptr<Client> client = Connect();
  absl::StatusOr<AttendResult> result = client->Attend(
      SpecFor(q_shape_, kv_shape_), q_.view(), k_.view(), v_.view());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(result.status().message().find("without a summary"),
            std::string::npos);
}

// Calls that upload at most 1 MiB run on the caller's thread through gRPC's
// synchronous API, larger ones on its callback API: each reassembles the
// output and refuses the same broken responses. The parameter is the query
// rows of a [1, rows, 4, 64] fp32 Q, K and V: 8 rows upload 24 KiB, 1024
// rows 3 MiB.
class ClientBothPathsTest : public ClientTest,
                            public ::testing::WithParamInterface<int64_t> {
 protected:
  absl::StatusOr<AttendResult> Attend(FakeBehavior behavior) {
    service_.set_behavior(behavior);
    ClientOptions options;
    options.chunk_bytes = 256 << 10;
    std::unique_ptr<Client> client = Connect(options);
    return client->Attend(SpecFor(shape_, shape_), tensor_.view(),
                          tensor_.view(), tensor_.view());
  }

  const Shape shape_{1, GetParam(), 4, 64};
  const Tensor<float> tensor_ = Random(shape_, 5);
};

TEST_P(ClientBothPathsTest, ReassemblesTheEchoedOutput) {
  absl::StatusOr<AttendResult> result = Attend(FakeBehavior::kEcho);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->output.values(), tensor_.values());
  EXPECT_EQ(result->summary.request_id(), "fake-1");
}

TEST_P(ClientBothPathsTest, ServerErrorKeepsCodeAndMessage) {
  absl::StatusOr<AttendResult> result = Attend(FakeBehavior::kFail);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(result.status().message(), kFakeFailMessage);
}

TEST_P(ClientBothPathsTest, DuplicateOutputRowIsInternal) {
  EXPECT_EQ(Attend(FakeBehavior::kDuplicateRow).status().code(),
            absl::StatusCode::kInternal);
}

TEST_P(ClientBothPathsTest, MissingRowOrSummaryIsDataLoss) {
  EXPECT_EQ(Attend(FakeBehavior::kMissingRow).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(Attend(FakeBehavior::kNoSummary).status().code(),
            absl::StatusCode::kDataLoss);
}

INSTANTIATE_TEST_SUITE_P(SmallAndLarge, ClientBothPathsTest,
                         ::testing::Values(8, 1024),
                         [](const ::testing::TestParamInfo<int64_t>& info) {
                           return info.param == 8 ? std::string("OnThisThread")
                                                  : std::string("Callbacks");
                         });

TEST_F(ClientTest, ShapeMismatchFailsBeforeAnyCall) {
  std::unique_ptr<Client> client = Connect();
  v1::AttentionSpec spec = SpecFor(q_shape_, kv_shape_);
  spec.set_q_len(6);
  absl::StatusOr<AttendResult> result =
      client->Attend(spec, q_.view(), k_.view(), v_.view());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(result.status().message(),
            "Q has shape [2, 7, 4, 8] but the request says [2, 6, 4, 8]");
  spec = SpecFor(q_shape_, kv_shape_);
  spec.set_wire_dtype(static_cast<v1::DType>(9));
  EXPECT_EQ(
      client->Attend(spec, q_.view(), k_.view(), v_.view()).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(service_.calls(), 0);
}

TEST_F(ClientTest, DeadlineExpires) {
  service_.set_behavior(FakeBehavior::kHang);
  ClientOptions options;
  options.deadline = absl::Milliseconds(200);
  std::unique_ptr<Client> client = Connect(options);
  absl::StatusOr<AttendResult> result = client->Attend(
      SpecFor(q_shape_, kv_shape_), q_.view(), k_.view(), v_.view());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST_F(ClientTest, SendsTheBearerToken) {
  ClientOptions options;
  options.bearer_token = "s3cret";
  std::unique_ptr<Client> client = Connect(options);
  ASSERT_TRUE(client->GetClusterInfo().ok());
  EXPECT_EQ(service_.authorization(), "Bearer s3cret");
}

TEST_F(ClientTest, ReportsProgressOfBothPhases) {
  std::vector<Progress> reports;
  ClientOptions options;
  options.chunk_bytes = 256;
  options.progress = [&reports](const Progress& progress) {
    reports.push_back(progress);
  };
  std::unique_ptr<Client> client = Connect(options);
  v1::AttentionSpec spec = SpecFor(q_shape_, kv_shape_);
  spec.set_return_lse(true);
  ASSERT_TRUE(client->Attend(spec, q_.view(), k_.view(), v_.view()).ok());

  const int64_t upload_total =
      (q_shape_.NumElements() + 2 * kv_shape_.NumElements()) * 4;
  const int64_t download_total = (q_shape_.NumElements() + 2 * 4 * 7) * 4;
  std::map<Progress::Phase, std::vector<int64_t>> done;
  for (const Progress& report : reports) {
    EXPECT_EQ(report.bytes_total, report.phase == Progress::Phase::kUpload
                                      ? upload_total
                                      : download_total);
    done[report.phase].push_back(report.bytes_done);
  }
  for (const auto& [phase, bytes] : done) {
    EXPECT_EQ(bytes.front(), 0);
    EXPECT_TRUE(std::is_sorted(bytes.begin(), bytes.end()));
  }
  EXPECT_EQ(done[Progress::Phase::kUpload].back(), upload_total);
  EXPECT_EQ(done[Progress::Phase::kDownload].back(), download_total);
}

TEST_F(ClientTest, ContextsUploadQueryListAndDelete) {
  ClientOptions options;
  options.chunk_bytes = 200;
  std::unique_ptr<Client> client = Connect(options);
  absl::StatusOr<v1::ContextInfo> info =
      client->CreateContext("doc", k_.view(), v_.view(), v1::BF16);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->length(), 5);
  EXPECT_EQ(info->kv_heads(), 2);
  EXPECT_EQ(service_.received(v1::K).tensor.values(),
            Rounded(k_, DType::kBFloat16));
  EXPECT_EQ(service_.received(v1::V).tensor.values(),
            Rounded(v_, DType::kBFloat16));

  absl::StatusOr<std::vector<v1::ContextInfo>> contexts =
      client->ListContexts();
  ASSERT_TRUE(contexts.ok()) << contexts.status();
  ASSERT_EQ(contexts->size(), 1u);
  EXPECT_EQ((*contexts)[0].name(), "doc");

  v1::AttentionSpec spec = SpecFor(q_shape_, kv_shape_);
  spec.set_kv_len(0);
  absl::StatusOr<AttendResult> result = client->Query("doc", spec, q_.view());
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->output.values(), q_.values());

  EXPECT_TRUE(client->DeleteContext("doc").ok());
  const absl::Status missing = client->DeleteContext("doc");
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(missing.message(), "no context named 'doc'");
}

TEST_F(ClientTest, QueryHeaderCarriesItsFirst128KiBOfRowsAndTheRestFollow) {
  std::unique_ptr<Client> client = Connect();
  const Shape kv{1, 5, 8, 128};
  const Tensor<float> k = Random(kv, 4);
  ASSERT_TRUE(client->CreateContext("doc", k.view(), k.view(), v1::BF16).ok());
  // Rows of 32 heads x 128 in bf16 are 8 KiB: 16 fit the header whole; 64
  // (512 KiB) go in chunks of 128 KiB, the first inside the header.
  for (const auto& [rows, carried, chunks] :
       {std::tuple<int64_t, int, size_t>{16, 1, 1}, {64, 1, 4}}) {
    const Shape q{1, rows, 32, 128};
    const Tensor<float> values = Random(q, 5);
    v1::AttentionSpec spec = SpecFor(q, kv);
    spec.set_kv_len(0);
    spec.set_wire_dtype(v1::BF16);
    absl::StatusOr<AttendResult> result =
        client->Query("doc", spec, values.view());
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->output.values(), Rounded(values, DType::kBFloat16))
        << rows << " rows";
    EXPECT_EQ(service_.header_chunks(), carried) << rows << " rows";
    EXPECT_EQ(service_.received(v1::Q).chunks.size(), chunks)
        << rows << " rows";
  }
}

TEST_F(ClientTest, QueryStreamingSendsItsSourceAndHandsOnEachOutputChunk) {
  std::unique_ptr<Client> client = Connect();
  ASSERT_TRUE(
      client->CreateContext("doc", k_.view(), v_.view(), v1::BF16).ok());
  v1::AttentionSpec spec = SpecFor(q_shape_, kv_shape_);
  spec.set_kv_len(0);
  spec.set_wire_dtype(v1::BF16);
  ChunkStream source(DType::kBFloat16, 200);
  source.Add(v1::Q, q_.view());
  // The fake echoes Q as O, three rows a chunk, in fp32.
  std::vector<float> output(q_.values().size(), -1.0f);
  int chunks = 0;
  absl::StatusOr<v1::Summary> summary = client->QueryStreaming(
      "doc", spec, source, [&](const v1::OutputChunk& chunk) {
        ++chunks;
        const int64_t row_values = q_shape_.heads * q_shape_.dim;
        std::memcpy(
            &output[(chunk.batch() * q_shape_.seq + chunk.token_offset()) *
                    row_values],
            chunk.data().data(), chunk.data().size());
        return absl::OkStatus();
      });
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->request_id(), "fake-1");
  EXPECT_EQ(chunks, 6);  // 3 + 3 + 1 rows of each of 2 batch entries
  EXPECT_EQ(service_.received(v1::Q).tensor.values(),
            Rounded(q_, DType::kBFloat16));
  EXPECT_EQ(output, Rounded(q_, DType::kBFloat16));

  // The consumer's error ends the call with it.
  ChunkStream again(DType::kBFloat16, 200);
  again.Add(v1::Q, q_.view());
  const absl::StatusOr<v1::Summary> refused = client->QueryStreaming(
      "doc", spec, again,
      [](const v1::OutputChunk&) { return absl::DataLossError("disk full"); });
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(refused.status().message().find("disk full"), std::string::npos)
      << refused.status();
}

// A call that ends with UNAVAILABLE before any output (the coordinator's
// cluster not ready) is sent again, up to max_attempts in all.
TEST_F(ClientTest, UnavailableCallIsTriedAgainUpToMaxAttempts) {
  ClientOptions options;
  options.max_attempts = 3;
  std::unique_ptr<Client> client = Connect(options);
  service_.FailNext(2);
  const v1::AttentionSpec spec = SpecFor(q_shape_, kv_shape_);
  absl::StatusOr<AttendResult> result =
      client->Attend(spec, q_.view(), k_.view(), v_.view());
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->output.values(), q_.values());
  EXPECT_EQ(service_.calls(), 3);

  service_.FailNext(3);
  absl::StatusOr<AttendResult> refused =
      client->Attend(spec, q_.view(), k_.view(), v_.view());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(refused.status().message(), kFakeNotReadyMessage);
  EXPECT_EQ(service_.calls(), 6);
}

// New rows go again only on the coordinator's word that it took them back: a
// connection lost after the coordinator finished looks the same to the
// client.
TEST_F(ClientTest, QueryWithNewRowsGoesAgainOnlyWhenMarkedUnchanged) {
  ClientOptions options;
  options.max_attempts = 2;
  std::unique_ptr<Client> client = Connect(options);
  ASSERT_TRUE(client->CreateContext("doc", k_.view(), v_.view()).ok());
  v1::AttentionSpec spec = SpecFor(q_shape_, kv_shape_);
  spec.set_kv_len(0);

  int before = service_.calls();
  service_.FailNext(1, /*unchanged=*/false);
  absl::StatusOr<AttendResult> unmarked =
      client->Query("doc", spec, q_.view(), k_.view(), v_.view());
  EXPECT_EQ(unmarked.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(service_.calls() - before, 1);

  before = service_.calls();
  service_.FailNext(1, /*unchanged=*/true);
  absl::StatusOr<AttendResult> marked =
      client->Query("doc", spec, q_.view(), k_.view(), v_.view());
  ASSERT_TRUE(marked.ok()) << marked.status();
  EXPECT_EQ(marked->output.values(), q_.values());
  EXPECT_EQ(service_.calls() - before, 2);

  before = service_.calls();
  service_.FailNext(1, /*unchanged=*/false);
  EXPECT_TRUE(client->Query("doc", spec, q_.view()).ok())
      << "a query without new rows goes again on any UNAVAILABLE";
  EXPECT_EQ(service_.calls() - before, 2);
}

TEST_F(ClientTest, WithOneAttemptUnavailableReachesTheCaller) {
  std::unique_ptr<Client> client = Connect();
  service_.FailNext(1);
  absl::StatusOr<AttendResult> refused = client->Attend(
      SpecFor(q_shape_, kv_shape_), q_.view(), k_.view(), v_.view());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(service_.calls(), 1);
}

TEST_F(ClientTest, GetClusterInfo) {
  service_.set_cluster(2, true);
  std::unique_ptr<Client> client = Connect();
  absl::StatusOr<v1::ClusterInfo> info = client->GetClusterInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->world_size(), 2);
  EXPECT_TRUE(info->ready());
}

TEST(ClientConnectTest, RejectsBadOptions) {
  EXPECT_EQ(Client::Connect("", {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  ClientOptions options;
  options.chunk_bytes = 0;
  EXPECT_EQ(Client::Connect("127.0.0.1:1", options).status().code(),
            absl::StatusCode::kInvalidArgument);
  for (int attempts : {0, ClientOptions::kMostAttempts + 1}) {
    ClientOptions retrying;
    retrying.max_attempts = attempts;
    EXPECT_EQ(Client::Connect("127.0.0.1:1", retrying).status().code(),
              absl::StatusCode::kInvalidArgument)
        << attempts;
  }
}

TEST(ClientConnectTest, UnreachableServerIsUnavailable) {
  // A port this test holds bound but not listening: connections are refused.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&address), length), 0);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length), 0);
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(
      "127.0.0.1:" + std::to_string(ntohs(address.sin_port)), {});
  ASSERT_TRUE(client.ok());
  EXPECT_EQ((*client)->GetClusterInfo().status().code(),
            absl::StatusCode::kUnavailable);
  close(fd);
}

}  // namespace
}  // namespace ringattn
