#ifndef RINGATTN_CORE_LARGE_BUFFERS_H_
#define RINGATTN_CORE_LARGE_BUFFERS_H_

// Process-wide malloc tuning for programs that move tensors through gRPC.
// glibc maps every allocation above its mmap threshold afresh and unmaps it on
// free, so each multi-MiB message buffer costs page faults and zeroed pages:
// at a few GB/s that was a fifth of the coordinator's CPU time.

namespace ringattn {

// Serves allocations up to 256 MiB from the heap and keeps freed heap memory
// for reuse. Call once, early in main.
void KeepLargeBuffersInTheHeap();

}  // namespace ringattn

#endif  // RINGATTN_CORE_LARGE_BUFFERS_H_
