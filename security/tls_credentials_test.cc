#include "security/tls_credentials.h"

#include <cstdlib>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace ringattn {
namespace {

std::string TestData(const std::string& name) {
  return absl::StrCat(std::getenv("TEST_SRCDIR"),
                      "/ringattn/tests/testdata/tls/", name);
}

TEST(TlsCredentialsTest, NoFilesMeansPlaintext) {
  EXPECT_TRUE(ServerCredentials({}, "--tls").ok());
  EXPECT_TRUE(ChannelCredentials({}, "--tls").ok());
}

TEST(TlsCredentialsTest, CertificateAndKeyFromFilesGiveTls) {
  const TlsFiles files{TestData("node.pem"), TestData("node.key"),
                       TestData("ca.pem")};
  EXPECT_TRUE(ServerCredentials(files, "--tls").ok());
  EXPECT_TRUE(ChannelCredentials(files, "--tls").ok());
  EXPECT_TRUE(ChannelCredentials({"", "", TestData("ca.pem")}, "--tls").ok());
}

TEST(TlsCredentialsTest, CertificateWithoutKeyNamesBothFlags) {
  const TlsFiles files{TestData("node.pem"), "", ""};
  for (const absl::Status& status :
       {ServerCredentials(files, "--worker_tls").status(),
        ChannelCredentials(files, "--worker_tls").status()}) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(status.message(),
                                  "--worker_tls_cert and "
                                  "--worker_tls_key go together"))
        << status;
  }
}

TEST(TlsCredentialsTest, ServerCaWithoutCertificateIsRefused) {
  const absl::Status status =
      ServerCredentials({"", "", TestData("ca.pem")}, "--tls").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(status.message(), "--tls_ca needs --tls_cert"))
      << status;
}

TEST(TlsCredentialsTest, MissingFileIsNotFoundNamingIt) {
  const std::string missing = TestData("no-such.pem");
  const absl::Status status =
      ServerCredentials({missing, TestData("node.key"), ""}, "--tls").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(status.message(), missing)) << status;
}

TEST(TlsCredentialsTest, FileThatIsNotPemIsInvalid) {
  const absl::Status status = ReadPemFile(TestData("tokens.txt")).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(status.message(), "is not a PEM file"))
      << status;
}

}  // namespace
}  // namespace ringattn
