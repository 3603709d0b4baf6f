#ifndef RINGATTN_SERVER_BEARER_TOKEN_AUTH_H_
#define RINGATTN_SERVER_BEARER_TOKEN_AUTH_H_

// Bearer-token authentication of the public API: the coordinator accepts a
// call of the Attention service only with "authorization: Bearer <token>"
// metadata naming one of the tokens of its --auth_token_file. Other services
// on the same port (gRPC health for probes, the workers' Coordination) are not
// checked. Tokens are compared in constant time.

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/security/auth_metadata_processor.h"

namespace ringattn {

// The set of tokens a server accepts. Immutable; thread-safe.
class BearerTokens {
 public:
  // Tokens from `text`, one per line: surrounding whitespace is trimmed,
  // blank lines and lines starting with '#' are skipped. A token is made of
  // letters, digits and -._~+/ with '=' padding at its end (RFC 6750).
  // INVALID_ARGUMENT naming `source` and the line (never the token) for a bad
  // token or for no token at all.
  static absl::StatusOr<BearerTokens> Parse(absl::string_view text,
                                            absl::string_view source);
  // Tokens from the file at `path`, as Parse; NOT_FOUND if it is unreadable.
  static absl::StatusOr<BearerTokens> FromFile(const std::string& path);

  // Whether the value of the "authorization" metadata (nullopt when absent)
  // carries an accepted token: UNAUTHENTICATED when it is absent or not
  // "Bearer <token>", PERMISSION_DENIED for a token not in the set.
  absl::Status Check(std::optional<absl::string_view> authorization) const;

 private:
  explicit BearerTokens(std::vector<std::string> tokens)
      : tokens_(std::move(tokens)) {}

  std::vector<std::string> tokens_;
};

// Applies BearerTokens to every call of the Attention service on a port with
// TLS credentials (gRPC runs auth metadata processors only there).
class BearerTokenProcessor final : public grpc::AuthMetadataProcessor {
 public:
  explicit BearerTokenProcessor(BearerTokens tokens)
      : tokens_(std::move(tokens)) {}

  // The check is quick: it runs on gRPC's network thread.
  bool IsBlocking() const override { return false; }

  grpc::Status Process(const InputMetadata& auth_metadata,
                       grpc::AuthContext* context,
                       OutputMetadata* consumed_auth_metadata,
                       OutputMetadata* response_metadata) override;

 private:
  const BearerTokens tokens_;
};

}  // namespace ringattn

#endif  // RINGATTN_SERVER_BEARER_TOKEN_AUTH_H_
