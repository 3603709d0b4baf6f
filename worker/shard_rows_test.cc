#include "worker/shard_rows.h"

#include <cstdint>
#include <limits>
#include <string>

#include "gtest/gtest.h"

namespace ringattn {
namespace {

// Rank 1 of a zigzag layout of 10 positions over 2 workers holds [3, 6) and
// [6, 8); one batch entry, rows of 1 x 2 fp32 values.
class ShardRowsTest : public ::testing::Test {
 protected:
  v1::ShardRows Rows(int64_t first, int64_t count) {
    v1::ShardRows rows;
    rows.set_first_position(first);
    rows.set_count(count);
    rows.set_data(std::string(count > 0 ? count * 8 : 0, '\0'));
    return rows;
  }

  const ShardLayout layout_ = ShardLayout::Make(ShardKind::kZigzag, 10, 2);
  Tensor<float> rows_{Shape{1, 5, 1, 2}};
  ShardRowsTarget target_{"K", TypedView(rows_.view()), &layout_, 1};
};

TEST_F(ShardRowsTest, PlacesTheShardAndRefusesRowsTwiceOrElsewhere) {
  ASSERT_TRUE(target_.Place(Rows(3, 4), DType::kFloat32).ok());
  EXPECT_EQ(target_.missing(), 1);
  EXPECT_EQ(target_.Place(Rows(6, 1), DType::kFloat32).code(),
            absl::StatusCode::kInvalidArgument);
  const absl::Status elsewhere = target_.Place(Rows(0, 1), DType::kFloat32);
  EXPECT_NE(elsewhere.message().find("belongs to rank 0"), std::string::npos)
      << elsewhere;
  EXPECT_FALSE(target_.CheckComplete().ok());
  ASSERT_TRUE(target_.Place(Rows(7, 1), DType::kFloat32).ok());
  EXPECT_TRUE(target_.CheckComplete().ok());
}

// Found by fuzz/shard_rows_fuzzer: the message naming rows at first_position
// INT64_MAX computed their end, which overflowed.
TEST_F(ShardRowsTest, NamesRowsWhoseEndOverflows) {
  const absl::Status status = target_.Place(
      Rows(std::numeric_limits<int64_t>::max(), 2), DType::kFloat32);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find(
                "2 rows from position 9223372036854775807 are outside [0, 10)"),
            std::string::npos)
      << status;
}

}  // namespace
}  // namespace ringattn
