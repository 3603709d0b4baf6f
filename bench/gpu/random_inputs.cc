#include "bench/gpu/random_inputs.h"

#include <cuda_runtime.h>

#include <vector>

#include "core/dtype.h"

namespace ringattn {

absl::StatusOr<DeviceBuffer> RandomBFloat16(int64_t count, uint64_t seed) {
  std::vector<uint16_t> host(static_cast<size_t>(count));
  uint64_t state = seed * 0x9e3779b97f4a7c15ull + 1;
  for (uint16_t& x : host) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    const float uniform = static_cast<float>(state >> 40) * 0x1p-24f;
    x = FloatToBFloat16(4.0f * uniform - 2.0f);
  }
  absl::StatusOr<DeviceBuffer> buffer =
      DeviceBuffer::Allocate(host.size() * sizeof(uint16_t));
  if (!buffer.ok()) return buffer;
  if (absl::Status s = CudaStatus(
          cudaMemcpy(buffer->as<void>(), host.data(),
                     host.size() * sizeof(uint16_t), cudaMemcpyHostToDevice),
          "uploading inputs");
      !s.ok()) {
    return s;
  }
  return buffer;
}

}  // namespace ringattn
