#include "client/cli_security.h"

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "security/tls_credentials.h"

namespace ringattn {

const std::set<std::string>& SecurityFlagNames() {
  static const std::set<std::string>* const names =
      new std::set<std::string>{"token_file", "tls_ca", "tls_cert", "tls_key"};
  return *names;
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  std::ifstream file(path);
  if (!file) {
    return absl::NotFoundError(absl::StrCat("cannot read --token_file ", path));
  }
  std::ostringstream contents;
  contents << file.rdbuf();
  const std::string token(absl::StripAsciiWhitespace(contents.str()));
  if (token.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--token_file ", path, " is empty"));
  }
  for (char c : token) {
    if (absl::ascii_isspace(static_cast<unsigned char>(c))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--token_file ", path, " must hold one token on one line"));
    }
  }
  return token;
}

absl::Status ApplySecurityFlags(const Flags& flags, ClientOptions* options) {
  if (std::optional<std::string> path = flags.Get("token_file")) {
    absl::StatusOr<std::string> token = ReadTokenFile(*path);
    if (!token.ok()) return token.status();
    options->bearer_token = *std::move(token);
  }
  const TlsFiles files{flags.Get("tls_cert").value_or(""),
                       flags.Get("tls_key").value_or(""),
                       flags.Get("tls_ca").value_or("")};
  if (files.empty()) return absl::OkStatus();
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      ChannelCredentials(files, "--tls");
  if (!credentials.ok()) return credentials.status();
  options->credentials = *std::move(credentials);
  return absl::OkStatus();
}

}  // namespace ringattn
