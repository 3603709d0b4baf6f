#ifndef RINGATTN_SERVER_COORDINATOR_OPTIONS_H_
#define RINGATTN_SERVER_COORDINATOR_OPTIONS_H_

// Limits and timeouts of the coordinator, set from its flags.

#include <cstdint>

#include "absl/time/time.h"

namespace ringattn {

struct CoordinatorOptions {
  // Largest Q + K + V upload of one request, in wire bytes.
  int64_t max_request_bytes = int64_t{8} << 30;
  // Wire bytes all requests in flight may hold together; more wait in line.
  int64_t max_inflight_bytes = int64_t{16} << 30;
  // How long workers wait on each other in a ring before giving up.
  absl::Duration ring_timeout = absl::Seconds(60);
  // Output chunks stay under this many bytes.
  int64_t output_chunk_bytes = int64_t{1} << 20;
  // A request that uploads at least this many bytes per worker sends each
  // worker its rows over all of that worker's row channels
  // (Cluster::Member::row_stubs) as well as its Execute stream; a context
  // upload or append sends a worker's part over them when it is this large.
  // A 32 MiB query against a 4M-token context on one H200 took 494 ms over 4
  // streams against 519 over one.
  int64_t row_streams_min_bytes = int64_t{8} << 20;
};

}  // namespace ringattn

#endif  // RINGATTN_SERVER_COORDINATOR_OPTIONS_H_
