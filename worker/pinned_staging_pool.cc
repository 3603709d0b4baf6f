#include "worker/pinned_staging_pool.h"

#include <cuda_runtime.h>

#include <memory>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "spdlog/spdlog.h"

namespace ringattn {

// The buffers themselves, shared by the pool and its leases.
class PinnedStagingPool::Buffers {
 public:
  Buffers(int device, int64_t buffer_bytes, int most_buffers)
      : device_(device),
        buffer_bytes_(buffer_bytes),
        most_buffers_(most_buffers) {}

  ~Buffers() {
    for (char* buffer : free_) {
      if (const cudaError_t error = cudaFreeHost(buffer);
          error != cudaSuccess) {
        cudaGetLastError();
        spdlog::warn("cudaFreeHost: {}", cudaGetErrorString(error));
      }
    }
  }

  // A free buffer, or a new one while fewer than most_buffers_ exist.
  char* Take() {
    {
      absl::MutexLock lock(&mutex_);
      if (!free_.empty()) {
        char* buffer = free_.back();
        free_.pop_back();
        ++lent_;
        return buffer;
      }
      if (allocated_ >= most_buffers_) return nullptr;
      // Counted before it exists, so that racing lenders stay within bound.
      ++allocated_;
      ++lent_;
    }
    void* buffer = nullptr;
    cudaError_t error = cudaSetDevice(device_);
    if (error == cudaSuccess) {
      error = cudaHostAlloc(&buffer, static_cast<size_t>(buffer_bytes_),
                            cudaHostAllocPortable);
    }
    if (error != cudaSuccess) {
      cudaGetLastError();
      spdlog::warn("page-locked staging of {} bytes not allocated: {}",
                   buffer_bytes_, cudaGetErrorString(error));
      absl::MutexLock lock(&mutex_);
      --allocated_;
      --lent_;
      return nullptr;
    }
    return static_cast<char*>(buffer);
  }

  void Give(char* buffer) {
    absl::MutexLock lock(&mutex_);
    free_.push_back(buffer);
    --lent_;
  }

  int64_t buffer_bytes() const { return buffer_bytes_; }
  int allocated() const {
    absl::MutexLock lock(&mutex_);
    return allocated_;
  }
  int lent() const {
    absl::MutexLock lock(&mutex_);
    return lent_;
  }

 private:
  const int device_;
  const int64_t buffer_bytes_;
  const int most_buffers_;
  mutable absl::Mutex mutex_;
  std::vector<char*> free_ ABSL_GUARDED_BY(mutex_);
  int allocated_ ABSL_GUARDED_BY(mutex_) = 0;
  int lent_ ABSL_GUARDED_BY(mutex_) = 0;
};

PinnedStagingPool::PinnedStagingPool(int device, int64_t buffer_bytes,
                                     int most_buffers)
    : buffers_(std::make_shared<Buffers>(device, buffer_bytes, most_buffers)) {}

std::shared_ptr<char> PinnedStagingPool::Lend(int64_t bytes) {
  if (bytes > buffers_->buffer_bytes()) return nullptr;
  char* buffer = buffers_->Take();
  if (buffer == nullptr) return nullptr;
  return std::shared_ptr<char>(
      buffer, [buffers = buffers_](char* lent) { buffers->Give(lent); });
}

int PinnedStagingPool::Fill() {
  std::vector<std::shared_ptr<char>> leases;
  while (std::shared_ptr<char> lease = Lend(0)) {
    leases.push_back(std::move(lease));
  }
  return allocated();
}

int64_t PinnedStagingPool::buffer_bytes() const {
  return buffers_->buffer_bytes();
}
int PinnedStagingPool::allocated() const { return buffers_->allocated(); }
int PinnedStagingPool::lent() const { return buffers_->lent(); }

}  // namespace ringattn
