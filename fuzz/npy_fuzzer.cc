// Fuzzes ReadNpy (client/npy.h) with arbitrary file contents. The bytes go to
// an in-memory file that ReadNpy opens by its /proc path, so the reader runs
// unchanged. Invariant: an accepted array holds exactly the values its shape
// promises, and no more than the file could carry.

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "client/npy.h"

namespace {

int MemoryFile() {
  static const int fd = memfd_create("npy_fuzzer", 0);
  if (fd < 0) __builtin_trap();
  return fd;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int fd = MemoryFile();
  if (ftruncate(fd, 0) != 0 ||
      pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)) {
    __builtin_trap();
  }
  const absl::StatusOr<ringattn::NpyArray> array =
      ringattn::ReadNpy("/proc/self/fd/" + std::to_string(fd));
  if (!array.ok()) {
    if (array.status().message().empty()) __builtin_trap();
    return 0;
  }
  size_t count = 1;
  for (int64_t dim : array->shape) count *= static_cast<size_t>(dim);
  // Every value takes at least two bytes of the file (float16).
  if (count != array->values.size() || 2 * count > size) __builtin_trap();
  return 0;
}
