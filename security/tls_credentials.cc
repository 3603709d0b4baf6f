#include "security/tls_credentials.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace ringattn {
namespace {

// INVALID_ARGUMENT unless cert and key are given together.
absl::Status CheckCertAndKey(const TlsFiles& files,
                             const std::string& flag_prefix) {
  if (files.cert.empty() != files.key.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag_prefix, "_cert and ", flag_prefix,
                     "_key go together: give both or neither"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> ReadPemFile(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    const int error = errno;
    const std::string message =
        absl::StrCat("cannot read PEM file ", path, ": ", std::strerror(error));
    return error == EACCES ? absl::PermissionDeniedError(message)
                           : absl::NotFoundError(message);
  }
  std::ostringstream contents;
  contents << file.rdbuf();
  if (contents.str().find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is not a PEM file (no '-----BEGIN' line)"));
  }
  return contents.str();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(
    const TlsFiles& files, const std::string& flag_prefix) {
  if (files.empty()) return grpc::InsecureServerCredentials();
  if (absl::Status s = CheckCertAndKey(files, flag_prefix); !s.ok()) return s;
  if (files.cert.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag_prefix, "_ca needs ", flag_prefix, "_cert and ", flag_prefix,
        "_key: a server without a certificate "
        "cannot ask clients for theirs"));
  }
  absl::StatusOr<std::string> cert = ReadPemFile(files.cert);
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPemFile(files.key);
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions options;
  options.pem_key_cert_pairs.push_back({*std::move(key), *std::move(cert)});
  if (!files.ca.empty()) {
    absl::StatusOr<std::string> ca = ReadPemFile(files.ca);
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = *std::move(ca);
    options.client_certificate_request =
        GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentials(
    const TlsFiles& files, const std::string& flag_prefix) {
  if (files.empty()) return grpc::InsecureChannelCredentials();
  if (absl::Status s = CheckCertAndKey(files, flag_prefix); !s.ok()) return s;
  grpc::SslCredentialsOptions options;
  if (!files.ca.empty()) {
    absl::StatusOr<std::string> ca = ReadPemFile(files.ca);
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = *std::move(ca);
  }
  if (!files.cert.empty()) {
    absl::StatusOr<std::string> cert = ReadPemFile(files.cert);
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadPemFile(files.key);
    if (!key.ok()) return key.status();
    options.pem_cert_chain = *std::move(cert);
    options.pem_private_key = *std::move(key);
  }
  return grpc::SslCredentials(options);
}

}  // namespace ringattn
