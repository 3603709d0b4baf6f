#ifndef RINGATTN_WORKER_EXECUTOR_MEMORY_POOL_H_
#define RINGATTN_WORKER_EXECUTOR_MEMORY_POOL_H_

// The device memory a GPU executor holds for one request, where it needs a
// MiB or more, comes from a CUDA memory pool of its device, which keeps up to
// kExecutorMemoryKeptBytes of it between requests. A request then takes memory
// that earlier ones gave back instead of mapping fresh pages (cudaMalloc of a
// few MiB took 0.2-0.4 ms on an H200 host), and gives it back without waiting
// for the whole device as cudaFree does. The pool reuses memory only once its
// earlier user's work is done, never by making one request's stream wait for
// another's.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/device_buffer.h"

namespace ringattn {

// What the pool of a device keeps between requests at most; more is given
// back to the device when a stream or the device is next waited for.
inline constexpr uint64_t kExecutorMemoryKeptBytes = uint64_t{256} << 20;

// Executors that need less take cudaMalloc's memory instead, as before the
// pool: under a MiB the driver hands out memory it already mapped (0.05-0.07
// ms for a decode step's 33 KB executor), and decode steps ran 0.1 ms slower
// from the pool.
inline constexpr size_t kLeastPooledBytes = size_t{1} << 20;

// The executors' pool of `device`, made on first use; the CUDA error if the
// device has no memory pools. Thread-safe.
absl::StatusOr<cudaMemPool_t> ExecutorMemoryPool(int device);

// `bytes` of device memory for an executor on `device` (the current device)
// that computes on `stream`: from the pool, in the order of `stream`, from
// kLeastPooledBytes on; else from cudaMalloc. Or the CUDA error. Thread-safe.
absl::StatusOr<DeviceBuffer> AllocateExecutorMemory(int device, size_t bytes,
                                                    cudaStream_t stream);

// Makes the pool of `device` (the current device) and has it map what it
// keeps now, at start, rather than in a first request: the first 64-row query
// of a 4M-token context after an H200 worker started took 16-30 ms instead of
// its 9.3. Or the CUDA error.
absl::Status FillExecutorMemoryPool(int device);

// Gives back to `device` what its executors' pool keeps unused (for memory
// that outlives requests, such as a context's, that could not be had). Does
// nothing where no pool was made.
void ReleaseKeptExecutorMemory(int device);

}  // namespace ringattn

#endif  // RINGATTN_WORKER_EXECUTOR_MEMORY_POOL_H_
