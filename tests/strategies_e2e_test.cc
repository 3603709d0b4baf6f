// Strategies end to end on three CPU workers: forced PASS_KV, PASS_Q and
// BROADCAST_Q agree with each other and with the float64 reference for Attend
// (also with fewer positions than workers) and for Query against a context
// appended in uneven pieces; STRATEGY_AUTO follows the cost model
// (server/strategy_choice.h) and the summary and metrics say which strategy
// ran; strategies that cannot run a request are refused precisely.
// Broadcast-Q's partials merged at the coordinator and on the workers (a tree
// over Gloo) agree, in fp32 and bf16 output, and MERGE_AUTO follows the merge
// cost model (server/merge_choice.h). The summary and metrics say which CPU
// kernel computed each request: DecodeAttention for a few rows,
// BlockAttention for many.

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/attention_checks.h"
#include "tests/test_cluster.h"

namespace ringattn {
namespace {

constexpr int64_t kContextLength = 307;  // prime
// Two fp32 results of different summation orders agree this closely.
constexpr double kAgreement = 4e-5;

AttentionSpec Spec(int64_t nq, int64_t nk, int64_t kv_heads) {
  AttentionSpec spec;
  spec.q_len = nq;
  spec.kv_len = nk;
  spec.q_heads = 8;
  spec.kv_heads = kv_heads;
  spec.head_dim = 80;
  spec.causal = true;
  return spec;
}

v1::AttentionSpec Forced(const AttentionSpec& spec, v1::Strategy strategy) {
  v1::AttentionSpec request = RequestSpec(spec);
  request.set_strategy(strategy);
  return request;
}

constexpr v1::Strategy kAllStrategies[] = {v1::PASS_KV, v1::PASS_Q,
                                           v1::BROADCAST_Q};

void ExpectAgree(const AttendResult& a, const AttendResult& b) {
  ASSERT_EQ(a.output.values().size(), b.output.values().size());
  for (size_t i = 0; i < a.output.values().size(); ++i) {
    const float x = a.output.values()[i];
    ASSERT_NEAR(x, b.output.values()[i], kAgreement * (1 + std::abs(x)))
        << "output element " << i;
  }
  ASSERT_EQ(a.lse.size(), b.lse.size());
  for (size_t i = 0; i < a.lse.size(); ++i) {
    if (std::isinf(a.lse[i])) {
      ASSERT_EQ(a.lse[i], b.lse[i]) << "lse element " << i;
      continue;
    }
    ASSERT_NEAR(a.lse[i], b.lse[i], kAgreement * (1 + std::abs(a.lse[i])))
        << "lse element " << i;
  }
}

using KernelLaunches = std::map<std::string, int64_t>;

// The summary's kernel launches: the sum of its workers', all of CPU kernels
// (worker.proto's names), at least one.
KernelLaunches ExpectCpuKernelLaunches(const v1::Summary& summary) {
  const KernelLaunches launches(summary.kernel_launches().begin(),
                                summary.kernel_launches().end());
  EXPECT_FALSE(launches.empty());
  KernelLaunches summed;
  for (const v1::WorkerUsage& usage : summary.workers()) {
    for (const auto& [kernel, count] : usage.kernel_launches()) {
      summed[kernel] += count;
    }
  }
  EXPECT_EQ(summed, launches);
  for (const auto& [kernel, count] : launches) {
    EXPECT_TRUE(kernel == "cpu_block" || kernel == "cpu_decode") << kernel;
    EXPECT_GT(count, 0) << kernel;
  }
  return launches;
}

class Strategies : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<std::unique_ptr<TestCluster>> cluster =
        TestCluster::Start({.workers = 3});
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = cluster->release();
  }
  static void TearDownTestSuite() { delete cluster_; }

  // Context `name` holding the K/V of `in`, uploaded as a create and appends
  // of uneven sizes.
  static void Upload(Client& client, const std::string& name,
                     const RandomInputs& in) {
    int64_t at = 0;
    for (int64_t piece : {100, 37, 1, 169}) {
      const View<const float> k = in.k.view().Slice(at, at + piece);
      const View<const float> v = in.v.view().Slice(at, at + piece);
      absl::StatusOr<v1::ContextInfo> info =
          at == 0 ? client.CreateContext(name, k, v)
                  : client.AppendContext(name, k, v);
      ASSERT_TRUE(info.ok()) << info.status();
      at += piece;
    }
    ASSERT_EQ(at, kContextLength);
  }

  static TestCluster* cluster_;
};

TestCluster* Strategies::cluster_ = nullptr;

TEST_F(Strategies, AttendAllStrategiesAgreeWithReference) {
  std::unique_ptr<Client> client = cluster_->NewClient();
  for (int64_t kv_heads : {2, 1}) {
    for (int64_t nq : {1, 3, 17, 300}) {
      SCOPED_TRACE("Hkv=" + std::to_string(kv_heads) +
                   " Nq=" + std::to_string(nq));
      const AttentionSpec spec = Spec(nq, kContextLength, kv_heads);
      const RandomInputs in =
          MakeRandomInputs(spec, static_cast<uint32_t>(nq + 10 * kv_heads));
      std::vector<AttendResult> results;
      for (v1::Strategy strategy : kAllStrategies) {
        absl::StatusOr<AttendResult> result = client->Attend(
            Forced(spec, strategy), in.q.view(), in.k.view(), in.v.view());
        ASSERT_TRUE(result.ok()) << result.status();
        EXPECT_EQ(result->summary.strategy(), strategy);
        ExpectCpuKernelLaunches(result->summary);
        ExpectMatchesReference(spec, in, *result);
        results.push_back(std::move(*result));
      }
      for (size_t i = 1; i < results.size(); ++i) {
        SCOPED_TRACE(v1::Strategy_Name(results[i].summary.strategy()));
        ExpectAgree(results[0], results[i]);
      }
    }
  }
}

// Broadcast-Q gives each worker all query rows in one task per key chunk:
// one row times Hq / Hkv = 4 packed rows runs DecodeAttention, 300 rows (1200
// packed, over kernels/cpu/run_task.h's 128) BlockAttention.
TEST_F(Strategies, SummaryAndMetricsSayWhichKernelsRan) {
  std::unique_ptr<Client> client = cluster_->NewClient();
  struct Case {
    int64_t nq;
    const char* kernel;
  };
  for (const Case& c : {Case{1, "cpu_decode"}, Case{300, "cpu_block"}}) {
    SCOPED_TRACE("Nq=" + std::to_string(c.nq));
    const AttentionSpec spec = Spec(c.nq, kContextLength, 2);
    const RandomInputs in =
        MakeRandomInputs(spec, static_cast<uint32_t>(90 + c.nq));
    const std::string series =
        std::string("ringattn_kernel_launches_total{kernel=\"") + c.kernel +
        "\"}";
    absl::StatusOr<std::string> before = cluster_->Metrics();
    ASSERT_TRUE(before.ok()) << before.status();
    absl::StatusOr<AttendResult> result = client->Attend(
        Forced(spec, v1::BROADCAST_Q), in.q.view(), in.k.view(), in.v.view());
    ASSERT_TRUE(result.ok()) << result.status();
    const KernelLaunches launches = ExpectCpuKernelLaunches(result->summary);
    ASSERT_EQ(launches.size(), 1u);
    EXPECT_EQ(launches.begin()->first, c.kernel);
    // Every one of the three workers computed against its keys.
    EXPECT_GE(launches.begin()->second, 3);
    for (const v1::WorkerUsage& usage : result->summary.workers()) {
      EXPECT_EQ(usage.kernel_launches().size(), 1u) << "rank " << usage.rank();
    }
    absl::StatusOr<std::string> after = cluster_->Metrics();
    ASSERT_TRUE(after.ok()) << after.status();
    EXPECT_EQ(SeriesValue(*after, series) - SeriesValue(*before, series),
              static_cast<double>(launches.begin()->second))
        << *after;
  }
}

TEST_F(Strategies, QueryOfUnevenContextAllStrategiesAgreeWithReference) {
  std::unique_ptr<Client> client = cluster_->NewClient();
  for (int64_t kv_heads : {2, 1}) {
    const std::string name = "context-hkv" + std::to_string(kv_heads);
    const RandomInputs context = MakeRandomInputs(
        Spec(kContextLength, kContextLength, kv_heads), 40 + kv_heads);
    Upload(*client, name, context);
    for (int64_t nq : {1, 3, 17, 300}) {
      SCOPED_TRACE("Hkv=" + std::to_string(kv_heads) +
                   " Nq=" + std::to_string(nq));
      const AttentionSpec spec = Spec(nq, kContextLength, kv_heads);
      RandomInputs in = MakeRandomInputs(spec, static_cast<uint32_t>(nq));
      in.k = Tensor<float>(context.k.shape());
      in.k.values() = context.k.values();
      in.v = Tensor<float>(context.v.shape());
      in.v.values() = context.v.values();
      std::vector<AttendResult> results;
      for (v1::Strategy strategy : kAllStrategies) {
        absl::StatusOr<AttendResult> result =
            client->Query(name, Forced(spec, strategy), in.q.view());
        ASSERT_TRUE(result.ok()) << result.status();
        EXPECT_EQ(result->summary.strategy(), strategy);
        ExpectMatchesReference(spec, in, *result);
        results.push_back(std::move(*result));
      }
      for (size_t i = 1; i < results.size(); ++i) {
        SCOPED_TRACE(v1::Strategy_Name(results[i].summary.strategy()));
        ExpectAgree(results[0], results[i]);
      }
    }
    EXPECT_TRUE(client->DeleteContext(name).ok());
  }
}

TEST_F(Strategies, FewerPositionsThanWorkersAllStrategiesAgree) {
  std::unique_ptr<Client> client = cluster_->NewClient();
  for (int64_t nk : {1, 2}) {
    SCOPED_TRACE("Nk=" + std::to_string(nk));
    const AttentionSpec spec = Spec(1, nk, 1);
    const RandomInputs in = MakeRandomInputs(spec, static_cast<uint32_t>(nk));
    std::vector<AttendResult> results;
    for (v1::Strategy strategy : kAllStrategies) {
      absl::StatusOr<AttendResult> result = client->Attend(
          Forced(spec, strategy), in.q.view(), in.k.view(), in.v.view());
      ASSERT_TRUE(result.ok()) << result.status();
      EXPECT_EQ(result->summary.strategy(), strategy);
      ExpectMatchesReference(spec, in, *result);
      results.push_back(std::move(*result));
    }
    for (size_t i = 1; i < results.size(); ++i) {
      ExpectAgree(results[0], results[i]);
    }
  }
}

TEST_F(Strategies, AutoFollowsTheCostModel) {
  std::unique_ptr<Client> client = cluster_->NewClient();
  const AttentionSpec square = Spec(kContextLength, kContextLength, 2);
  const RandomInputs context = MakeRandomInputs(square, 7);
  Upload(*client, "auto", context);
  // One query row against the whole context: broadcast-Q moves ~1/100 of the
  // bytes.
  const AttentionSpec decode = Spec(1, kContextLength, 2);
  RandomInputs in = MakeRandomInputs(decode, 8);
  absl::StatusOr<AttendResult> result =
      client->Query("auto", RequestSpec(decode), in.q.view());
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->summary.strategy(), v1::BROADCAST_Q);
  in.k = Tensor<float>(context.k.shape());
  in.k.values() = context.k.values();
  in.v = Tensor<float>(context.v.shape());
  in.v.values() = context.v.values();
  ExpectMatchesReference(decode, in, *result);
  EXPECT_TRUE(client->DeleteContext("auto").ok());
  // Nq = Nk: pass-KV.
  result = client->Attend(RequestSpec(square), context.q.view(),
                          context.k.view(), context.v.view());
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->summary.strategy(), v1::PASS_KV);
  ExpectMatchesReference(square, context, *result);
  absl::StatusOr<std::string> metrics = cluster_->Metrics();
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_NE(metrics->find("ringattn_strategy_requests_total{strategy=\""
                          "BROADCAST_Q\"}"),
            std::string::npos)
      << *metrics;
}

v1::AttentionSpec BroadcastMergedAt(const AttentionSpec& spec,
                                    v1::PartialMerge merge,
                                    v1::DType output = v1::FP32) {
  v1::AttentionSpec request = Forced(spec, v1::BROADCAST_Q);
  request.set_partial_merge(merge);
  request.set_output_dtype(output);
  return request;
}

// Two bf16 outputs rounded from fp32 values that differ only by summation
// order: a unit in bf16's last place apart at most.
void ExpectAgreeInBf16(const AttendResult& a, const AttendResult& b) {
  ASSERT_EQ(a.output.values().size(), b.output.values().size());
  for (size_t i = 0; i < a.output.values().size(); ++i) {
    const float x = a.output.values()[i];
    ASSERT_NEAR(x, b.output.values()[i], std::ldexp(std::abs(x), -7) + 1e-6)
        << "output element " << i;
  }
}

TEST_F(Strategies, BroadcastMergeOnWorkersAgreesWithMergeAtCoordinator) {
  std::unique_ptr<Client> client = cluster_->NewClient();
  const RandomInputs context =
      MakeRandomInputs(Spec(kContextLength, kContextLength, 2), 50);
  Upload(*client, "merges", context);
  for (int64_t nq : {1, 3, 17, 300}) {
    SCOPED_TRACE("Nq=" + std::to_string(nq));
    const AttentionSpec spec = Spec(nq, kContextLength, 2);
    RandomInputs in = MakeRandomInputs(spec, static_cast<uint32_t>(60 + nq));
    in.k = Tensor<float>(context.k.shape());
    in.k.values() = context.k.values();
    in.v = Tensor<float>(context.v.shape());
    in.v.values() = context.v.values();
    for (v1::DType output : {v1::FP32, v1::BF16}) {
      SCOPED_TRACE(v1::DType_Name(output));
      std::vector<AttendResult> results;
      for (v1::PartialMerge merge :
           {v1::MERGE_AT_COORDINATOR, v1::MERGE_ON_WORKERS}) {
        // A query of the resident context, and the same rows uploaded.
        absl::StatusOr<AttendResult> queried = client->Query(
            "merges", BroadcastMergedAt(spec, merge, output), in.q.view());
        ASSERT_TRUE(queried.ok()) << queried.status();
        absl::StatusOr<AttendResult> attended =
            client->Attend(BroadcastMergedAt(spec, merge, output), in.q.view(),
                           in.k.view(), in.v.view());
        ASSERT_TRUE(attended.ok()) << attended.status();
        for (AttendResult* result : {&*queried, &*attended}) {
          EXPECT_EQ(result->summary.strategy(), v1::BROADCAST_Q);
          EXPECT_EQ(result->summary.partial_merge(), merge);
          // The tree sends one partial from each of the two other workers.
          EXPECT_EQ(result->summary.ring_transfers(),
                    merge == v1::MERGE_ON_WORKERS ? 2 : 0);
          if (output == v1::FP32) ExpectMatchesReference(spec, in, *result);
          results.push_back(std::move(*result));
        }
      }
      for (size_t i = 1; i < results.size(); ++i) {
        SCOPED_TRACE("result " + std::to_string(i));
        if (output == v1::FP32) {
          ExpectAgree(results[0], results[i]);
        } else {
          ExpectAgreeInBf16(results[0], results[i]);
        }
      }
    }
  }
  EXPECT_TRUE(client->DeleteContext("merges").ok());
}

TEST_F(Strategies, AutoMergeFollowsTheMergeCostModel) {
  std::unique_ptr<Client> client = cluster_->NewClient();
  const RandomInputs context =
      MakeRandomInputs(Spec(kContextLength, kContextLength, 2), 70);
  Upload(*client, "auto-merge", context);
  // A forced tree first, so that the workers keep a communicator whatever
  // ran before: AUTO's choice below then weighs joining the kept one.
  const AttentionSpec few = Spec(3, kContextLength, 2);
  const RandomInputs few_in = MakeRandomInputs(few, 71);
  ASSERT_TRUE(client
                  ->Query("auto-merge",
                          BroadcastMergedAt(few, v1::MERGE_ON_WORKERS),
                          few_in.q.view())
                  .ok());
  struct Case {
    int64_t nq;
    v1::PartialMerge expected;
  };
  // One row: microseconds of partials against a millisecond of joining. 2048
  // rows in bf16: 5.3 MB of fp32 partials per worker (server/merge_choice.h).
  for (const Case& c :
       {Case{1, v1::MERGE_AT_COORDINATOR}, Case{2048, v1::MERGE_ON_WORKERS}}) {
    SCOPED_TRACE("Nq=" + std::to_string(c.nq));
    const AttentionSpec spec = Spec(c.nq, kContextLength, 2);
    const RandomInputs in =
        MakeRandomInputs(spec, static_cast<uint32_t>(72 + c.nq));
    absl::StatusOr<AttendResult> result = client->Query(
        "auto-merge", BroadcastMergedAt(spec, v1::MERGE_AUTO, v1::BF16),
        in.q.view());
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->summary.strategy(), v1::BROADCAST_Q);
    EXPECT_EQ(result->summary.partial_merge(), c.expected);
  }
  EXPECT_TRUE(client->DeleteContext("auto-merge").ok());
  absl::StatusOr<std::string> metrics = cluster_->Metrics();
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  for (const char* label : {"coordinator", "workers"}) {
    EXPECT_NE(
        metrics->find(
            std::string("ringattn_partial_merge_requests_total{merge=\"") +
            label + "\"}"),
        std::string::npos)
        << *metrics;
  }
}

// A world of one has nothing to reduce: broadcast-Q's AUTO has its worker
// send the partial as the output, narrowed, whatever the size.
TEST(OneWorker, BroadcastQSendsItsPartialAsTheOutput) {
  absl::StatusOr<std::unique_ptr<TestCluster>> cluster =
      TestCluster::Start({.workers = 1});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  std::unique_ptr<Client> client = (*cluster)->NewClient();
  const RandomInputs context =
      MakeRandomInputs(Spec(kContextLength, kContextLength, 2), 81);
  ASSERT_TRUE(
      client->CreateContext("one", context.k.view(), context.v.view()).ok());
  for (int64_t nq : {1, 17, 300}) {
    SCOPED_TRACE("Nq=" + std::to_string(nq));
    const AttentionSpec spec = Spec(nq, kContextLength, 2);
    RandomInputs in = MakeRandomInputs(spec, static_cast<uint32_t>(82 + nq));
    in.k.values() = context.k.values();
    in.v.values() = context.v.values();
    absl::StatusOr<AttendResult> result = client->Query(
        "one", BroadcastMergedAt(spec, v1::MERGE_AUTO), in.q.view());
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->summary.strategy(), v1::BROADCAST_Q);
    EXPECT_EQ(result->summary.partial_merge(), v1::MERGE_ON_WORKERS);
    ExpectMatchesReference(spec, in, *result);
  }
}

TEST_F(Strategies, UnknownPartialMergeIsRefused) {
  std::unique_ptr<Client> client = cluster_->NewClient();
  const AttentionSpec spec = Spec(3, 16, 2);
  const RandomInputs in = MakeRandomInputs(spec, 80);
  v1::AttentionSpec request = RequestSpec(spec);
  request.set_partial_merge(static_cast<v1::PartialMerge>(9));
  const absl::StatusOr<AttendResult> result =
      client->Attend(request, in.q.view(), in.k.view(), in.v.view());
  EXPECT_TRUE(absl::IsInvalidArgument(result.status())) << result.status();
}

TEST_F(Strategies, StrategiesThatCannotRunAreRefused) {
  std::unique_ptr<Client> client = cluster_->NewClient();
  AttentionSpec dilated = Spec(64, 64, 2);
  dilated.dilated = {DilatedBranch{16, 2}};
  const RandomInputs in = MakeRandomInputs(dilated, 3);
  absl::StatusOr<AttendResult> refused = client->Attend(
      Forced(dilated, v1::BROADCAST_Q), in.q.view(), in.k.view(), in.v.view());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(refused.status().message().find("dilated"), std::string::npos)
      << refused.status();
  // AUTO runs the dilated request with pass-KV.
  absl::StatusOr<AttendResult> result = client->Attend(
      RequestSpec(dilated), in.q.view(), in.k.view(), in.v.view());
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->summary.strategy(), v1::PASS_KV);
  ExpectMatchesReference(dilated, in, *result);
}

TEST_F(Strategies, ForcedPassQRunsDilatedRequestsAndIsCounted) {
  std::unique_ptr<Client> client = cluster_->NewClient();
  AttentionSpec dilated = Spec(64, 64, 2);
  dilated.dilated = {DilatedBranch{16, 2}};
  const RandomInputs in = MakeRandomInputs(dilated, 4);
  absl::StatusOr<AttendResult> result = client->Attend(
      Forced(dilated, v1::PASS_Q), in.q.view(), in.k.view(), in.v.view());
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->summary.strategy(), v1::PASS_Q);
  ExpectMatchesReference(dilated, in, *result);
  absl::StatusOr<std::string> metrics = cluster_->Metrics();
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_NE(
      metrics->find("ringattn_strategy_requests_total{strategy=\"PASS_Q\"}"),
      std::string::npos)
      << *metrics;
}

}  // namespace
}  // namespace ringattn
