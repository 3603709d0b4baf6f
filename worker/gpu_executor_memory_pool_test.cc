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

// The pool's bytes of `attribute` (reserved or used, current or high).
uint64_t PoolBytes(cudaMemPool_t pool, cudaMemPoolAttr attribute) {
  uint64_t bytes = 0;
  EXPECT_EQ(cudaMemPoolGetAttribute(pool, attribute, &bytes), cudaSuccess);
  return bytes;
}

uint64_t Reserved(cudaMemPool_t pool) {
  return PoolBytes(pool, cudaMemPoolAttrReservedMemCurrent);
}

uint64_t Used(cudaMemPool_t pool) {
  return PoolBytes(pool, cudaMemPoolAttrUsedMemCurrent);
}

TEST(ExecutorMemoryPoolTest, IsOnePoolPerDevice) {
  SKIP_WITHOUT_GPUS(1);
  absl::StatusOr<cudaMemPool_t> first = ExecutorMemoryPool(0);
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<cudaMemPool_t> again = ExecutorMemoryPool(0);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*first, *again);
}

TEST(ExecutorMemoryPoolTest, AnotherStreamTakesBackWhatOneGaveBack) {
  SKIP_WITHOUT_GPUS(1);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  absl::StatusOr<cudaMemPool_t> pool = ExecutorMemoryPool(0);
  ASSERT_TRUE(pool.ok()) << pool.status();
  constexpr size_t kBytes = size_t{24} << 20;
  void* given_back = nullptr;
  uint64_t reserved = 0;
  {
    absl::StatusOr<CudaStream> stream = CudaStream::Create();
    ASSERT_TRUE(stream.ok()) << stream.status();
    absl::StatusOr<DeviceBuffer> buffer =
        DeviceBuffer::AllocateFromPool(kBytes, *pool, stream->get());
    ASSERT_TRUE(buffer.ok()) << buffer.status();
    ASSERT_EQ(cudaMemsetAsync(buffer->as<char>(), 1, kBytes, stream->get()),
              cudaSuccess);
    given_back = buffer->as<void>();
    reserved = Reserved(*pool);
    EXPECT_GE(reserved, kBytes);
    // The buffer goes back in the stream's order, then the stream goes.
    *buffer = DeviceBuffer();
    ASSERT_EQ(cudaStreamSynchronize(stream->get()), cudaSuccess);
  }
  absl::StatusOr<CudaStream> other = CudaStream::Create();
  ASSERT_TRUE(other.ok()) << other.status();
  absl::StatusOr<DeviceBuffer> again =
      DeviceBuffer::AllocateFromPool(kBytes, *pool, other->get());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->as<void>(), given_back);
  EXPECT_EQ(Reserved(*pool), reserved);
}

TEST(ExecutorMemoryPoolTest, OnlyExecutorsOfAMebibyteOrMoreTakeThePool) {
  SKIP_WITHOUT_GPUS(1);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  absl::StatusOr<cudaMemPool_t> pool = ExecutorMemoryPool(0);
  ASSERT_TRUE(pool.ok()) << pool.status();
  absl::StatusOr<CudaStream> stream = CudaStream::Create();
  ASSERT_TRUE(stream.ok()) << stream.status();
  const uint64_t before = Used(*pool);
  absl::StatusOr<DeviceBuffer> small =
      AllocateExecutorMemory(0, kLeastPooledBytes - 1, stream->get());
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ(Used(*pool), before);
  absl::StatusOr<DeviceBuffer> large =
      AllocateExecutorMemory(0, kLeastPooledBytes, stream->get());
  ASSERT_TRUE(large.ok()) << large.status();
  EXPECT_GE(Used(*pool), before + kLeastPooledBytes);
  // Both are usable at once, on any stream.
  ASSERT_EQ(cudaMemset(small->as<char>(), 1, kLeastPooledBytes - 1),
            cudaSuccess);
  ASSERT_EQ(cudaMemset(large->as<char>(), 2, kLeastPooledBytes), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

TEST(ExecutorMemoryPoolTest, KeepsNoMoreThanItsShareOnceWaitedFor) {
  SKIP_WITHOUT_GPUS(1);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  absl::StatusOr<cudaMemPool_t> pool = ExecutorMemoryPool(0);
  ASSERT_TRUE(pool.ok()) << pool.status();
  absl::StatusOr<CudaStream> stream = CudaStream::Create();
  ASSERT_TRUE(stream.ok()) << stream.status();
  constexpr size_t kLarge = 4 * kExecutorMemoryKeptBytes;
  {
    absl::StatusOr<DeviceBuffer> large =
        DeviceBuffer::AllocateFromPool(kLarge, *pool, stream->get());
    ASSERT_TRUE(large.ok()) << large.status();
    EXPECT_GE(Reserved(*pool), kLarge);
  }
  ASSERT_EQ(cudaStreamSynchronize(stream->get()), cudaSuccess);
  EXPECT_LE(Reserved(*pool), kExecutorMemoryKeptBytes);

  {
    absl::StatusOr<DeviceBuffer> small =
        DeviceBuffer::AllocateFromPool(size_t{8} << 20, *pool, stream->get());
    ASSERT_TRUE(small.ok()) << small.status();
  }
  ASSERT_EQ(cudaStreamSynchronize(stream->get()), cudaSuccess);
  ReleaseKeptExecutorMemory(0);
  EXPECT_EQ(Reserved(*pool), 0u);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

}  // namespace
}  // namespace ringattn
