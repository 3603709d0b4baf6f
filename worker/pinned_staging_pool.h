#ifndef RINGATTN_WORKER_PINNED_STAGING_POOL_H_
#define RINGATTN_WORKER_PINNED_STAGING_POOL_H_

// PinnedStagingPool: page-locked host buffers (cudaHostAlloc) that a CUDA
// worker lends to its requests' host staging, so that a short query's rows
// cross to the device, and its O comes back, as DMA without locking and
// unlocking pages per request. (Locking each request's own staging from
// 1 MiB saved 1.3-1.8 ms of a 256- to 1024-row query on an H200 host, but
// cost more than that under concurrent requests.) Buffers are allocated as
// first needed or all at once by Fill (with CUDA device `device` current), at
// most `most_buffers` of `buffer_bytes` each, and kept; each goes once the pool
// and every lease of it have. Thread-safe.

#include <cstdint>
#include <memory>

namespace ringattn {

class PinnedStagingPool {
 public:
  PinnedStagingPool(int device, int64_t buffer_bytes, int most_buffers);

  PinnedStagingPool(const PinnedStagingPool&) = delete;
  PinnedStagingPool& operator=(const PinnedStagingPool&) = delete;

  // A buffer of buffer_bytes() for `bytes`, given back once the last copy of
  // the pointer goes; null (the caller stages in pageable memory) for more
  // than buffer_bytes(), with every buffer lent, or where CUDA could not
  // allocate one (logged; the thread's CUDA error state is left clear).
  std::shared_ptr<char> Lend(int64_t bytes);

  // Allocates now the buffers not yet allocated (or lent), rather than in the
  // requests that first need them; returns how many are allocated.
  int Fill();

  int64_t buffer_bytes() const;
  // Buffers allocated so far, and of them lent now.
  int allocated() const;
  int lent() const;

 private:
  class Buffers;
  std::shared_ptr<Buffers> buffers_;
};

}  // namespace ringattn

#endif  // RINGATTN_WORKER_PINNED_STAGING_POOL_H_
