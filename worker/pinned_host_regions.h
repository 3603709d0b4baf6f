#ifndef RINGATTN_WORKER_PINNED_HOST_REGIONS_H_
#define RINGATTN_WORKER_PINNED_HOST_REGIONS_H_

// PinnedHostRegions: page-locks host buffers for CUDA (cudaHostRegister), so
// that copies between them and the device run as DMA at the link's rate
// instead of through the driver's own staging (a 1M-token shard took 2 s to
// cross from pageable memory), and unlocks them when it goes. A region is
// locked in pieces of kPinnedPieceBytes from its start: one call for a whole
// 17 GB shard held the process's memory map so long that its gRPC threads
// stalled past the coordinator's keepalive. A copy stays within one piece to
// run as DMA. A region it cannot lock (one that shares a page with a locked
// one, say) stays pageable from there on: copies still work, only slower.
// Thread-safe.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"

namespace ringattn {

inline constexpr size_t kPinnedPieceBytes = size_t{256} << 20;

class PinnedHostRegions {
 public:
  // Regions are locked for CUDA device `device`'s copies.
  explicit PinnedHostRegions(int device) : device_(device) {}
  // Unlocks every region it locked; they must still be allocated.
  ~PinnedHostRegions();

  PinnedHostRegions(const PinnedHostRegions&) = delete;
  PinnedHostRegions& operator=(const PinnedHostRegions&) = delete;

  // Locks `region`, piece by piece; the CUDA error (INTERNAL) if it cannot
  // lock a piece, which leaves the rest pageable and the calling thread's
  // CUDA error state clear.
  absl::Status Pin(absl::Span<char> region);

  int64_t pinned_bytes() const;

 private:
  const int device_;
  mutable absl::Mutex mutex_;
  std::vector<void*> pinned_ ABSL_GUARDED_BY(mutex_);
  int64_t bytes_ ABSL_GUARDED_BY(mutex_) = 0;
};

// Copies `bytes` between the host and the device (`kind` says which way) in
// parts that each lie within one kPinnedPieceBytes piece of the host end's
// region, counted from the region's start (`host_offset`: where the host end
// begins in it), so that each runs as DMA where PinnedHostRegions locked the
// region, and none spans two locks (CUDA refuses such a copy). The first
// error, naming `what`.
absl::Status CopyInPinnedPieces(void* to, const void* from, size_t bytes,
                                size_t host_offset, cudaMemcpyKind kind,
                                cudaStream_t stream, const char* what);

}  // namespace ringattn

#endif  // RINGATTN_WORKER_PINNED_HOST_REGIONS_H_
