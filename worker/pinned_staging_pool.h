#ifndef RINGATTN_WORKER_PINNED_STAGING_POOL_H_
#define RINGATTN_WORKER_PINNED_STAGING_POOL_H_

// PinnedStagingPool: page-locked host buffers (cudaHostAlloc) that a CUDA
// worker lends to its requests' host staging, so that a short query's rows
// cross to the device, and its O comes back, as DMA without locking and
// unlocking pages per request. (Locking each request's own staging from
// 1 MiB saved 1.3-1.8 ms of a 256- to 1024-row query on an H200 host, but
// cost more than that under concurrent requests.) Buffers are allocated as
// first needed (with CUDA device `device` current), at most `most_buffers` of
// `buffer_bytes` each, and kept; each goes once the pool and every lease of it
// have. Thread-safe.

#include <cstdint>
#include <memory>
#include <optional>

namespace ringattn {

class PinnedStagingPool {
 public:
  // A lent buffer: `data`, buffer_bytes() long, until the last copy of
  // `keeper` goes, which gives it back.
  struct Lease {
    char* data = nullptr;
    std::shared_ptr<void> keeper;
  };

  PinnedStagingPool(int device, int64_t buffer_bytes, int most_buffers);

  PinnedStagingPool(const PinnedStagingPool&) = delete;
  PinnedStagingPool& operator=(const PinnedStagingPool&) = delete;

  // A buffer for `bytes`, or none (the caller stages in pageable memory):
  // more than buffer_bytes(), every buffer lent, or CUDA could not allocate
  // one (logged; the thread's CUDA error state is left clear).
  std::optional<Lease> Lend(int64_t bytes);

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
