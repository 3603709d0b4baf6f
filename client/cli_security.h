#ifndef RINGATTN_CLIENT_CLI_SECURITY_H_
#define RINGATTN_CLIENT_CLI_SECURITY_H_

// How the `ringattn` CLI's --token_file and --tls_* flags become the bearer
// token and channel credentials of its Client. Thread-safe.

#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/client.h"
#include "client/flags.h"

namespace ringattn {

// The names of the valued flags ApplySecurityFlags reads.
const std::set<std::string>& SecurityFlagNames();

// The bearer token in the file at `path`: its one line, surrounding
// whitespace trimmed. INVALID_ARGUMENT naming the file (never its contents)
// when it is empty or holds more than one word; NOT_FOUND when unreadable.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

// Sets `options` from `flags`: the bearer token of --token_file, and TLS when
// any of --tls_ca (the CA that verifies the server; the system's roots when
// absent), --tls_cert and --tls_key (the client's certificate for mutual TLS,
// both or neither) is given. Leaves plaintext without a token otherwise.
absl::Status ApplySecurityFlags(const Flags& flags, ClientOptions* options);

}  // namespace ringattn

#endif  // RINGATTN_CLIENT_CLI_SECURITY_H_
