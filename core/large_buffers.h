#ifndef RINGATTN_CORE_LARGE_BUFFERS_H_
#define RINGATTN_CORE_LARGE_BUFFERS_H_

// Process-wide malloc tuning for programs that move tensors through gRPC.
// glibc maps every allocation above its mmap threshold afresh and unmaps it on
// free, so each multi-MiB message buffer costs page faults and zeroed pages:
// at a few GB/s that was a fifth of the coordinator's CPU time. Threads other
// than the first allocate from arenas of at most 64 MiB each, so a larger
// buffer made there (a CPU worker's executor is made on a gRPC thread) was
// mapped afresh whatever the threshold: half of a decode step against a 64K
// context on CPU workers went to faulting in and clearing its K/V copy.

#include <cstddef>
#include <memory>

namespace ringattn {

// Serves allocations up to 2 GiB from the heap, from one arena for all
// threads, and keeps up to 2 GiB of freed heap memory for reuse (a CPU
// worker's K/V copy of a 64K-token context on one worker is 537 MB, fresh
// pages cost it 200 ms a query). Call once, early in main, before any thread
// starts.
void KeepLargeBuffersInTheHeap();

// Deletes a buffer made by `new char[bytes]`, after dropping
// `release_first` (what must end while the buffer is still mapped: a page
// lock on it, say). One too large for the heap (over 2 GiB), which deleting
// unmaps, is first handed back to the kernel in 64 MiB steps
// (MADV_DONTNEED): unmapping tens of GB in one call holds the process's
// memory map for a second or more, and the page faults and mappings of every
// other thread (gRPC's among them) wait behind it.
struct DeleteInSteps {
  size_t bytes = 0;
  mutable std::shared_ptr<void> release_first;
  void operator()(char* data) const;
};

}  // namespace ringattn

#endif  // RINGATTN_CORE_LARGE_BUFFERS_H_
