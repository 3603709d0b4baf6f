#ifndef RINGATTN_WORKER_GPU_PARTIAL_REDUCTION_H_
#define RINGATTN_WORKER_GPU_PARTIAL_REDUCTION_H_

// DevicePartials: a broadcast-Q partial in device memory for the tree of
// partial_reduction.h over an NCCL communicator. Received partials land in
// device scratch and fold into the partial with the GPU merge kernel
// (kernels/cuda/merge_with_lse.h), so the reduction never leaves the device.

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "kernels/cuda/device_buffer.h"
#include "worker/partial_reduction.h"

namespace ringattn {

// Thread-compatible; not copyable.
class DevicePartials final : public PartialBuffers {
 public:
  // Reduces `rows` rows of `dim` fp32 values at `o` and `rows` fp32 LSE
  // values at `lse` (contiguous, on CUDA device `device`) in place, merging
  // on `stream`; they must outlive this. INVALID_ARGUMENT for non-positive
  // sizes.
  static absl::StatusOr<std::unique_ptr<DevicePartials>> Create(
      int device, float* o, float* lse, int64_t rows, int64_t dim,
      cudaStream_t stream);

  DevicePartials(const DevicePartials&) = delete;
  DevicePartials& operator=(const DevicePartials&) = delete;

  void* o() override { return o_; }
  void* lse() override { return lse_; }
  // Allocates device scratch for one received partial (RESOURCE_EXHAUSTED
  // if it cannot be had).
  absl::Status MakeReceiveRoom() override;
  void* received_o() override { return received_.as<float>(); }
  void* received_lse() override { return received_.as<float>() + rows_ * dim_; }
  int64_t o_bytes() const override;
  int64_t lse_bytes() const override;
  // Launches the merge and waits for it on the stream, so that a send on the
  // communicator's stream reads the merged values.
  absl::Status MergeReceived() override;

 private:
  DevicePartials(int device, float* o, float* lse, int64_t rows, int64_t dim,
                 cudaStream_t stream);

  const int device_;
  float* const o_;
  float* const lse_;
  const int64_t rows_;
  const int64_t dim_;
  const cudaStream_t stream_;
  DeviceBuffer received_;  // [rows x dim O | rows LSE], fp32; empty until
                           // MakeReceiveRoom
};

}  // namespace ringattn

#endif  // RINGATTN_WORKER_GPU_PARTIAL_REDUCTION_H_
