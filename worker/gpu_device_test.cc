// --device parsing, eager kernel loading, CUDA device lookup and event waits.
// Runs with or without a GPU: without one, opening a device must fail with "no
// CUDA device N: ...".

#include <stdlib.h>

#include "gtest/gtest.h"
#include "kernels/cuda/device_buffer.h"
#include "worker/device.h"

namespace ringattn {
namespace {

TEST(ParseDeviceTest, AcceptsCpuAndCudaIndices) {
  absl::StatusOr<DeviceChoice> cpu = ParseDevice("cpu");
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_FALSE(cpu->is_cuda());
  EXPECT_EQ(cpu->Name(), "cpu");

  absl::StatusOr<DeviceChoice> cuda3 = ParseDevice("cuda:3");
  ASSERT_TRUE(cuda3.ok()) << cuda3.status();
  EXPECT_EQ(cuda3->cuda_index, 3);
  EXPECT_EQ(cuda3->Name(), "cuda:3");

  absl::StatusOr<DeviceChoice> cuda = ParseDevice("cuda");
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  EXPECT_EQ(cuda->cuda_index, 0);
}

TEST(ParseDeviceTest, RejectsOtherForms) {
  for (const char* text : {"gpu", "cuda:", "cuda:-1", "cuda:x", "cuda:1x",
                           "cuda:99999999999", "CPU", ""}) {
    const absl::StatusOr<DeviceChoice> choice = ParseDevice(text);
    EXPECT_EQ(choice.status().code(), absl::StatusCode::kInvalidArgument)
        << text;
  }
}

TEST(LoadKernelsEagerlyTest, SetsEagerLoadingUnlessTheEnvironmentChose) {
  unsetenv("CUDA_MODULE_LOADING");
  LoadKernelsEagerly();
  ASSERT_NE(getenv("CUDA_MODULE_LOADING"), nullptr);
  EXPECT_STREQ(getenv("CUDA_MODULE_LOADING"), "EAGER");
  setenv("CUDA_MODULE_LOADING", "LAZY", 1);
  LoadKernelsEagerly();
  EXPECT_STREQ(getenv("CUDA_MODULE_LOADING"), "LAZY");
  unsetenv("CUDA_MODULE_LOADING");
}

TEST(OpenCudaDeviceTest, MissingDeviceIsNamed) {
  const int count = CudaDeviceCount();
  const absl::StatusOr<CudaDeviceInfo> missing = OpenCudaDevice(count);
  ASSERT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(missing.status().message().rfind(
                "no CUDA device " + std::to_string(count) + ": ", 0),
            0u)
      << missing.status();
}

TEST(OpenCudaDeviceTest, DescribesEveryDevice) {
  const int count = CudaDeviceCount();
  if (count == 0) GTEST_SKIP() << "no CUDA device here; runs on a GPU machine";
  for (int i = 0; i < count; ++i) {
    const absl::StatusOr<CudaDeviceInfo> info = OpenCudaDevice(i);
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->index, i);
    EXPECT_FALSE(info->name.empty());
    EXPECT_GT(info->total_bytes, 0);
    EXPECT_GT(info->free_bytes, 0);
    EXPECT_LE(info->free_bytes, info->total_bytes);
    std::printf("cuda:%d %s, %.1f GiB (%.1f free), sm_%d%d\n", i,
                info->name.c_str(), info->total_bytes / 1073741824.0,
                info->free_bytes / 1073741824.0, info->compute_major,
                info->compute_minor);
  }
}

// Wait polls instead of sleeping; it must still not return before the work
// recorded ahead of the event is done.
TEST(CudaEventTest, WaitReturnsOnlyOnceTheWorkBeforeItIsDone) {
  if (CudaDeviceCount() == 0) {
    GTEST_SKIP() << "no CUDA device here; runs on a GPU machine";
  }
  ASSERT_TRUE(EnterCudaDevice(0).ok());
  absl::StatusOr<CudaStream> stream = CudaStream::Create();
  ASSERT_TRUE(stream.ok()) << stream.status();
  absl::StatusOr<CudaEvent> event = CudaEvent::Create(/*timing=*/true);
  ASSERT_TRUE(event.ok()) << event.status();
  constexpr size_t kBytes = size_t{1} << 30;  // a memset of about 0.3 ms
  absl::StatusOr<DeviceBuffer> buffer = DeviceBuffer::Allocate(kBytes);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  for (int round = 0; round < 3; ++round) {
    ASSERT_EQ(
        cudaMemsetAsync(buffer->as<char>(), round + 1, kBytes, stream->get()),
        cudaSuccess);
    ASSERT_EQ(cudaEventRecord(event->get(), stream->get()), cudaSuccess);
    ASSERT_TRUE(event->Wait("the test's memset").ok());
    EXPECT_EQ(cudaStreamQuery(stream->get()), cudaSuccess)
        << "Wait returned while the memset before the event still ran";
    unsigned char last = 0;
    ASSERT_EQ(cudaMemcpy(&last, buffer->as<char>() + kBytes - 1, 1,
                         cudaMemcpyDeviceToHost),
              cudaSuccess);
    EXPECT_EQ(last, round + 1);
  }
}

}  // namespace
}  // namespace ringattn
