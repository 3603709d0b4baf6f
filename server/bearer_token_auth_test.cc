#include "server/bearer_token_auth.h"

#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace ringattn {
namespace {

BearerTokens TwoTokens() {
  return *BearerTokens::Parse("# ops team\n  alpha-123  \n\nbeta_456==\n",
                              "tokens.txt");
}

TEST(BearerTokensTest, ParseSkipsCommentsAndBlankLinesAndTrims) {
  const BearerTokens tokens = TwoTokens();
  EXPECT_TRUE(tokens.Check("Bearer alpha-123").ok());
  EXPECT_TRUE(tokens.Check("Bearer beta_456==").ok());
  EXPECT_EQ(tokens.Check("Bearer ops").code(),
            absl::StatusCode::kPermissionDenied);
}

TEST(BearerTokensTest, BadLineIsNamedWithoutRevealingIt) {
  const absl::StatusOr<BearerTokens> tokens =
      BearerTokens::Parse("good\nsecret with spaces\n", "tokens.txt");
  ASSERT_EQ(tokens.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(tokens.status().message(), "tokens.txt line 2"))
      << tokens.status();
  EXPECT_FALSE(absl::StrContains(tokens.status().message(), "secret"))
      << tokens.status();
}

TEST(BearerTokensTest, FileWithoutTokensIsRefused) {
  const absl::StatusOr<BearerTokens> tokens =
      BearerTokens::Parse("# nothing yet\n\n", "tokens.txt");
  EXPECT_EQ(tokens.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(tokens.status().message(), "holds no token"))
      << tokens.status();
}

TEST(BearerTokensTest, UnreadableFileIsNotFound) {
  EXPECT_EQ(BearerTokens::FromFile("/nonexistent/tokens.txt").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(BearerTokensTest, MissingAuthorizationIsUnauthenticated) {
  const absl::Status status = TwoTokens().Check(std::nullopt);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(absl::StrContains(status.message(), "requires a bearer token"))
      << status;
}

TEST(BearerTokensTest, MalformedAuthorizationIsUnauthenticated) {
  for (const char* value : {"", "alpha-123", "Basic alpha-123", "Bearer",
                            "Bearer ", "Bearer alpha 123", "Bearer ="}) {
    const absl::Status status = TwoTokens().Check(value);
    EXPECT_EQ(status.code(), absl::StatusCode::kUnauthenticated) << value;
    EXPECT_TRUE(
        absl::StrContains(status.message(), "expected 'Bearer <token>'"))
        << value << ": " << status;
  }
}

TEST(BearerTokensTest, UnknownTokenIsPermissionDenied) {
  // Prefixes, extensions and near misses of accepted tokens included.
  for (const char* value :
       {"Bearer alpha-12", "Bearer alpha-1234", "Bearer alpha-124",
        "Bearer beta_456", "Bearer ALPHA-123"}) {
    EXPECT_EQ(TwoTokens().Check(value).code(),
              absl::StatusCode::kPermissionDenied)
        << value;
  }
}

TEST(BearerTokensTest, SchemeIsCaseInsensitive) {
  EXPECT_TRUE(TwoTokens().Check("bearer alpha-123").ok());
  EXPECT_TRUE(TwoTokens().Check("BEARER alpha-123").ok());
}

// Runs the processor on a call of `path` (none when empty) with
// `authorization` metadata (none when empty).
struct Processed {
  grpc::Status status;
  grpc::AuthMetadataProcessor::OutputMetadata consumed;
};
Processed Process(const std::string& path, const std::string& authorization) {
  BearerTokenProcessor processor(TwoTokens());
  grpc::AuthMetadataProcessor::InputMetadata metadata;
  if (!path.empty()) metadata.insert({":path", path});
  if (!authorization.empty()) {
    metadata.insert({"authorization", authorization});
  }
  Processed processed;
  grpc::AuthMetadataProcessor::OutputMetadata response;
  processed.status =
      processor.Process(metadata, nullptr, &processed.consumed, &response);
  return processed;
}

TEST(BearerTokenProcessorTest, ChecksEveryAttentionMethod) {
  for (const char* method : {"Attend", "Query", "QueryOnce", "CreateContext",
                             "GetClusterInfo", "ListContexts"}) {
    const std::string path = std::string("/ringattn.v1.Attention/") + method;
    EXPECT_EQ(Process(path, "").status.error_code(),
              grpc::StatusCode::UNAUTHENTICATED)
        << method;
    EXPECT_EQ(Process(path, "Bearer wrong").status.error_code(),
              grpc::StatusCode::PERMISSION_DENIED)
        << method;
    EXPECT_TRUE(Process(path, "Bearer alpha-123").status.ok()) << method;
  }
}

TEST(BearerTokenProcessorTest, HealthAndCoordinationStayOpen) {
  EXPECT_TRUE(Process("/grpc.health.v1.Health/Check", "").status.ok());
  EXPECT_TRUE(Process("/grpc.health.v1.Health/Watch", "").status.ok());
  EXPECT_TRUE(Process("/ringattn.v1.Coordination/Register", "").status.ok());
}

TEST(BearerTokenProcessorTest, CallWithoutMethodNameIsChecked) {
  EXPECT_EQ(Process("", "").status.error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
}

TEST(BearerTokenProcessorTest, AcceptedTokenIsConsumed) {
  const Processed processed =
      Process("/ringattn.v1.Attention/Attend", "Bearer beta_456==");
  ASSERT_TRUE(processed.status.ok());
  EXPECT_EQ(processed.consumed.count("authorization"), 1u);
}

}  // namespace
}  // namespace ringattn
