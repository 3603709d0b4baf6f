// Malformed requests get a precise status and a message naming the problem, and
// leave the cluster serving the next request. Streams are written by hand here,
// below the client library, to send what the library never would.

#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "proto/spec_conversion.h"
#include "tests/attention_checks.h"
#include "tests/test_cluster.h"

namespace ringattn {
namespace {

constexpr int64_t kRequestLimit = 1 << 20;

class BadInput : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<std::unique_ptr<TestCluster>> cluster =
        TestCluster::Start({.workers = 2,
                            .coordinator_flags = {absl::StrCat(
                                "--max_request_bytes=", kRequestLimit)}});
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = cluster->release();
  }
  static void TearDownTestSuite() { delete cluster_; }

  // Sends `messages` on one Attend stream and returns how the call ended.
  static grpc::Status Send(const std::vector<v1::AttendRequest>& messages) {
    auto stub = v1::Attention::NewStub(grpc::CreateChannel(
        cluster_->target(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(30));
    auto stream = stub->Attend(&context);
    for (const v1::AttendRequest& message : messages) {
      if (!stream->Write(message)) break;
    }
    stream->WritesDone();
    v1::AttendResponse response;
    while (stream->Read(&response)) {
    }
    return stream->Finish();
  }

  static v1::AttendRequest Header(const v1::AttentionSpec& spec) {
    v1::AttendRequest request;
    *request.mutable_header() = spec;
    return request;
  }

  static v1::AttendRequest Chunk(v1::TensorName tensor, int64_t offset,
                                 int64_t count, int64_t bytes,
                                 int64_t batch = 0) {
    v1::AttendRequest request;
    v1::TensorChunk* chunk = request.mutable_chunk();
    chunk->set_tensor(tensor);
    chunk->set_batch(batch);
    chunk->set_token_offset(offset);
    chunk->set_token_count(count);
    chunk->set_data(std::string(static_cast<size_t>(bytes), '\0'));
    return request;
  }

  // A small valid request: N=8, one head, D=4, fp32 (16 bytes a row).
  static v1::AttentionSpec SmallSpec() {
    v1::AttentionSpec spec;
    spec.set_batch(1);
    spec.set_q_len(8);
    spec.set_kv_len(8);
    spec.set_q_heads(1);
    spec.set_kv_heads(1);
    spec.set_head_dim(4);
    spec.set_wire_dtype(v1::FP32);
    return spec;
  }

  static std::vector<v1::AttendRequest> Complete() {
    return {Header(SmallSpec()), Chunk(v1::Q, 0, 8, 128),
            Chunk(v1::K, 0, 8, 128), Chunk(v1::V, 0, 8, 128)};
  }

  static void ExpectStatus(const grpc::Status& status, grpc::StatusCode code,
                           const std::vector<std::string>& words) {
    EXPECT_EQ(status.error_code(), code) << status.error_message();
    for (const std::string& word : words) {
      EXPECT_NE(status.error_message().find(word), std::string::npos)
          << "'" << word << "' missing from: " << status.error_message();
    }
  }

  // Polls the metrics (up to 10 s) until no request holds admitted bytes: a
  // cancelled request lets go of its admission once the coordinator notices.
  static void ExpectAdmissionReleased() {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    std::string metrics;
    while (absl::Now() < deadline) {
      metrics = cluster_->Metrics().value_or("");
      if (metrics.find("ringattn_inflight_bytes 0\n") != std::string::npos) {
        return;
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    ADD_FAILURE() << "admitted bytes still held after 10 s: " << metrics;
  }

  static TestCluster* cluster_;
};

TestCluster* BadInput::cluster_ = nullptr;

TEST_F(BadInput, WellFormedSmallRequestSucceeds) {
  EXPECT_TRUE(Send(Complete()).ok());
}

TEST_F(BadInput, MissingHeader) {
  ExpectStatus(Send({Chunk(v1::Q, 0, 8, 128)}),
               grpc::StatusCode::INVALID_ARGUMENT, {"first message", "header"});
  ExpectStatus(Send({}), grpc::StatusCode::INVALID_ARGUMENT, {"header"});
}

TEST_F(BadInput, HeaderSentTwice) {
  std::vector<v1::AttendRequest> messages = Complete();
  messages.insert(messages.begin() + 2, Header(SmallSpec()));
  ExpectStatus(Send(messages), grpc::StatusCode::INVALID_ARGUMENT,
               {"second header"});
}

TEST_F(BadInput, QueryHeadsNotMultipleOfKvHeads) {
  v1::AttentionSpec spec = SmallSpec();
  spec.set_q_heads(3);
  spec.set_kv_heads(2);
  ExpectStatus(Send({Header(spec)}), grpc::StatusCode::INVALID_ARGUMENT,
               {"q_heads", "kv_heads (2)"});
}

TEST_F(BadInput, ZeroSizeDimension) {
  v1::AttentionSpec spec = SmallSpec();
  spec.set_head_dim(0);
  ExpectStatus(Send({Header(spec)}), grpc::StatusCode::INVALID_ARGUMENT,
               {"head_dim", "got 0"});
}

TEST_F(BadInput, UnknownDType) {
  v1::AttentionSpec spec = SmallSpec();
  spec.set_wire_dtype(static_cast<v1::DType>(9));
  ExpectStatus(Send({Header(spec)}), grpc::StatusCode::INVALID_ARGUMENT,
               {"wire_dtype", "9"});
}

TEST_F(BadInput, UnknownOutputDType) {
  v1::AttentionSpec spec = SmallSpec();
  spec.set_output_dtype(static_cast<v1::DType>(7));
  ExpectStatus(Send({Header(spec)}), grpc::StatusCode::INVALID_ARGUMENT,
               {"output_dtype", "7"});
}

TEST_F(BadInput, ChunkPastTheEnd) {
  ExpectStatus(Send({Header(SmallSpec()), Chunk(v1::K, 6, 4, 64)}),
               grpc::StatusCode::INVALID_ARGUMENT,
               {"tensor K", "[6, 10)", "[0, 8)"});
}

TEST_F(BadInput, WrongByteCountForDType) {
  ExpectStatus(Send({Header(SmallSpec()), Chunk(v1::V, 0, 2, 31)}),
               grpc::StatusCode::INVALID_ARGUMENT,
               {"tensor V", "31 bytes", "fp32", "need 32"});
}

TEST_F(BadInput, OverlappingChunks) {
  ExpectStatus(Send({Header(SmallSpec()), Chunk(v1::Q, 0, 5, 80),
                     Chunk(v1::Q, 4, 4, 64)}),
               grpc::StatusCode::INVALID_ARGUMENT,
               {"tensor Q", "[4, 5)", "already sent"});
}

TEST_F(BadInput, MissingRows) {
  ExpectStatus(Send({Header(SmallSpec()), Chunk(v1::Q, 0, 8, 128),
                     Chunk(v1::K, 0, 8, 128), Chunk(v1::V, 0, 3, 48),
                     Chunk(v1::V, 5, 3, 48)}),
               grpc::StatusCode::INVALID_ARGUMENT,
               {"tensor V", "missing tokens [3, 5)"});
}

TEST_F(BadInput, UnknownTensorAndBatch) {
  ExpectStatus(
      Send({Header(SmallSpec()), Chunk(v1::TENSOR_UNSPECIFIED, 0, 1, 16)}),
      grpc::StatusCode::INVALID_ARGUMENT, {"'tensor'"});
  ExpectStatus(Send({Header(SmallSpec()), Chunk(v1::Q, 0, 1, 16, 1)}),
               grpc::StatusCode::INVALID_ARGUMENT, {"batch 1", "[0, 1)"});
}

TEST_F(BadInput, RequestLargerThanTheLimit) {
  v1::AttentionSpec spec = SmallSpec();
  spec.set_q_len(100000);
  spec.set_kv_len(100000);
  ExpectStatus(Send({Header(spec)}), grpc::StatusCode::RESOURCE_EXHAUSTED,
               {std::to_string(kRequestLimit), "--max_request_bytes"});
}

TEST_F(BadInput, ClusterStillServesAfterwards) {
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(Send({Header(SmallSpec()), Chunk(v1::Q, 6, 4, 64)}).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT);
  }
  EXPECT_TRUE(Send(Complete()).ok());
}

TEST_F(BadInput, ClientThatCancelsMidUploadLeavesNothingBehind) {
  auto stub = v1::Attention::NewStub(grpc::CreateChannel(
      cluster_->target(), grpc::InsecureChannelCredentials()));
  {
    grpc::ClientContext context;
    auto stream = stub->Attend(&context);
    ASSERT_TRUE(stream->Write(Header(SmallSpec())));
    ASSERT_TRUE(stream->Write(Chunk(v1::Q, 0, 8, 128)));
    context.TryCancel();
    EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  // The coordinator lets go of the request's admission (and cancels its
  // workers).
  ExpectAdmissionReleased();
  EXPECT_TRUE(Send(Complete()).ok());
}

// A small request reaches each worker as one message and the coordinator
// reads the workers' answers on the call's own thread: a client that goes
// away once it sent everything (the coordinator may be reading it or waiting
// for the workers) is noticed, the request lets go of what it held, and the
// cluster serves the next one.
TEST_F(BadInput, ClientThatGoesAwayAfterSendingASmallRequestIsNoticed) {
  // 20000 tokens of one head of 4 fp32 values: under 1 MiB to upload.
  const int64_t n = 20000;
  v1::AttentionSpec spec = SmallSpec();
  spec.set_q_len(n);
  spec.set_kv_len(n);
  auto stub = v1::Attention::NewStub(grpc::CreateChannel(
      cluster_->target(), grpc::InsecureChannelCredentials()));
  {
    grpc::ClientContext context;
    auto stream = stub->Attend(&context);
    ASSERT_TRUE(stream->Write(Header(spec)));
    for (v1::TensorName tensor : {v1::Q, v1::K, v1::V}) {
      ASSERT_TRUE(stream->Write(Chunk(tensor, 0, n, n * 16)));
    }
    stream->WritesDone();
    context.TryCancel();
    EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  ExpectAdmissionReleased();
  EXPECT_TRUE(Send(Complete()).ok());
}

}  // namespace
}  // namespace ringattn
