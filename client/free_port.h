#ifndef RINGATTN_CLIENT_FREE_PORT_H_
#define RINGATTN_CLIENT_FREE_PORT_H_

// FreePort: a TCP port on 127.0.0.1 that nobody listens on right now, for
// starting a local coordinator where the caller must name its port before it
// starts (the test cluster, the load runner). Another process may take it
// before the caller binds it; a caller that can pass port 0 should.

#include "absl/status/statusor.h"

namespace ringattn {

// The kernel's pick for an ephemeral bind to 127.0.0.1, released at once.
// INTERNAL if no socket can be bound.
absl::StatusOr<int> FreePort();

}  // namespace ringattn

#endif  // RINGATTN_CLIENT_FREE_PORT_H_
