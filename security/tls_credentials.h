#ifndef RINGATTN_SECURITY_TLS_CREDENTIALS_H_
#define RINGATTN_SECURITY_TLS_CREDENTIALS_H_

// gRPC credentials for a listening port or a channel, made from the paths of
// PEM files given on a command line: plaintext when no path is given, TLS with
// a certificate and key, mutual TLS with a CA to verify the other side's
// certificate against.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"

namespace ringattn {

// Paths of PEM files; an empty path is "not given".
struct TlsFiles {
  std::string cert;  // certificate chain
  std::string key;   // private key of the certificate
  std::string ca;    // CA bundle that verifies the other side

  bool empty() const { return cert.empty() && key.empty() && ca.empty(); }
};

// The contents of the file at `path`; NOT_FOUND or PERMISSION_DENIED naming it.
absl::StatusOr<std::string> ReadPemFile(const std::string& path);

// Credentials of a listening port. No file: plaintext. `cert` and `key`: TLS.
// With `ca` as well: every client must present a certificate that `ca`
// verifies (mutual TLS). INVALID_ARGUMENT naming `flag_prefix`'s flags
// ("--tls" names --tls_cert, --tls_key, --tls_ca) for cert without key or the
// reverse, or ca without them; the error of ReadPemFile for unreadable files.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(
    const TlsFiles& files, const std::string& flag_prefix);

// Credentials of a channel. No file: plaintext. Otherwise TLS, verifying the
// server against `ca` (the system's roots when empty) and presenting `cert`
// and `key` (both or neither) as the client's certificate for mutual TLS.
// Errors as for ServerCredentials.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentials(
    const TlsFiles& files, const std::string& flag_prefix);

}  // namespace ringattn

#endif  // RINGATTN_SECURITY_TLS_CREDENTIALS_H_
