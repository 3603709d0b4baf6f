#include "worker/gpu_partial_reduction.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "kernels/cuda/merge_with_lse.h"
#include "worker/device.h"

namespace ringattn {

absl::StatusOr<std::unique_ptr<DevicePartials>> DevicePartials::Create(
    int device, float* o, float* lse, int64_t rows, int64_t dim,
    cudaStream_t stream) {
  if (rows < 1 || dim < 1) {
    return absl::InvalidArgumentError(
        "a device partial needs at least one row of at least one value");
  }
  return std::unique_ptr<DevicePartials>(
      new DevicePartials(device, o, lse, rows, dim, stream));
}

DevicePartials::DevicePartials(int device, float* o, float* lse, int64_t rows,
                               int64_t dim, cudaStream_t stream)
    : device_(device),
      o_(o),
      lse_(lse),
      rows_(rows),
      dim_(dim),
      stream_(stream) {}

absl::Status DevicePartials::MakeReceiveRoom() {
  if (received_.bytes() > 0) return absl::OkStatus();
  RINGATTN_RETURN_IF_ERROR(UseCudaDevice(device_));
  absl::StatusOr<DeviceBuffer> received = DeviceBuffer::Allocate(
      static_cast<size_t>(rows_ * (dim_ + 1)) * sizeof(float));
  if (!received.ok()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot allocate room for a received partial on cuda:", device_, " (",
        received.status().message(), ")"));
  }
  received_ = *std::move(received);
  return absl::OkStatus();
}

int64_t DevicePartials::o_bytes() const {
  return rows_ * dim_ * static_cast<int64_t>(sizeof(float));
}

int64_t DevicePartials::lse_bytes() const {
  return rows_ * static_cast<int64_t>(sizeof(float));
}

absl::Status DevicePartials::MergeReceived() {
  if (absl::Status entered = UseCudaDevice(device_); !entered.ok()) {
    return entered;
  }
  if (absl::Status launched =
          CudaStatus(LaunchMergeWithLse(o_, lse_, received_.as<float>(),
                                        received_.as<float>() + rows_ * dim_,
                                        rows_, dim_, stream_),
                     "merging a received partial");
      !launched.ok()) {
    return launched;
  }
  return CudaStatus(cudaStreamSynchronize(stream_),
                    "waiting for the partial merge");
}

}  // namespace ringattn
