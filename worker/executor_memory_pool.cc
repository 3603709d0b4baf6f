#include "worker/executor_memory_pool.h"

#include <map>

#include "absl/synchronization/mutex.h"
#include "core/status_macros.h"
#include "worker/device.h"

namespace ringattn {
namespace {

struct Pools {
  absl::Mutex mutex;
  std::map<int, cudaMemPool_t> by_device ABSL_GUARDED_BY(mutex);
};

Pools& AllPools() {
  static Pools* const pools = new Pools;
  return *pools;
}

absl::StatusOr<cudaMemPool_t> MakePool(int device) {
  cudaMemPoolProps props = {};
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypeNone;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  cudaMemPool_t pool = nullptr;
  RINGATTN_RETURN_IF_ERROR(CudaStatus(cudaMemPoolCreate(&pool, &props),
                                      "making the executors' memory pool"));
  uint64_t kept = kExecutorMemoryKeptBytes;
  int no = 0;
  absl::Status set = CudaStatus(
      cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &kept),
      "setting what the executors' memory pool keeps");
  if (set.ok()) {
    set =
        CudaStatus(cudaMemPoolSetAttribute(
                       pool, cudaMemPoolReuseAllowInternalDependencies, &no),
                   "keeping the executors' memory pool from ordering streams");
  }
  if (!set.ok()) {
    cudaMemPoolDestroy(pool);
    return set;
  }
  return pool;
}

}  // namespace

absl::StatusOr<cudaMemPool_t> ExecutorMemoryPool(int device) {
  Pools& pools = AllPools();
  absl::MutexLock lock(&pools.mutex);
  auto found = pools.by_device.find(device);
  if (found != pools.by_device.end()) return found->second;
  absl::StatusOr<cudaMemPool_t> pool = MakePool(device);
  if (pool.ok()) pools.by_device.emplace(device, *pool);
  return pool;
}

absl::StatusOr<DeviceBuffer> AllocateExecutorMemory(int device, size_t bytes,
                                                    cudaStream_t stream) {
  if (bytes < kLeastPooledBytes) return DeviceBuffer::Allocate(bytes);
  absl::StatusOr<cudaMemPool_t> pool = ExecutorMemoryPool(device);
  if (!pool.ok()) return pool.status();
  return DeviceBuffer::AllocateFromPool(bytes, *pool, stream);
}

absl::Status FillExecutorMemoryPool(int device) {
  absl::StatusOr<cudaMemPool_t> pool = ExecutorMemoryPool(device);
  if (!pool.ok()) return pool.status();
  absl::StatusOr<CudaStream> stream = CudaStream::Create();
  if (!stream.ok()) return stream.status();
  {
    absl::StatusOr<DeviceBuffer> kept = DeviceBuffer::AllocateFromPool(
        kExecutorMemoryKeptBytes, *pool, stream->get());
    if (!kept.ok()) return kept.status();
  }
  return CudaStatus(cudaStreamSynchronize(stream->get()),
                    "filling the executors' memory pool");
}

void ReleaseKeptExecutorMemory(int device) {
  Pools& pools = AllPools();
  absl::MutexLock lock(&pools.mutex);
  auto found = pools.by_device.find(device);
  if (found != pools.by_device.end()) cudaMemPoolTrimTo(found->second, 0);
}

}  // namespace ringattn
