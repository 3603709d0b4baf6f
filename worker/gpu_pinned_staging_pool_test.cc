#include <cuda_runtime.h>

#include <cstring>
#include <memory>

#include "gtest/gtest.h"
#include "worker/gpu_test_skip.h"
#include "worker/pinned_staging_pool.h"

namespace ringattn {
namespace {

bool IsPageLocked(const void* pointer) {
  cudaPointerAttributes attributes;
  const cudaError_t error = cudaPointerGetAttributes(&attributes, pointer);
  cudaGetLastError();
  return error == cudaSuccess && attributes.type == cudaMemoryTypeHost;
}

TEST(PinnedStagingPoolTest, LendsPageLockedBuffersAndTakesThemBack) {
  SKIP_WITHOUT_GPUS(1);
  constexpr int64_t kBytes = (int64_t{1} << 20) + 4099;
  PinnedStagingPool pool(0, kBytes, 2);
  std::shared_ptr<char> first = pool.Lend(kBytes);
  ASSERT_NE(first, nullptr);
  EXPECT_TRUE(IsPageLocked(first.get()));
  EXPECT_TRUE(IsPageLocked(first.get() + kBytes - 1));
  std::memset(first.get(), 7, kBytes);  // all of it is writable
  std::shared_ptr<char> second = pool.Lend(1);
  ASSERT_NE(second, nullptr);
  EXPECT_NE(second.get(), first.get());
  EXPECT_EQ(pool.allocated(), 2);
  EXPECT_EQ(pool.lent(), 2);
  // Every buffer is lent: none more.
  EXPECT_EQ(pool.Lend(1), nullptr);
  EXPECT_EQ(pool.allocated(), 2);

  // The last copy of a lent pointer gives its buffer back, to be lent again.
  char* const returned = first.get();
  std::shared_ptr<char> copy = first;
  first.reset();
  EXPECT_EQ(pool.lent(), 2);
  copy.reset();
  EXPECT_EQ(pool.lent(), 1);
  std::shared_ptr<char> again = pool.Lend(kBytes);
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(again.get(), returned);
  EXPECT_EQ(pool.allocated(), 2);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// Fill allocates the buffers not yet there, around those lent, and lends
// none of them.
TEST(PinnedStagingPoolTest, FillAllocatesTheRestOfTheBuffers) {
  SKIP_WITHOUT_GPUS(1);
  PinnedStagingPool pool(0, 4096, 3);
  std::shared_ptr<char> held = pool.Lend(4096);
  ASSERT_NE(held, nullptr);
  EXPECT_EQ(pool.Fill(), 3);
  EXPECT_EQ(pool.allocated(), 3);
  EXPECT_EQ(pool.lent(), 1);
  std::shared_ptr<char> second = pool.Lend(1);
  std::shared_ptr<char> third = pool.Lend(1);
  ASSERT_NE(third, nullptr);
  EXPECT_TRUE(IsPageLocked(third.get()));
  EXPECT_EQ(pool.allocated(), 3);
  EXPECT_EQ(pool.Fill(), 3);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST(PinnedStagingPoolTest, RefusesMoreThanOneBuffer) {
  SKIP_WITHOUT_GPUS(1);
  PinnedStagingPool pool(0, 4096, 1);
  EXPECT_EQ(pool.Lend(4097), nullptr);
  EXPECT_EQ(pool.allocated(), 0);
  EXPECT_NE(pool.Lend(4096), nullptr);
}

TEST(PinnedStagingPoolTest, LeasesOutliveThePool) {
  SKIP_WITHOUT_GPUS(1);
  std::shared_ptr<char> lease;
  {
    PinnedStagingPool pool(0, 1 << 16, 1);
    lease = pool.Lend(1 << 16);
    ASSERT_NE(lease, nullptr);
  }
  EXPECT_TRUE(IsPageLocked(lease.get()));
  std::memset(lease.get(), 1, 1 << 16);
  lease.reset();
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

}  // namespace
}  // namespace ringattn
