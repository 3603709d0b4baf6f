#include "server/bearer_token_auth.h"

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "proto/grpc_status.h"

namespace ringattn {
namespace {

constexpr absl::string_view kAttentionMethodPrefix = "/ringattn.v1.Attention/";
constexpr absl::string_view kScheme = "Bearer ";

// RFC 6750's b64token: 1*( ALPHA / DIGIT / "-" / "." / "_" / "~" / "+" / "/" )
// *"=".
bool IsToken(absl::string_view text) {
  size_t end = text.size();
  while (end > 0 && text[end - 1] == '=') --end;
  if (end == 0) return false;
  for (char c : text.substr(0, end)) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) &&
        absl::string_view("-._~+/").find(c) == absl::string_view::npos) {
      return false;
    }
  }
  return true;
}

// Whether `candidate` equals `secret` (not empty), in a time that depends on
// the candidate's length only: every byte is compared whatever the result.
bool ConstantTimeEquals(absl::string_view candidate, absl::string_view secret) {
  unsigned char difference = candidate.size() != secret.size();
  for (size_t i = 0; i < candidate.size(); ++i) {
    difference |= static_cast<unsigned char>(candidate[i]) ^
                  static_cast<unsigned char>(secret[i % secret.size()]);
  }
  return difference == 0;
}

}  // namespace

absl::StatusOr<BearerTokens> BearerTokens::Parse(absl::string_view text,
                                                 absl::string_view source) {
  std::vector<std::string> tokens;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    if (!IsToken(line)) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, " line ", line_number,
          ": not a bearer token (one token per line, made of letters, digits "
          "and -._~+/ with '=' padding at the end)"));
    }
    tokens.emplace_back(line);
  }
  if (tokens.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source,
                     " holds no token: put one token per line (lines starting "
                     "with # are comments)"));
  }
  return BearerTokens(std::move(tokens));
}

absl::StatusOr<BearerTokens> BearerTokens::FromFile(const std::string& path) {
  std::ifstream file(path);
  if (!file) {
    return absl::NotFoundError(
        absl::StrCat("cannot read the token file ", path));
  }
  std::ostringstream text;
  text << file.rdbuf();
  return Parse(text.str(), path);
}

absl::Status BearerTokens::Check(
    std::optional<absl::string_view> authorization) const {
  if (!authorization.has_value()) {
    return absl::UnauthenticatedError(
        "this server requires a bearer token: send 'authorization: Bearer "
        "<token>' metadata (ringattn --token_file FILE, "
        "ringattn.Client(token=...))");
  }
  const absl::string_view value = *authorization;
  if (value.size() <= kScheme.size() ||
      !absl::EqualsIgnoreCase(value.substr(0, kScheme.size()), kScheme) ||
      !IsToken(value.substr(kScheme.size()))) {
    return absl::UnauthenticatedError(
        "malformed 'authorization' metadata: expected 'Bearer <token>'");
  }
  const absl::string_view candidate = value.substr(kScheme.size());
  bool accepted = false;
  for (const std::string& token : tokens_) {
    accepted |= ConstantTimeEquals(candidate, token);
  }
  if (!accepted) {
    return absl::PermissionDeniedError(
        "the bearer token is not one this server accepts; check it against "
        "the tokens in the server's --auth_token_file");
  }
  return absl::OkStatus();
}

grpc::Status BearerTokenProcessor::Process(
    const InputMetadata& auth_metadata, grpc::AuthContext* /*context*/,
    OutputMetadata* consumed_auth_metadata,
    OutputMetadata* /*response_metadata*/) {
  // A call without a method name is checked too.
  const auto path = auth_metadata.find(":path");
  if (path != auth_metadata.end() &&
      !absl::StartsWith(
          absl::string_view(path->second.data(), path->second.size()),
          kAttentionMethodPrefix)) {
    return grpc::Status::OK;
  }
  std::optional<absl::string_view> authorization;
  const auto found = auth_metadata.find("authorization");
  if (found != auth_metadata.end()) {
    authorization.emplace(found->second.data(), found->second.size());
  }
  const absl::Status status = tokens_.Check(authorization);
  if (status.ok() && found != auth_metadata.end()) {
    consumed_auth_metadata->insert(
        {std::string(found->first.data(), found->first.size()),
         std::string(found->second.data(), found->second.size())});
  }
  return ToGrpcStatus(status);
}

}  // namespace ringattn
