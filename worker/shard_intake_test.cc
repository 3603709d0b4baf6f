#include "worker/shard_intake.h"

#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/shard_layout.h"
#include "core/typed_tensor.h"
#include "gtest/gtest.h"

namespace ringattn {
namespace {

constexpr int64_t kDim = 3;

// Q, K and V of one worker holding all `n` positions; rows of 1 x 3 fp32
// values.
class ShardIntakeTest : public ::testing::Test {
 protected:
  explicit ShardIntakeTest(int64_t n = 1009)
      : layout_(ShardLayout::Make(ShardKind::kContiguous, n, 1)),
        q_(Shape{1, n, 1, kDim}),
        k_(Shape{1, n, 1, kDim}),
        v_(Shape{1, n, 1, kDim}),
        intake_({ShardRowsTarget("Q", TypedView(q_.view()), &layout_, 0),
                 ShardRowsTarget("K", TypedView(k_.view()), &layout_, 0),
                 ShardRowsTarget("V", TypedView(v_.view()), &layout_, 0)},
                DType::kFloat32) {}

  // Rows [first, first + count) of `tensor`, each value its position plus
  // tenths for the tensor.
  static v1::ShardRows Rows(v1::TensorName tensor, int64_t first,
                            int64_t count) {
    std::vector<float> values;
    for (int64_t p = first; p < first + count; ++p) {
      for (int64_t d = 0; d < kDim; ++d) {
        values.push_back(static_cast<float>(p) + 0.1f * tensor);
      }
    }
    v1::ShardRows rows;
    rows.set_tensor(tensor);
    rows.set_first_position(first);
    rows.set_count(count);
    rows.set_data(std::string(reinterpret_cast<const char*>(values.data()),
                              values.size() * sizeof(float)));
    return rows;
  }

  const ShardLayout layout_;
  Tensor<float> q_, k_, v_;
  ShardIntake intake_;
};

TEST_F(ShardIntakeTest, RowsFromManyThreadsAllLandWhereTheyBelong) {
  const int64_t n = layout_.seq_len();
  constexpr int kThreads = 4;
  constexpr int64_t kRowsPerMessage = 7;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      // Thread t takes every kThreads-th message of every tensor.
      int64_t message = 0;
      for (v1::TensorName tensor : {v1::Q, v1::K, v1::V}) {
        for (int64_t first = 0; first < n; first += kRowsPerMessage) {
          if (message++ % kThreads != t) continue;
          const int64_t count = std::min(kRowsPerMessage, n - first);
          absl::StatusOr<int64_t> placed =
              intake_.Place(Rows(tensor, first, count));
          if (!placed.ok() || *placed != count) ++failures;
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
  intake_.Close();
  ASSERT_TRUE(intake_.CheckComplete().ok());
  const Tensor<float>* tensors[] = {&q_, &k_, &v_};
  for (int t = 0; t < 3; ++t) {
    for (int64_t p = 0; p < n; ++p) {
      for (int64_t d = 0; d < kDim; ++d) {
        ASSERT_EQ(tensors[t]->data()[p * kDim + d],
                  static_cast<float>(p) + 0.1f * (t + 1))
            << "tensor " << t << " position " << p;
      }
    }
  }
}

TEST_F(ShardIntakeTest, ARowSentOnTwoStreamsIsTakenOnce) {
  const v1::ShardRows rows = Rows(v1::K, 100, 50);
  std::atomic<int> taken{0};
  std::atomic<int> refused{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&] {
      absl::StatusOr<int64_t> placed = intake_.Place(rows);
      if (placed.ok()) {
        ++taken;
      } else if (placed.status().code() ==
                     absl::StatusCode::kInvalidArgument &&
                 placed.status().message().find("arrived twice") !=
                     std::string::npos) {
        ++refused;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(taken.load(), 1);
  EXPECT_EQ(refused.load(), 1);
}

TEST_F(ShardIntakeTest, RowsAfterCloseAreRefusedAndMissingOnesNamed) {
  ASSERT_TRUE(intake_.Place(Rows(v1::Q, 0, 10)).ok());
  intake_.Close();
  EXPECT_EQ(intake_.Place(Rows(v1::Q, 10, 10)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  const absl::Status complete = intake_.CheckComplete();
  EXPECT_EQ(complete.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(complete.message().find("position 10"), std::string::npos)
      << complete;
}

TEST_F(ShardIntakeTest, UnknownTensorIsRefused) {
  v1::ShardRows rows = Rows(v1::Q, 0, 1);
  rows.set_tensor(static_cast<v1::TensorName>(9));
  const absl::Status status = intake_.Place(rows).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("must be Q, K or V"), std::string::npos)
      << status;
}

}  // namespace
}  // namespace ringattn
