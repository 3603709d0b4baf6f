// End to end with real processes on loopback: TLS and mutual TLS on the
// coordinator's port and between the coordinator and its workers, and
// bearer tokens on the public API, with the checked-in test certificates of
// tests/testdata/tls.

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "client/child_process.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "security/tls_credentials.h"
#include "tests/attention_checks.h"
#include "tests/test_cluster.h"

namespace ringattn {
namespace {

std::string Runfile(const std::string& path) {
  return absl::StrCat(std::getenv("TEST_SRCDIR"), "/ringattn/", path);
}

std::string TestData(const std::string& name) {
  return Runfile(absl::StrCat("tests/testdata/tls/", name));
}

std::shared_ptr<grpc::ChannelCredentials> Credentials(const TlsFiles& files) {
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      ChannelCredentials(files, "--tls");
  EXPECT_TRUE(credentials.ok()) << credentials.status();
  return credentials.ok() ? *credentials : nullptr;
}

// A client that trusts the test CA, with the test client certificate.
ClientOptions MutualTlsClient() {
  ClientOptions options;
  options.credentials = Credentials(
      {TestData("client.pem"), TestData("client.key"), TestData("ca.pem")});
  return options;
}

// A client that trusts the test CA and has no certificate of its own.
ClientOptions TlsClient() {
  ClientOptions options;
  options.credentials = Credentials({"", "", TestData("ca.pem")});
  return options;
}

// Every call fails fast: a refused handshake shows at once, not at a deadline.
ClientOptions WithDeadline(ClientOptions options) {
  options.deadline = absl::Seconds(10);
  return options;
}

AttentionSpec SmallSpec() {
  AttentionSpec spec;
  spec.q_len = spec.kv_len = 97;
  spec.q_heads = 4;
  spec.kv_heads = 2;
  spec.head_dim = 32;
  spec.causal = true;
  return spec;
}

void ExpectAttendMatchesReference(Client& client) {
  const AttentionSpec spec = SmallSpec();
  const RandomInputs in = MakeRandomInputs(spec, /*seed=*/7);
  absl::StatusOr<AttendResult> result =
      client.Attend(RequestSpec(spec), in.q.view(), in.k.view(), in.v.view());
  ASSERT_TRUE(result.ok()) << result.status();
  ExpectMatchesReference(spec, in, *result);
}

// grpc.health.v1.Health/Check for the whole server over `credentials`: the
// serialized HealthCheckResponse, or the call's status.
absl::StatusOr<std::string> HealthCheck(
    const std::string& target,
    std::shared_ptr<grpc::ChannelCredentials> credentials) {
  grpc::GenericStub stub(grpc::CreateChannel(target, credentials));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  grpc::Slice empty_request("");
  const grpc::ByteBuffer request(&empty_request, 1);
  grpc::ByteBuffer response;
  grpc::Status status;
  absl::Notification done;
  stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(),
                 &request, &response, [&](grpc::Status s) {
                   status = std::move(s);
                   done.Notify();
                 });
  done.WaitForNotification();
  if (!status.ok()) return absl::UnavailableError(status.error_message());
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) return absl::InternalError("no response");
  std::string bytes;
  for (const grpc::Slice& slice : slices) {
    bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  return bytes;
}

// HealthCheckResponse{status: SERVING}: field 1, varint 1.
const std::string kServing("\x08\x01", 2);

// HealthCheck until it answers SERVING, for at most 5 s: the coordinator
// passes readiness on to the health service every 250 ms, so SERVING may
// follow the cluster's readiness by that much. The last answer.
absl::StatusOr<std::string> HealthOnceServing(
    const std::string& target,
    std::shared_ptr<grpc::ChannelCredentials> credentials) {
  const absl::Time give_up = absl::Now() + absl::Seconds(5);
  for (;;) {
    absl::StatusOr<std::string> health = HealthCheck(target, credentials);
    if (!health.ok() || *health == kServing || absl::Now() >= give_up) {
      return health;
    }
  }
}

// Coordinator and workers on mutual TLS everywhere: the public port requires
// client certificates, the coordinator calls workers over mutual TLS, and
// workers register over TLS presenting their certificates.
class MutualTlsCluster : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    TestCluster::Options options;
    options.workers = 2;
    options.coordinator_flags = {"--tls_cert=" + TestData("node.pem"),
                                 "--tls_key=" + TestData("node.key"),
                                 "--tls_ca=" + TestData("ca.pem"),
                                 "--worker_tls_cert=" + TestData("node.pem"),
                                 "--worker_tls_key=" + TestData("node.key"),
                                 "--worker_tls_ca=" + TestData("ca.pem")};
    options.worker_flags = {"--tls_cert=" + TestData("node.pem"),
                            "--tls_key=" + TestData("node.key"),
                            "--tls_ca=" + TestData("ca.pem"),
                            "--coordinator_tls_ca=" + TestData("ca.pem")};
    options.client = MutualTlsClient();
    absl::StatusOr<std::unique_ptr<TestCluster>> cluster =
        TestCluster::Start(std::move(options));
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = cluster->release();
  }
  static void TearDownTestSuite() { delete cluster_; }

  static TestCluster* cluster_;
};

TestCluster* MutualTlsCluster::cluster_ = nullptr;

TEST_F(MutualTlsCluster, RequestOverMutualTlsMatchesReference) {
  std::unique_ptr<Client> client =
      cluster_->NewClient(WithDeadline(MutualTlsClient()));
  ExpectAttendMatchesReference(*client);
}

TEST_F(MutualTlsCluster, PlaintextClientIsUnavailable) {
  std::unique_ptr<Client> client = cluster_->NewClient(WithDeadline({}));
  EXPECT_EQ(client->GetClusterInfo().status().code(),
            absl::StatusCode::kUnavailable);
}

TEST_F(MutualTlsCluster, ClientWithoutCertificateIsUnavailable) {
  std::unique_ptr<Client> client =
      cluster_->NewClient(WithDeadline(TlsClient()));
  EXPECT_EQ(client->GetClusterInfo().status().code(),
            absl::StatusCode::kUnavailable);
}

TEST_F(MutualTlsCluster, HealthServiceAnswersOverMutualTls) {
  absl::StatusOr<std::string> health =
      HealthOnceServing(cluster_->target(), MutualTlsClient().credentials);
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_EQ(*health, kServing);
}

// A coordinator with TLS (no client certificates) and bearer tokens; its
// workers register over TLS and serve plaintext.
class TokenProtectedCluster : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    TestCluster::Options options;
    options.workers = 2;
    options.coordinator_flags = {"--tls_cert=" + TestData("node.pem"),
                                 "--tls_key=" + TestData("node.key"),
                                 "--auth_token_file=" + TestData("tokens.txt")};
    options.worker_flags = {"--coordinator_tls_ca=" + TestData("ca.pem")};
    options.client = TlsClient();
    options.client.bearer_token = kToken;
    absl::StatusOr<std::unique_ptr<TestCluster>> cluster =
        TestCluster::Start(std::move(options));
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = cluster->release();
  }
  static void TearDownTestSuite() { delete cluster_; }

  static std::unique_ptr<Client> NewClient(std::optional<std::string> token) {
    ClientOptions options = WithDeadline(TlsClient());
    options.bearer_token = std::move(token);
    return cluster_->NewClient(std::move(options));
  }

  // The second token of tests/testdata/tls/tokens.txt.
  static constexpr char kToken[] = "test-token-beta-0d71e2";
  static TestCluster* cluster_;
};

TestCluster* TokenProtectedCluster::cluster_ = nullptr;

TEST_F(TokenProtectedCluster, CallWithoutTokenIsUnauthenticated) {
  const absl::Status status =
      NewClient(std::nullopt)->GetClusterInfo().status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnauthenticated) << status;
  EXPECT_NE(status.message().find("requires a bearer token"),
            absl::string_view::npos)
      << status;
}

TEST_F(TokenProtectedCluster, CallWithUnknownTokenIsPermissionDenied) {
  const absl::Status status =
      NewClient("test-token-gamma")->ListContexts().status();
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied) << status;
}

TEST_F(TokenProtectedCluster, StreamingCallWithoutTokenIsUnauthenticated) {
  const AttentionSpec spec = SmallSpec();
  const RandomInputs in = MakeRandomInputs(spec, /*seed=*/3);
  const absl::Status status =
      NewClient(std::nullopt)
          ->Attend(RequestSpec(spec), in.q.view(), in.k.view(), in.v.view())
          .status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnauthenticated) << status;
}

TEST_F(TokenProtectedCluster, CallWithAcceptedTokenMatchesReference) {
  ExpectAttendMatchesReference(*NewClient(kToken));
}

TEST_F(TokenProtectedCluster, HealthCheckNeedsNoToken) {
  absl::StatusOr<std::string> health =
      HealthOnceServing(cluster_->target(), TlsClient().credentials);
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_EQ(*health, kServing);
}

// Workers that require client certificates, and a coordinator that verifies
// them but has no certificate of its own to present.
TEST(WorkerMutualTls, CoordinatorWithoutCertificateCannotCallWorkers) {
  TestCluster::Options options;
  options.workers = 2;
  options.coordinator_flags = {"--worker_tls_ca=" + TestData("ca.pem")};
  options.worker_flags = {"--tls_cert=" + TestData("node.pem"),
                          "--tls_key=" + TestData("node.key"),
                          "--tls_ca=" + TestData("ca.pem")};
  absl::StatusOr<std::unique_ptr<TestCluster>> cluster =
      TestCluster::Start(std::move(options));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const AttentionSpec spec = SmallSpec();
  const RandomInputs in = MakeRandomInputs(spec, /*seed=*/5);
  const absl::Status status =
      (*cluster)
          ->NewClient(WithDeadline({}))
          ->Attend(RequestSpec(spec), in.q.view(), in.k.view(), in.v.view())
          .status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
}

TEST(CoordinatorFlags, BearerTokensWithoutTlsAreRefusedAtStart) {
  absl::StatusOr<ChildProcess> coordinator =
      ChildProcess::Spawn(Runfile("server/ringattn-coordinator"),
                          {"--world_size=1", "--port=0", "--http_port=0",
                           "--auth_token_file=" + TestData("tokens.txt")});
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  const std::optional<ExitStatus> exit =
      coordinator->WaitUntil(absl::Now() + absl::Seconds(30));
  ASSERT_TRUE(exit.has_value()) << "the coordinator kept running";
  EXPECT_EQ(exit->code, 2) << exit->ToString();
}

}  // namespace
}  // namespace ringattn
