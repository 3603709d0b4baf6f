#include "core/large_buffers.h"

#include <malloc.h>

#include <limits>

namespace ringattn {

void KeepLargeBuffersInTheHeap() {
  mallopt(M_ARENA_MAX, 1);
  mallopt(M_MMAP_THRESHOLD, std::numeric_limits<int>::max());
  mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
}

}  // namespace ringattn
