#ifndef RINGATTN_CLIENT_NPY_H_
#define RINGATTN_CLIENT_NPY_H_

// Reading and writing NumPy .npy files (format versions 1.0, 2.0 and 3.0) of
// float32 and float16 arrays in C order, the form in which the `ringattn` CLI
// takes its inputs and writes its outputs. Reads widen float16 to float32;
// writes are always little-endian float32 ('<f4'). All functions are
// thread-safe as long as no two calls touch the same file.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace ringattn {

// An n-dimensional float32 array in C (row-major) order. `shape` may be empty
// (a scalar: one value); values.size() is the product of `shape`.
struct NpyArray {
  std::vector<int64_t> shape;
  std::vector<float> values;
};

// The array stored in the .npy file at `path`. The file must hold dtype '<f4'
// or '<f2' in C order. On failure: NOT_FOUND if the file cannot be opened,
// INVALID_ARGUMENT for anything else (bad magic, malformed header, unsupported
// dtype or byte order, Fortran order, truncated or oversized data), with a
// message naming the file and the problem.
absl::StatusOr<NpyArray> ReadNpy(const std::string& path);

// Writes `values` as a '<f4' C-order array of `shape` to `path`, replacing any
// file there. INVALID_ARGUMENT if the product of `shape` is not values.size()
// or a dimension is negative; INTERNAL naming the file if it cannot be
// written.
absl::Status WriteNpy(const std::string& path, absl::Span<const int64_t> shape,
                      absl::Span<const float> values);

}  // namespace ringattn

#endif  // RINGATTN_CLIENT_NPY_H_
