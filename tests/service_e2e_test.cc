// End to end: a real coordinator and CPU workers as separate processes on
// loopback, requests through the client library, results against the float64
// reference.

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "client/chunking.h"
#include "core/block_mask.h"
#include "core/dtype.h"
#include "gtest/gtest.h"
#include "tests/attention_checks.h"
#include "tests/test_cluster.h"

namespace ringattn {
namespace {

// Sends the request for `spec` through a new client and checks it.
void ExpectServiceMatchesReference(const TestCluster& cluster,
                                   const AttentionSpec& spec,
                                   v1::DType wire = v1::FP32,
                                   uint32_t seed = 1) {
  const RandomInputs in = MakeRandomInputs(spec, seed, wire);
  std::unique_ptr<Client> client = cluster.NewClient();
  absl::StatusOr<AttendResult> result = client->Attend(
      RequestSpec(spec, wire), in.q.view(), in.k.view(), in.v.view());
  ASSERT_TRUE(result.ok()) << result.status();
  ExpectMatchesReference(spec, in, *result);
}

class ThreeWorkers : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<std::unique_ptr<TestCluster>> cluster =
        TestCluster::Start({.workers = 3});
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = cluster->release();
  }
  static void TearDownTestSuite() { delete cluster_; }

  static TestCluster* cluster_;
};

TestCluster* ThreeWorkers::cluster_ = nullptr;

TEST_F(ThreeWorkers, DenseGqaPrimeLengthMatchesReference) {
  ExpectServiceMatchesReference(*cluster_,
                                SelfAttentionSpec(257, 8, 2, 64, false));
}

TEST_F(ThreeWorkers, CausalMqaWithHeadDim80MatchesReference) {
  ExpectServiceMatchesReference(*cluster_,
                                SelfAttentionSpec(301, 4, 1, 80, true));
}

TEST_F(ThreeWorkers, FewerTokensThanWorkers) {
  ExpectServiceMatchesReference(*cluster_,
                                SelfAttentionSpec(2, 2, 1, 64, true));
  ExpectServiceMatchesReference(*cluster_,
                                SelfAttentionSpec(1, 2, 2, 64, false));
}

TEST_F(ThreeWorkers, CausalContinuationOfShortQueryBatch) {
  AttentionSpec spec = SelfAttentionSpec(301, 4, 2, 64, true);
  spec.q_len = 17;
  ExpectServiceMatchesReference(*cluster_, spec);
}

TEST_F(ThreeWorkers, BatchOfTwoWithScale) {
  AttentionSpec spec = SelfAttentionSpec(100, 4, 2, 128, true);
  spec.batch = 2;
  spec.scale = 0.2f;
  ExpectServiceMatchesReference(*cluster_, spec);
}

TEST_F(ThreeWorkers, DilatedBothCombineModesMatchReference) {
  AttentionSpec spec = SelfAttentionSpec(300, 8, 2, 64, true);
  spec.dilated = {{64, 1}, {128, 2}, {256, 4}};
  ExpectServiceMatchesReference(*cluster_, spec);
  spec.combine = DilatedCombine::kHeadGroups;
  spec.causal = false;
  ExpectServiceMatchesReference(*cluster_, spec);
}

TEST_F(ThreeWorkers, BlockSparseMatchesReferenceAndReturnsItsMask) {
  AttentionSpec spec = SelfAttentionSpec(250, 4, 2, 64, true);
  BlockSparseRules rules;
  rules.block_size = 16;
  rules.local = 1;
  rules.global = 1;
  rules.random = 1;
  rules.seed = 3;
  spec.block_sparse = rules;
  ExpectServiceMatchesReference(*cluster_, spec);

  const RandomInputs in = MakeRandomInputs(spec, 2);
  v1::AttentionSpec request = RequestSpec(spec);
  request.mutable_block_sparse()->set_return_mask(true);
  absl::StatusOr<AttendResult> result = cluster_->NewClient()->Attend(
      request, in.q.view(), in.k.view(), in.v.view());
  ASSERT_TRUE(result.ok()) << result.status();
  const BlockMask mask = BlockMask::FromRules(rules, 250);
  ASSERT_EQ(result->summary.mask_blocks(), mask.num_blocks());
  for (int64_t i = 0; i < mask.num_blocks(); ++i) {
    for (int64_t j = 0; j < mask.num_blocks(); ++j) {
      EXPECT_EQ(result->summary.block_mask()[i * mask.num_blocks() + j] != 0,
                mask.Allowed(i, j));
    }
  }
}

TEST_F(ThreeWorkers, HilbertOrderOnNonSquareGrid) {
  AttentionSpec spec = SelfAttentionSpec(7 * 11, 2, 1, 64, true);
  spec.hilbert = HilbertGrid{7, 11};
  ExpectServiceMatchesReference(*cluster_, spec);
}

TEST_F(ThreeWorkers, HalfAndBfloat16OnTheWire) {
  ExpectServiceMatchesReference(
      *cluster_, SelfAttentionSpec(130, 4, 2, 64, true), v1::FP16);
  ExpectServiceMatchesReference(
      *cluster_, SelfAttentionSpec(130, 4, 2, 64, false), v1::BF16);
}

TEST_F(ThreeWorkers, SixteenBitOutputIsTheRoundedFp32Output) {
  const AttentionSpec spec = SelfAttentionSpec(131, 4, 2, 80, true);
  const RandomInputs in = MakeRandomInputs(spec, 5, v1::BF16);
  std::unique_ptr<Client> client = cluster_->NewClient();
  absl::StatusOr<AttendResult> fp32 = client->Attend(
      RequestSpec(spec, v1::BF16), in.q.view(), in.k.view(), in.v.view());
  ASSERT_TRUE(fp32.ok()) << fp32.status();
  ExpectMatchesReference(spec, in, *fp32);
  for (const v1::DType output : {v1::BF16, v1::FP16}) {
    v1::AttentionSpec request = RequestSpec(spec, v1::BF16);
    request.set_output_dtype(output);
    absl::StatusOr<AttendResult> narrow =
        client->Attend(request, in.q.view(), in.k.view(), in.v.view());
    ASSERT_TRUE(narrow.ok()) << narrow.status();
    const DType dtype = output == v1::BF16 ? DType::kBFloat16 : DType::kFloat16;
    const std::vector<float>& want = fp32->output.values();
    const std::vector<float>& got = narrow->output.values();
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      float rounded;
      uint16_t bits;
      ConvertFromFloat(dtype, &want[i], &bits, 1);
      ConvertToFloat(dtype, &bits, &rounded, 1);
      ASSERT_EQ(got[i], rounded) << v1::DType_Name(output) << " element " << i;
    }
    EXPECT_EQ(narrow->lse, fp32->lse);
  }
}

TEST_F(ThreeWorkers, StreamingAttendHandsOnEveryRowOnce) {
  AttentionSpec spec = SelfAttentionSpec(97, 4, 2, 64, true);
  spec.batch = 2;
  const RandomInputs in = MakeRandomInputs(spec, 6);
  ClientOptions options;
  options.chunk_bytes = 4096;  // many chunks each way
  std::unique_ptr<Client> client = cluster_->NewClient(options);
  const v1::AttentionSpec request = RequestSpec(spec);
  absl::StatusOr<AttendResult> whole =
      client->Attend(request, in.q.view(), in.k.view(), in.v.view());
  ASSERT_TRUE(whole.ok()) << whole.status();

  ChunkStream source(DType::kFloat32, options.chunk_bytes);
  source.Add(v1::V, in.v.view());  // any tensor order will do
  source.Add(v1::Q, in.q.view());
  source.Add(v1::K, in.k.view());
  Tensor<float> o(in.q.shape());
  int64_t chunks = 0;
  absl::StatusOr<v1::Summary> summary = client->AttendStreaming(
      request, source, [&](const v1::OutputChunk& chunk) {
        const int64_t values =
            chunk.token_count() * spec.q_heads * spec.head_dim;
        std::memcpy(o.view().Row(chunk.batch(), chunk.token_offset(), 0),
                    chunk.data().data(), sizeof(float) * values);
        ++chunks;
        return absl::OkStatus();
      });
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_GT(chunks, 1);
  EXPECT_EQ(o.values(), whole->output.values());
  EXPECT_GT(summary->flops(), 0);
}

TEST_F(ThreeWorkers, ChunksLargerThanFourMebibytesReachTheWorkers) {
  // Q (16 MiB) goes in chunks of 12 MiB, under the coordinator's 16 MiB
  // limit; a worker's piece of one (5.3 MiB) is over gRPC's default 4 MiB.
  const AttentionSpec spec = SelfAttentionSpec(2048, 16, 4, 128, false);
  const RandomInputs in = MakeRandomInputs(spec, 8);
  ClientOptions options;
  options.chunk_bytes = 12 << 20;
  absl::StatusOr<AttendResult> result = cluster_->NewClient(options)->Attend(
      RequestSpec(spec), in.q.view(), in.k.view(), in.v.view());
  ASSERT_TRUE(result.ok()) << result.status();
  ExpectMatchesReference(spec, in, *result);
}

TEST_F(ThreeWorkers, StreamingAttendStopsAtTheConsumersError) {
  const AttentionSpec spec = SelfAttentionSpec(64, 2, 2, 64, false);
  const RandomInputs in = MakeRandomInputs(spec, 7);
  ChunkStream source(DType::kFloat32, 1 << 20);
  source.Add(v1::Q, in.q.view());
  source.Add(v1::K, in.k.view());
  source.Add(v1::V, in.v.view());
  absl::StatusOr<v1::Summary> summary = cluster_->NewClient()->AttendStreaming(
      RequestSpec(spec), source,
      [](const v1::OutputChunk&) { return absl::DataLossError("disk full"); });
  EXPECT_EQ(summary.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(summary.status().message().find("disk full"), std::string::npos);
}

TEST_F(ThreeWorkers, SummaryReportsWorkAndMemoryPerWorker) {
  const AttentionSpec spec = SelfAttentionSpec(600, 2, 2, 64, true);
  const RandomInputs in = MakeRandomInputs(spec, 4);
  absl::StatusOr<AttendResult> result = cluster_->NewClient()->Attend(
      RequestSpec(spec), in.q.view(), in.k.view(), in.v.view());
  ASSERT_TRUE(result.ok()) << result.status();
  const v1::Summary& summary = result->summary;
  EXPECT_EQ(summary.strategy(), v1::PASS_KV);
  EXPECT_EQ(summary.workers_size(), 3);
  // Causal: half the dense FLOPs (plus the diagonal).
  const double dense = 4.0 * 600 * 600 * 2 * 64;
  EXPECT_GT(summary.flops(), 0.45 * dense);
  EXPECT_LT(summary.flops(), 0.6 * dense);
  for (const v1::WorkerUsage& usage : summary.workers()) {
    EXPECT_EQ(usage.tokens(), 200);
    EXPECT_GT(usage.peak_bytes(), 0);
  }
  EXPECT_GT(summary.bytes_in(), 0);
  EXPECT_GT(summary.ring_transfers(), 0);
}

class WorkerCounts : public testing::TestWithParam<int> {};

TEST_P(WorkerCounts, DenseAndCausalMatchReference) {
  absl::StatusOr<std::unique_ptr<TestCluster>> cluster =
      TestCluster::Start({.workers = GetParam()});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ExpectServiceMatchesReference(**cluster,
                                SelfAttentionSpec(131, 4, 2, 64, false));
  ExpectServiceMatchesReference(**cluster,
                                SelfAttentionSpec(131, 4, 1, 64, true));
}

INSTANTIATE_TEST_SUITE_P(OneTwoFour, WorkerCounts, testing::Values(1, 2, 4));

}  // namespace
}  // namespace ringattn
