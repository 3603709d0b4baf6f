#include <cuda_runtime.h>

#include <cstring>
#include <memory>
#include <optional>

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
  std::optional<PinnedStagingPool::Lease> first = pool.Lend(kBytes);
  ASSERT_TRUE(first.has_value());
  EXPECT_TRUE(IsPageLocked(first->data));
  EXPECT_TRUE(IsPageLocked(first->data + kBytes - 1));
  std::memset(first->data, 7, kBytes);  // all of it is writable
  std::optional<PinnedStagingPool::Lease> second = pool.Lend(1);
  ASSERT_TRUE(second.has_value());
  EXPECT_NE(second->data, first->data);
  EXPECT_EQ(pool.allocated(), 2);
  EXPECT_EQ(pool.lent(), 2);
  // Every buffer is lent: none more.
  EXPECT_FALSE(pool.Lend(1).has_value());
  EXPECT_EQ(pool.allocated(), 2);

  // The last copy of a keeper gives its buffer back, to be lent again.
  char* const returned = first->data;
  std::shared_ptr<void> copy = first->keeper;
  first.reset();
  EXPECT_EQ(pool.lent(), 2);
  copy.reset();
  EXPECT_EQ(pool.lent(), 1);
  std::optional<PinnedStagingPool::Lease> again = pool.Lend(kBytes);
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->data, returned);
  EXPECT_EQ(pool.allocated(), 2);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST(PinnedStagingPoolTest, RefusesMoreThanOneBuffer) {
  SKIP_WITHOUT_GPUS(1);
  PinnedStagingPool pool(0, 4096, 1);
  EXPECT_FALSE(pool.Lend(4097).has_value());
  EXPECT_EQ(pool.allocated(), 0);
  EXPECT_TRUE(pool.Lend(4096).has_value());
}

TEST(PinnedStagingPoolTest, LeasesOutliveThePool) {
  SKIP_WITHOUT_GPUS(1);
  std::optional<PinnedStagingPool::Lease> lease;
  {
    PinnedStagingPool pool(0, 1 << 16, 1);
    lease = pool.Lend(1 << 16);
    ASSERT_TRUE(lease.has_value());
  }
  EXPECT_TRUE(IsPageLocked(lease->data));
  std::memset(lease->data, 1, 1 << 16);
  lease.reset();
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

}  // namespace
}  // namespace ringattn
