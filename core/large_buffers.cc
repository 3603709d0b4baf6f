#include "core/large_buffers.h"

#include <malloc.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <limits>

namespace ringattn {

void KeepLargeBuffersInTheHeap() {
  mallopt(M_ARENA_MAX, 1);
  mallopt(M_MMAP_THRESHOLD, std::numeric_limits<int>::max());
  mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
}

void DeleteInSteps::operator()(char* data) const {
  release_first.reset();
  // As KeepLargeBuffersInTheHeap's mmap threshold.
  constexpr uintptr_t kLeastBytes = std::numeric_limits<int>::max();
  constexpr uintptr_t kStepBytes = uintptr_t{64} << 20;
  if (data != nullptr && bytes >= kLeastBytes) {
    // Whole pages inside the buffer only: the allocator's own bookkeeping
    // lies just before it.
    const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    const uintptr_t begin =
        (reinterpret_cast<uintptr_t>(data) + page - 1) / page * page;
    const uintptr_t end =
        (reinterpret_cast<uintptr_t>(data) + bytes) / page * page;
    for (uintptr_t at = begin; at < end; at += kStepBytes) {
      madvise(reinterpret_cast<void*>(at), std::min(kStepBytes, end - at),
              MADV_DONTNEED);
    }
  }
  delete[] data;
}

}  // namespace ringattn
