#include "server/worker_writer.h"

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace ringattn {
namespace {

// A worker stream whose writes block until the test lets them through, and
// which can be made to fail.
class GatedStream {
 public:
  // Lets `n` more writes complete.
  void Allow(int n) {
    absl::MutexLock lock(&mutex_);
    allowed_ += n;
  }
  void Break() {
    absl::MutexLock lock(&mutex_);
    broken_ = true;
  }
  // Waits until `n` writes have completed; returns the rows they carried.
  std::vector<int64_t> WaitForWrites(size_t n) {
    absl::MutexLock lock(&mutex_);
    auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
      return written_.size() >= n;
    };
    mutex_.Await(absl::Condition(&done));
    return written_;
  }
  size_t written() {
    absl::MutexLock lock(&mutex_);
    return written_.size();
  }

  bool Write(const v1::ExecuteRequest& request) {
    absl::MutexLock lock(&mutex_);
    auto may_go = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
      return broken_ || allowed_ > 0;
    };
    mutex_.Await(absl::Condition(&may_go));
    if (broken_) return false;
    --allowed_;
    written_.push_back(request.rows().first_position());
    return true;
  }
  // What the writer writes through.
  WorkerWriter::Write Writer() {
    return [this](const v1::ExecuteRequest& request) { return Write(request); };
  }

 private:
  absl::Mutex mutex_;
  int allowed_ ABSL_GUARDED_BY(mutex_) = 0;
  bool broken_ ABSL_GUARDED_BY(mutex_) = false;
  std::vector<int64_t> written_ ABSL_GUARDED_BY(mutex_);
};

v1::ExecuteRequest Rows(int64_t first, size_t bytes) {
  v1::ExecuteRequest request;
  request.mutable_rows()->set_first_position(first);
  request.mutable_rows()->set_data(std::string(bytes, 'x'));
  return request;
}

TEST(WorkerWriter, WritesEverythingInOrderAndFlushWaitsForIt) {
  GatedStream stream;
  WorkerWriter writer(stream.Writer(), 1 << 20);
  for (int64_t i = 0; i < 5; ++i) ASSERT_TRUE(writer.Push(Rows(i, 100)));
  stream.Allow(5);
  ASSERT_TRUE(writer.Flush());
  EXPECT_EQ(stream.WaitForWrites(5), (std::vector<int64_t>{0, 1, 2, 3, 4}));
}

TEST(WorkerWriter, PushWaitsWhileTheQueueIsFull) {
  GatedStream stream;
  // Room for two of these requests; the one being written still counts.
  WorkerWriter writer(stream.Writer(), 1000);
  ASSERT_TRUE(writer.Push(Rows(0, 400)));
  ASSERT_TRUE(writer.Push(Rows(1, 400)));
  std::atomic<bool> started{false};
  std::atomic<bool> pushed{false};
  std::thread producer([&] {
    started = true;
    EXPECT_TRUE(writer.Push(Rows(2, 400)));
    pushed = true;
  });
  while (!started) std::this_thread::yield();
  // No write has completed, so the third request cannot be queued yet.
  EXPECT_FALSE(pushed);
  EXPECT_EQ(stream.written(), 0u);
  stream.Allow(3);
  producer.join();
  EXPECT_TRUE(pushed);
  ASSERT_TRUE(writer.Flush());
  EXPECT_EQ(stream.WaitForWrites(3), (std::vector<int64_t>{0, 1, 2}));
}

TEST(WorkerWriter, AFailedWriteFailsPushAndFlush) {
  GatedStream stream;
  WorkerWriter writer(stream.Writer(), 1 << 20);
  ASSERT_TRUE(writer.Push(Rows(0, 10)));
  stream.Break();
  EXPECT_FALSE(writer.Flush());
  EXPECT_FALSE(writer.Push(Rows(1, 10)));
  EXPECT_EQ(stream.written(), 0u);
}

TEST(WorkerWriter, OneRequestLargerThanTheLimitStillGoes) {
  GatedStream stream;
  WorkerWriter writer(stream.Writer(), 100);
  ASSERT_TRUE(writer.Push(Rows(0, 1000)));
  stream.Allow(1);
  EXPECT_TRUE(writer.Flush());
  EXPECT_EQ(stream.WaitForWrites(1), (std::vector<int64_t>{0}));
}

}  // namespace
}  // namespace ringattn
