#ifndef RINGATTN_WORKER_EXECUTOR_MEMORY_H_
#define RINGATTN_WORKER_EXECUTOR_MEMORY_H_

// How the executors count the memory one rank of a request needs and get it:
// counts are made in double and saturate below the int64_t range, and a
// count that saturated, or host memory that cannot be had, is
// RESOURCE_EXHAUSTED rather than an overflow or a crash.

#include <algorithm>
#include <cstdint>
#include <memory>
#include <new>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace ringattn {

// Where byte counts saturate: below the largest int64_t.
inline constexpr double kMostExecutorBytes = 9.0e18;

// `bytes` (counted in double) as int64_t, at most kMostExecutorBytes.
inline int64_t SaturatedBytes(double bytes) {
  return static_cast<int64_t>(std::min(bytes, kMostExecutorBytes));
}

// OK unless `bytes` saturated: RESOURCE_EXHAUSTED saying that rank `rank` of
// `world_size` cannot hold `what` (e.g. "its share") of so large a request.
inline absl::Status CheckExecutorBytes(int64_t bytes, int rank, int world_size,
                                       absl::string_view what) {
  if (bytes < kMostExecutorBytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(
      absl::StrCat("rank ", rank, " of ", world_size, " cannot hold ", what,
                   " of a request this large"));
}

// The executor `make()` allocates (about `bytes` of host memory), or
// RESOURCE_EXHAUSTED if that memory cannot be had.
template <typename Executor, typename Make>
absl::StatusOr<std::unique_ptr<Executor>> AllocateExecutor(int64_t bytes,
                                                           int rank,
                                                           Make make) {
  try {
    return std::unique_ptr<Executor>(make());
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate the ", bytes, " bytes rank ", rank,
                     " needs for this request"));
  }
}

}  // namespace ringattn

#endif  // RINGATTN_WORKER_EXECUTOR_MEMORY_H_
