#ifndef RINGATTN_KERNELS_CUDA_DEVICE_BUFFER_H_
#define RINGATTN_KERNELS_CUDA_DEVICE_BUFFER_H_

// DeviceBuffer: device memory owned by one object, freed when it goes away:
// by cudaFree, or, taken from a CUDA memory pool in a stream's order, given
// back to the pool in that stream's order (which waits for nothing). Move-only;
// not safe to use from several threads at once.

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace ringattn {

// OK for cudaSuccess; otherwise INTERNAL naming `what` and CUDA's own words.
inline absl::Status CudaStatus(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorName(error),
                                          " (", cudaGetErrorString(error),
                                          ")"));
}

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() {
    if (data_ == nullptr) return;
    if (stream_ != nullptr) {
      cudaFreeAsync(data_, stream_);
    } else {
      cudaFree(data_);
    }
  }
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)),
        bytes_(std::exchange(other.bytes_, 0)),
        stream_(std::exchange(other.stream_, nullptr)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(bytes_, other.bytes_);
    std::swap(stream_, other.stream_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // `bytes` of device memory on the current device, or the CUDA error.
  static absl::StatusOr<DeviceBuffer> Allocate(size_t bytes) {
    DeviceBuffer buffer;
    if (absl::Status s =
            CudaStatus(cudaMalloc(&buffer.data_, bytes), "cudaMalloc");
        !s.ok()) {
      return s;
    }
    buffer.bytes_ = bytes;
    return buffer;
  }

  // `bytes` of `pool`'s memory, taken in the order of `stream` and usable on
  // any stream once this returns (it waits for `stream`); given back in the
  // order of `stream`, which must outlive the buffer. Or the CUDA error.
  static absl::StatusOr<DeviceBuffer> AllocateFromPool(size_t bytes,
                                                       cudaMemPool_t pool,
                                                       cudaStream_t stream) {
    DeviceBuffer buffer;
    if (absl::Status s = CudaStatus(
            cudaMallocFromPoolAsync(&buffer.data_, bytes, pool, stream),
            "cudaMallocFromPoolAsync");
        !s.ok()) {
      return s;
    }
    buffer.bytes_ = bytes;
    buffer.stream_ = stream;
    if (absl::Status s = CudaStatus(cudaStreamSynchronize(stream),
                                    "waiting for pool memory");
        !s.ok()) {
      return s;
    }
    return buffer;
  }

  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  cudaStream_t stream_ = nullptr;  // set: the pool's, given back on it
};

}  // namespace ringattn

#endif  // RINGATTN_KERNELS_CUDA_DEVICE_BUFFER_H_
