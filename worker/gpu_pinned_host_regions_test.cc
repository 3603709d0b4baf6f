#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <memory>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "kernels/cuda/device_buffer.h"
#include "worker/gpu_test_skip.h"
#include "worker/pinned_host_regions.h"

namespace ringattn {
namespace {

bool IsPinned(const void* pointer) {
  cudaPointerAttributes attributes;
  const cudaError_t error = cudaPointerGetAttributes(&attributes, pointer);
  cudaGetLastError();
  return error == cudaSuccess && attributes.type == cudaMemoryTypeHost;
}

TEST(PinnedHostRegionsTest, PinsForCopiesAndUnpinsWhenDestroyed) {
  SKIP_WITHOUT_GPUS(1);
  constexpr size_t kBytes = (size_t{8} << 20) + 123;
  std::unique_ptr<char[]> host(new char[kBytes + 7]);
  char* data = host.get() + 7;  // not page-aligned
  for (size_t i = 0; i < kBytes; ++i) data[i] = static_cast<char>(i * 31 + 5);
  {
    PinnedHostRegions pinned(0);
    ASSERT_TRUE(pinned.Pin({data, kBytes}).ok());
    EXPECT_EQ(pinned.pinned_bytes(), static_cast<int64_t>(kBytes));
    EXPECT_TRUE(IsPinned(data));
    // A region that overlaps a pinned one stays pageable, and says so.
    const absl::Status again = pinned.Pin({data + 4096, 4096});
    EXPECT_EQ(again.code(), absl::StatusCode::kInternal) << again;
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
    EXPECT_EQ(pinned.pinned_bytes(), static_cast<int64_t>(kBytes));

    // Copies to the device and back through the pinned region.
    absl::StatusOr<DeviceBuffer> device = DeviceBuffer::Allocate(kBytes);
    ASSERT_TRUE(device.ok()) << device.status();
    cudaStream_t stream = nullptr;
    ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(device->as<char>(), data, kBytes,
                              cudaMemcpyHostToDevice, stream),
              cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    std::memset(data, 0, kBytes);
    ASSERT_EQ(cudaMemcpyAsync(data, device->as<char>(), kBytes,
                              cudaMemcpyDeviceToHost, stream),
              cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    ASSERT_EQ(cudaStreamDestroy(stream), cudaSuccess);
    for (size_t i = 0; i < kBytes; ++i) {
      ASSERT_EQ(data[i], static_cast<char>(i * 31 + 5)) << i;
    }
  }
  EXPECT_FALSE(IsPinned(data));
}

}  // namespace
}  // namespace ringattn
