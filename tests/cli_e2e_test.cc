// The `ringattn` CLI against a real cluster: .npy files in, .npy files out,
// checked against the float64 reference.

#include <cstdlib>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/child_process.h"
#include "client/npy.h"
#include "gtest/gtest.h"
#include "kernels/cpu/reference_attention.h"
#include "security/tls_credentials.h"
#include "tests/attention_checks.h"
#include "tests/test_cluster.h"

namespace ringattn {
namespace {

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/", name);
}

// Runs `ringattn args...` and returns its exit status.
ExitStatus RunCli(const std::vector<std::string>& args) {
  const char* root = std::getenv("TEST_SRCDIR");
  absl::StatusOr<ChildProcess> cli = ChildProcess::Spawn(
      absl::StrCat(root != nullptr ? root : ".", "/ringattn/client/ringattn"),
      args, ChildProcess::Output::kToStderr);
  EXPECT_TRUE(cli.ok()) << cli.status();
  return cli.ok() ? cli->Wait() : ExitStatus{127, 0};
}

void Write(const std::string& path, const Tensor<float>& t) {
  // [N, H, D] files for batch 1.
  const Shape& s = t.shape();
  ASSERT_TRUE(WriteNpy(path, {s.seq, s.heads, s.dim}, t.values()).ok());
}

TEST(Cli, AttendAndContextQueryThroughNpyFiles) {
  absl::StatusOr<std::unique_ptr<TestCluster>> cluster =
      TestCluster::Start({.workers = 2});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  AttentionSpec spec;
  spec.q_len = spec.kv_len = 211;
  spec.q_heads = 4;
  spec.kv_heads = 2;
  spec.head_dim = 64;
  spec.causal = true;
  spec.dilated = {{64, 1}, {128, 2}};
  const RandomInputs in = MakeRandomInputs(spec, 40);
  Write(TempPath("q.npy"), in.q);
  Write(TempPath("k.npy"), in.k);
  Write(TempPath("v.npy"), in.v);
  const std::string target = (*cluster)->target();
  ASSERT_TRUE(
      RunCli({"attend", "--target", target, "--q", TempPath("q.npy"), "--k",
              TempPath("k.npy"), "--v", TempPath("v.npy"), "--out",
              TempPath("o.npy"), "--lse_out", TempPath("lse.npy"), "--causal",
              "--dilated", "64:1,128:2"})
          .success());
  absl::StatusOr<NpyArray> o = ReadNpy(TempPath("o.npy"));
  absl::StatusOr<NpyArray> lse = ReadNpy(TempPath("lse.npy"));
  ASSERT_TRUE(o.ok() && lse.ok());
  EXPECT_EQ(o->shape, (std::vector<int64_t>{211, 4, 64}));
  EXPECT_EQ(lse->shape, (std::vector<int64_t>{4, 211}));
  AttendResult result;
  result.output = Tensor<float>(in.q.shape());
  result.output.values() = o->values;
  result.lse = lse->values;
  ExpectMatchesReference(spec, in, result);

  // The same K/V as a resident context, queried with the last 5 rows of Q.
  ASSERT_TRUE(RunCli({"context", "create", "--target", target, "--name", "ctx",
                      "--k", TempPath("k.npy"), "--v", TempPath("v.npy")})
                  .success());
  AttentionSpec tail = spec;
  tail.dilated.clear();
  tail.q_len = 5;
  RandomInputs short_q = MakeRandomInputs(tail, 41);
  short_q.k.values() = in.k.values();
  short_q.v.values() = in.v.values();
  Write(TempPath("q5.npy"), short_q.q);
  ASSERT_TRUE(
      RunCli({"context", "query", "--target", target, "--name", "ctx", "--q",
              TempPath("q5.npy"), "--out", TempPath("o5.npy"), "--causal"})
          .success());
  absl::StatusOr<NpyArray> o5 = ReadNpy(TempPath("o5.npy"));
  ASSERT_TRUE(o5.ok()) << o5.status();
  AttendResult tail_result;
  tail_result.output = Tensor<float>(short_q.q.shape());
  tail_result.output.values() = o5->values;
  // The reference's LSE is not compared here: the CLI wrote only O.
  Tensor<double> o_ref(short_q.q.shape()), lse_ref({1, 5, 4, 1});
  ReferenceAttention(tail, short_q.q.view(), short_q.k.view(), short_q.v.view(),
                     o_ref.view(), lse_ref.view());
  for (size_t i = 0; i < o_ref.values().size(); ++i) {
    ASSERT_NEAR(tail_result.output.values()[i], o_ref.values()[i],
                2e-5 * (1 + std::fabs(o_ref.values()[i])));
  }

  // A decode step: two new rows appended and attended in the same call.
  AttentionSpec grown = tail;
  grown.kv_len = 213;
  grown.q_len = 2;
  RandomInputs step = MakeRandomInputs(grown, 42);
  CopyView(in.k.view(), step.k.view().Slice(0, 211));
  CopyView(in.v.view(), step.v.view().Slice(0, 211));
  Tensor<float> k_new({1, 2, 2, 64}), v_new({1, 2, 2, 64});
  CopyView(std::as_const(step.k).view().Slice(211, 213), k_new.view());
  CopyView(std::as_const(step.v).view().Slice(211, 213), v_new.view());
  Write(TempPath("q2.npy"), step.q);
  Write(TempPath("k_new.npy"), k_new);
  Write(TempPath("v_new.npy"), v_new);
  ASSERT_TRUE(RunCli({"context", "query", "--target", target, "--name", "ctx",
                      "--q", TempPath("q2.npy"), "--out", TempPath("o2.npy"),
                      "--lse_out", TempPath("lse2.npy"), "--causal", "--k_new",
                      TempPath("k_new.npy"), "--v_new", TempPath("v_new.npy")})
                  .success());
  absl::StatusOr<NpyArray> o2 = ReadNpy(TempPath("o2.npy"));
  absl::StatusOr<NpyArray> lse2 = ReadNpy(TempPath("lse2.npy"));
  ASSERT_TRUE(o2.ok() && lse2.ok());
  AttendResult step_result;
  step_result.output = Tensor<float>(step.q.shape());
  step_result.output.values() = o2->values;
  step_result.lse = lse2->values;
  ExpectMatchesReference(grown, step, step_result);

  // A bad request exits non-zero.
  EXPECT_FALSE(RunCli({"attend", "--target", target, "--q", TempPath("q.npy"),
                       "--k", TempPath("q5.npy"), "--v", TempPath("v.npy"),
                       "--out", TempPath("bad.npy")})
                   .success());
}

std::string TestData(const std::string& name) {
  return absl::StrCat(std::getenv("TEST_SRCDIR"),
                      "/ringattn/tests/testdata/tls/", name);
}

TEST(Cli, InfoOverMutualTlsNeedsTheTokenFile) {
  TestCluster::Options options;
  options.workers = 1;
  options.coordinator_flags = {"--tls_cert=" + TestData("node.pem"),
                               "--tls_key=" + TestData("node.key"),
                               "--tls_ca=" + TestData("ca.pem"),
                               "--auth_token_file=" + TestData("tokens.txt")};
  options.worker_flags = {"--tls_cert=" + TestData("node.pem"),
                          "--tls_key=" + TestData("node.key"),
                          "--coordinator_tls_ca=" + TestData("ca.pem")};
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      ChannelCredentials(
          {TestData("client.pem"), TestData("client.key"), TestData("ca.pem")},
          "--tls");
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  options.client.credentials = *credentials;
  options.client.bearer_token = "test-token-alpha-6a3f9c";
  absl::StatusOr<std::unique_ptr<TestCluster>> cluster =
      TestCluster::Start(std::move(options));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  { std::ofstream(TempPath("token")) << "test-token-alpha-6a3f9c\n"; }
  const std::vector<std::string> tls = {"info",
                                        "--target",
                                        (*cluster)->target(),
                                        "--tls_ca",
                                        TestData("ca.pem"),
                                        "--tls_cert",
                                        TestData("client.pem"),
                                        "--tls_key",
                                        TestData("client.key")};
  std::vector<std::string> with_token = tls;
  with_token.insert(with_token.end(), {"--token_file", TempPath("token")});
  EXPECT_TRUE(RunCli(with_token).success());
  EXPECT_EQ(RunCli(tls).code, 1);  // UNAUTHENTICATED
}

}  // namespace
}  // namespace ringattn
