#include "worker/pinned_host_regions.h"

#include <cuda_runtime.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "kernels/cuda/device_buffer.h"
#include "spdlog/spdlog.h"

namespace ringattn {

PinnedHostRegions::~PinnedHostRegions() {
  absl::MutexLock lock(&mutex_);
  for (void* piece : pinned_) {
    if (const cudaError_t error = cudaHostUnregister(piece);
        error != cudaSuccess) {
      cudaGetLastError();
      spdlog::warn("cudaHostUnregister: {}", cudaGetErrorString(error));
    }
  }
}

absl::Status PinnedHostRegions::Pin(absl::Span<char> region) {
  if (region.empty()) return absl::OkStatus();
  if (const cudaError_t error = cudaSetDevice(device_); error != cudaSuccess) {
    cudaGetLastError();
    return absl::InternalError(
        absl::StrCat("cudaSetDevice: ", cudaGetErrorString(error)));
  }
  for (size_t at = 0; at < region.size(); at += kPinnedPieceBytes) {
    const size_t bytes = std::min(kPinnedPieceBytes, region.size() - at);
    if (const cudaError_t error = cudaHostRegister(region.data() + at, bytes,
                                                   cudaHostRegisterDefault);
        error != cudaSuccess) {
      cudaGetLastError();
      return absl::InternalError(
          absl::StrCat("page-locking ", bytes,
                       " bytes of host memory: ", cudaGetErrorString(error)));
    }
    absl::MutexLock lock(&mutex_);
    pinned_.push_back(region.data() + at);
    bytes_ += static_cast<int64_t>(bytes);
  }
  return absl::OkStatus();
}

int64_t PinnedHostRegions::pinned_bytes() const {
  absl::MutexLock lock(&mutex_);
  return bytes_;
}

absl::Status CopyInPinnedPieces(void* to, const void* from, size_t bytes,
                                size_t host_offset, cudaMemcpyKind kind,
                                cudaStream_t stream, const char* what) {
  for (size_t at = 0; at < bytes;) {
    const size_t offset = host_offset + at;
    const size_t part =
        std::min(bytes - at,
                 (offset / kPinnedPieceBytes + 1) * kPinnedPieceBytes - offset);
    RINGATTN_RETURN_IF_ERROR(
        CudaStatus(cudaMemcpyAsync(static_cast<char*>(to) + at,
                                   static_cast<const char*>(from) + at, part,
                                   kind, stream),
                   what));
    at += part;
  }
  return absl::OkStatus();
}

}  // namespace ringattn
