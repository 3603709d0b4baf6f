#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "kernels/cuda/device_buffer.h"
#include "worker/device.h"
#include "worker/executor_memory_pool.h"
#include "worker/gpu_test_skip.h"

namespace ringattn {
namespace {

// GPU 0's executors' pool and a stream to take its memory on.
class ExecutorMemoryPoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPUS(1);
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    absl::StatusOr<cudaMemPool_t> pool = ExecutorMemoryPool(0);
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = *pool;
    absl::StatusOr<CudaStream> stream = CudaStream::Create();
    ASSERT_TRUE(stream.ok()) << stream.status();
    stream_ = *std::move(stream);
  }

  // The pool's bytes of `attribute` (reserved or used, current or high).
  uint64_t PoolBytes(cudaMemPoolAttr attribute) const {
    uint64_t bytes = 0;
    EXPECT_EQ(cudaMemPoolGetAttribute(pool_, attribute, &bytes), cudaSuccess);
    return bytes;
  }
  uint64_t Reserved() const {
    return PoolBytes(cudaMemPoolAttrReservedMemCurrent);
  }
  uint64_t Used() const { return PoolBytes(cudaMemPoolAttrUsedMemCurrent); }

  cudaMemPool_t pool_ = nullptr;
  CudaStream stream_;
};

TEST_F(ExecutorMemoryPoolTest, IsOnePoolPerDevice) {
  absl::StatusOr<cudaMemPool_t> again = ExecutorMemoryPool(0);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, pool_);
}

TEST_F(ExecutorMemoryPoolTest, AnotherStreamTakesBackWhatOneGaveBack) {
  constexpr size_t kBytes = size_t{24} << 20;
  void* given_back = nullptr;
  uint64_t reserved = 0;
  {
    absl::StatusOr<DeviceBuffer> buffer =
        DeviceBuffer::AllocateFromPool(kBytes, pool_, stream_.get());
    ASSERT_TRUE(buffer.ok()) << buffer.status();
    ASSERT_EQ(cudaMemsetAsync(buffer->as<char>(), 1, kBytes, stream_.get()),
              cudaSuccess);
    given_back = buffer->as<void>();
    reserved = Reserved();
    EXPECT_GE(reserved, kBytes);
  }
  // The buffer went back in the stream's order, once its work was done.
  ASSERT_EQ(cudaStreamSynchronize(stream_.get()), cudaSuccess);
  absl::StatusOr<CudaStream> other = CudaStream::Create();
  ASSERT_TRUE(other.ok()) << other.status();
  absl::StatusOr<DeviceBuffer> again =
      DeviceBuffer::AllocateFromPool(kBytes, pool_, other->get());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->as<void>(), given_back);
  EXPECT_EQ(Reserved(), reserved);
}

TEST_F(ExecutorMemoryPoolTest, OnlyExecutorsOfAMebibyteOrMoreTakeThePool) {
  const uint64_t before = Used();
  absl::StatusOr<DeviceBuffer> small =
      AllocateExecutorMemory(0, kLeastPooledBytes - 1, stream_.get());
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ(Used(), before);
  absl::StatusOr<DeviceBuffer> large =
      AllocateExecutorMemory(0, kLeastPooledBytes, stream_.get());
  ASSERT_TRUE(large.ok()) << large.status();
  EXPECT_GE(Used(), before + kLeastPooledBytes);
  // Both are usable at once, on any stream.
  ASSERT_EQ(cudaMemset(small->as<char>(), 1, kLeastPooledBytes - 1),
            cudaSuccess);
  ASSERT_EQ(cudaMemset(large->as<char>(), 2, kLeastPooledBytes), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

TEST_F(ExecutorMemoryPoolTest, FilledPoolServesRequestsFromWhatItMapped) {
  ASSERT_TRUE(FillExecutorMemoryPool(0).ok());
  const uint64_t reserved = Reserved();
  EXPECT_GE(reserved, kExecutorMemoryKeptBytes);
  {
    absl::StatusOr<DeviceBuffer> first =
        AllocateExecutorMemory(0, kExecutorMemoryKeptBytes / 2, stream_.get());
    ASSERT_TRUE(first.ok()) << first.status();
    absl::StatusOr<DeviceBuffer> second =
        AllocateExecutorMemory(0, size_t{3} << 20, stream_.get());
    ASSERT_TRUE(second.ok()) << second.status();
    EXPECT_EQ(Reserved(), reserved);
  }
  ASSERT_EQ(cudaStreamSynchronize(stream_.get()), cudaSuccess);
  EXPECT_EQ(Reserved(), reserved);
}

TEST_F(ExecutorMemoryPoolTest, KeepsNoMoreThanItsShareOnceWaitedFor) {
  constexpr size_t kLarge = 4 * kExecutorMemoryKeptBytes;
  {
    absl::StatusOr<DeviceBuffer> large =
        DeviceBuffer::AllocateFromPool(kLarge, pool_, stream_.get());
    ASSERT_TRUE(large.ok()) << large.status();
    EXPECT_GE(Reserved(), kLarge);
  }
  ASSERT_EQ(cudaStreamSynchronize(stream_.get()), cudaSuccess);
  EXPECT_LE(Reserved(), kExecutorMemoryKeptBytes);

  {
    absl::StatusOr<DeviceBuffer> small =
        DeviceBuffer::AllocateFromPool(size_t{8} << 20, pool_, stream_.get());
    ASSERT_TRUE(small.ok()) << small.status();
  }
  ASSERT_EQ(cudaStreamSynchronize(stream_.get()), cudaSuccess);
  ReleaseKeptExecutorMemory(0);
  EXPECT_EQ(Reserved(), 0u);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

}  // namespace
}  // namespace ringattn
