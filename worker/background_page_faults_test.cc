#include "worker/background_page_faults.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "gtest/gtest.h"

namespace ringattn {
namespace {

// Pages of [data, data + bytes) that are mapped in, by mincore.
int64_t ResidentPages(char* data, size_t bytes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> resident(bytes / page);
  EXPECT_EQ(mincore(data, bytes, resident.data()), 0);
  int64_t count = 0;
  for (unsigned char r : resident) count += r & 1;
  return count;
}

class BackgroundPageFaultsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    page_ = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    bytes_ = 256 * page_;
    void* mapped = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(mapped, MAP_FAILED);
    data_ = static_cast<char*>(mapped);
  }
  void TearDown() override { munmap(data_, bytes_); }

  size_t page_ = 0;
  size_t bytes_ = 0;
  char* data_ = nullptr;
};

TEST_F(BackgroundPageFaultsTest, FaultsInEveryPageOfFreshMemory) {
  ASSERT_EQ(ResidentPages(data_, bytes_), 0);
  BackgroundPageFaults faults({absl::Span<char>(data_, bytes_)});
  const int64_t faulted = faults.Wait();
  if (faulted == 0) {
    GTEST_SKIP() << "this kernel lacks MADV_POPULATE_WRITE (Linux 5.14)";
  }
  EXPECT_EQ(faulted, static_cast<int64_t>(bytes_));
  EXPECT_EQ(ResidentPages(data_, bytes_), static_cast<int64_t>(bytes_ / page_));
}

TEST_F(BackgroundPageFaultsTest, LeavesRowsAlreadyWrittenAlone) {
  // Rows written before and while the pages are faulted in survive.
  for (size_t p = 0; p < bytes_ / page_; p += 2) {
    std::memset(data_ + p * page_, static_cast<int>(p % 251) + 1, page_);
  }
  {
    BackgroundPageFaults faults({absl::Span<char>(data_ + 3, bytes_ - 7)});
    for (size_t p = 1; p < bytes_ / page_; p += 2) {
      std::memset(data_ + p * page_, static_cast<int>(p % 251) + 1, page_);
    }
  }
  for (size_t p = 0; p < bytes_ / page_; ++p) {
    const char expected = static_cast<char>(p % 251 + 1);
    ASSERT_EQ(data_[p * page_], expected) << "page " << p;
    ASSERT_EQ(data_[p * page_ + page_ - 1], expected) << "page " << p;
  }
}

TEST_F(BackgroundPageFaultsTest, HandsOnEachRegionOnceItIsIn) {
  const size_t half = bytes_ / 2;
  std::vector<absl::Span<char>> handed;
  std::vector<int64_t> resident;
  BackgroundPageFaults faults(
      {absl::Span<char>(data_, half), absl::Span<char>(),
       absl::Span<char>(data_ + half, half)},
      [&](absl::Span<char> region) {
        handed.push_back(region);
        resident.push_back(ResidentPages(region.data(), region.size()));
      });
  if (faults.Wait() == 0) {
    GTEST_SKIP() << "this kernel lacks MADV_POPULATE_WRITE (Linux 5.14)";
  }
  ASSERT_EQ(handed.size(), 2u);
  EXPECT_EQ(handed[0].data(), data_);
  EXPECT_EQ(handed[1].data(), data_ + half);
  EXPECT_EQ(resident[0], static_cast<int64_t>(half / page_));
  EXPECT_EQ(resident[1], static_cast<int64_t>(half / page_));
}

TEST_F(BackgroundPageFaultsTest, StopsWhenDestroyedAndIgnoresEmptyRegions) {
  BackgroundPageFaults faults(
      {absl::Span<char>(), absl::Span<char>(data_, bytes_)});
  EXPECT_LE(faults.Wait(), static_cast<int64_t>(bytes_));
}

}  // namespace
}  // namespace ringattn
