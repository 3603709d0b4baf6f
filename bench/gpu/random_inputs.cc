#include "bench/gpu/random_inputs.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "core/dtype.h"

namespace ringattn {

absl::StatusOr<DeviceBuffer> RandomBFloat16(int64_t count, uint64_t seed) {
  return RepeatedRandomBFloat16(count, count, seed);
}

absl::StatusOr<DeviceBuffer> RepeatedRandomBFloat16(int64_t count,
                                                    int64_t distinct,
                                                    uint64_t seed) {
  const int64_t drawn = std::min(count, distinct);
  std::vector<uint16_t> host(static_cast<size_t>(drawn));
  uint64_t state = seed * 0x9e3779b97f4a7c15ull + 1;
  for (uint16_t& x : host) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    const float uniform = static_cast<float>(state >> 40) * 0x1p-24f;
    x = FloatToBFloat16(4.0f * uniform - 2.0f);
  }
  absl::StatusOr<DeviceBuffer> buffer =
      DeviceBuffer::Allocate(count * sizeof(uint16_t));
  if (!buffer.ok()) return buffer;
  uint16_t* data = buffer->as<uint16_t>();
  if (absl::Status s =
          CudaStatus(cudaMemcpy(data, host.data(), drawn * sizeof(uint16_t),
                                cudaMemcpyHostToDevice),
                     "uploading inputs");
      !s.ok()) {
    return s;
  }
  for (int64_t filled = drawn; filled < count;) {
    const int64_t n = std::min(filled, count - filled);
    if (absl::Status s =
            CudaStatus(cudaMemcpy(data + filled, data, n * sizeof(uint16_t),
                                  cudaMemcpyDeviceToDevice),
                       "tiling inputs");
        !s.ok()) {
      return s;
    }
    filled += n;
  }
  return buffer;
}

}  // namespace ringattn
