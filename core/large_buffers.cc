#include "core/large_buffers.h"

#include <malloc.h>

namespace ringattn {

void KeepLargeBuffersInTheHeap() {
  mallopt(M_ARENA_MAX, 1);
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

}  // namespace ringattn
