#include "client/cli_security.h"

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace ringattn {
namespace {

std::string TestData(const std::string& name) {
  return absl::StrCat(std::getenv("TEST_SRCDIR"),
                      "/ringattn/tests/testdata/tls/", name);
}

// A file under the test's temporary folder holding `contents`.
std::string TempFile(const std::string& name, const std::string& contents) {
  const std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
  std::ofstream(path) << contents;
  return path;
}

absl::Status Apply(const std::vector<std::string>& args,
                   ClientOptions* options) {
  absl::StatusOr<Flags> flags = Flags::Parse(args, SecurityFlagNames(), {});
  if (!flags.ok()) return flags.status();
  return ApplySecurityFlags(*flags, options);
}

TEST(CliSecurityTest, NoFlagsLeavePlaintextWithoutToken) {
  ClientOptions options;
  ASSERT_TRUE(Apply({}, &options).ok());
  EXPECT_FALSE(options.bearer_token.has_value());
  EXPECT_EQ(options.credentials, nullptr);
}

TEST(CliSecurityTest, TokenFileGivesTheTrimmedToken) {
  ClientOptions options;
  ASSERT_TRUE(
      Apply({"--token_file", TempFile("token", "  abc-123\n")}, &options).ok());
  EXPECT_EQ(options.bearer_token, "abc-123");
}

TEST(CliSecurityTest, TokenFileWithTwoWordsIsRefusedWithoutEchoingThem) {
  const std::string path = TempFile("two", "secret-one\nsecret-two\n");
  const absl::StatusOr<std::string> token = ReadTokenFile(path);
  EXPECT_EQ(token.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(token.status().message(), path));
  EXPECT_FALSE(absl::StrContains(token.status().message(), "secret"));
}

TEST(CliSecurityTest, EmptyOrMissingTokenFileIsAnError) {
  EXPECT_EQ(ReadTokenFile(TempFile("empty", "\n")).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadTokenFile("/nonexistent/token").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(CliSecurityTest, TlsFlagsGiveCredentials) {
  ClientOptions options;
  ASSERT_TRUE(
      Apply({"--tls_ca", TestData("ca.pem"), "--tls_cert",
             TestData("client.pem"), "--tls_key", TestData("client.key")},
            &options)
          .ok());
  EXPECT_NE(options.credentials, nullptr);
}

TEST(CliSecurityTest, CertificateWithoutKeyIsInvalid) {
  ClientOptions options;
  const absl::Status status =
      Apply({"--tls_cert", TestData("client.pem")}, &options);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "--tls_key")) << status;
}

}  // namespace
}  // namespace ringattn
