#include "worker/output_dealer.h"

#include <cstring>
#include <map>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace ringattn {
namespace {

constexpr int64_t kBatch = 2;
constexpr int64_t kHeads = 3;
constexpr int64_t kDim = 4;
// Rows [10, 13) and [20, 24) of each batch entry: 7 local rows.
const std::vector<Range> kChunks = {{10, 13}, {20, 24}};
constexpr int64_t kRows = 7;
constexpr int64_t kRowBytes = kHeads * kDim * 4 + kHeads * 4;

// An output whose values name their row: o = 1000 * batch + row, and lse
// the negative of that.
std::unique_ptr<OutputDealer> NumberedOutput(bool list_positions,
                                             int64_t first_message_bytes,
                                             int64_t max_message_bytes) {
  TypedTensor o(DType::kFloat32, Shape{kBatch, kRows, kHeads, kDim});
  Tensor<float> lse(Shape{kBatch, kRows, kHeads, 1});
  for (int64_t b = 0; b < kBatch; ++b) {
    for (int64_t n = 0; n < kRows; ++n) {
      for (int64_t h = 0; h < kHeads; ++h) {
        lse.view().Row(b, n, h)[0] = -(1000.0f * b + n);
        for (int64_t d = 0; d < kDim; ++d) {
          o.floats().Row(b, n, h)[d] = 1000.0f * b + n;
        }
      }
    }
  }
  return std::make_unique<OutputDealer>(std::move(o), std::move(lse), kChunks,
                                        list_positions, first_message_bytes,
                                        max_message_bytes);
}

// The position of local row `row` of kChunks.
int64_t PositionOf(int64_t row) { return row < 3 ? 10 + row : 20 + row - 3; }

// Checks that every row of `out` holds the values of its position's row;
// returns its (batch, position) pairs.
std::vector<std::pair<int64_t, int64_t>> CheckRows(const v1::ShardOutput& out) {
  std::vector<std::pair<int64_t, int64_t>> rows;
  EXPECT_EQ(out.data().size(),
            static_cast<size_t>(out.count() * kHeads * kDim * 4));
  EXPECT_EQ(out.lse().size(), static_cast<size_t>(out.count() * kHeads * 4));
  for (int64_t i = 0; i < out.count(); ++i) {
    const int64_t position = out.positions_size() > 0
                                 ? out.positions(static_cast<int>(i))
                                 : out.first_position() + i;
    int64_t row = 0;
    while (PositionOf(row) != position) ++row;
    float value;
    std::memcpy(&value, out.data().data() + i * kHeads * kDim * 4, 4);
    EXPECT_EQ(value, 1000.0f * out.batch() + row) << "position " << position;
    std::memcpy(&value, out.lse().data() + i * kHeads * 4, 4);
    EXPECT_EQ(value, -(1000.0f * out.batch() + row)) << "position " << position;
    rows.emplace_back(out.batch(), position);
  }
  return rows;
}

TEST(OutputDealer, DealsEveryRowOnceInRunsThatStayInsideAChunk) {
  // Two rows per message: chunks of 3 and 4 rows give 2 + 1 + 2 + 2.
  std::unique_ptr<OutputDealer> dealer =
      NumberedOutput(false, 2 * kRowBytes + 1, 2 * kRowBytes + 1);
  std::vector<std::pair<int64_t, int64_t>> seen;
  std::vector<int64_t> counts;
  v1::ShardOutput out;
  while (dealer->HasMore()) {
    out.Clear();
    ASSERT_TRUE(dealer->Next(&out));
    EXPECT_EQ(out.positions_size(), 0);
    counts.push_back(out.count());
    for (const auto& row : CheckRows(out)) seen.push_back(row);
  }
  EXPECT_FALSE(dealer->Next(&out));
  EXPECT_EQ(counts, (std::vector<int64_t>{2, 1, 2, 2, 2, 1, 2, 2}));
  EXPECT_EQ(dealer->messages(), 8);
  std::vector<std::pair<int64_t, int64_t>> expected;
  for (int64_t b = 0; b < kBatch; ++b) {
    for (int64_t row = 0; row < kRows; ++row) {
      expected.emplace_back(b, PositionOf(row));
    }
  }
  EXPECT_EQ(seen, expected);
}

TEST(OutputDealer, MessagesGrowFromTheFirstSizeAndShrinkTowardTheEnd) {
  // Of 14 rows in chunks of 3 and 4: one row, then two, then at most four
  // (inside a chunk), then at most half of what is left, at least one.
  std::unique_ptr<OutputDealer> dealer =
      NumberedOutput(false, kRowBytes, 4 * kRowBytes + 1);
  std::vector<int64_t> counts;
  std::map<std::pair<int64_t, int64_t>, int> times;
  v1::ShardOutput out;
  while (dealer->Next(&out)) {
    counts.push_back(out.count());
    for (const auto& row : CheckRows(out)) ++times[row];
    out.Clear();
  }
  EXPECT_EQ(counts, (std::vector<int64_t>{1, 2, 4, 3, 2, 1, 1}));
  EXPECT_EQ(times.size(), static_cast<size_t>(kBatch * kRows));
  for (const auto& [row, count] : times) EXPECT_EQ(count, 1);
}

TEST(OutputDealer, NoMessageLeavesLessThanHalfTheFirstBehindInItsChunk) {
  // Three rows a message, but a fourth row of a chunk of 4 goes along.
  std::unique_ptr<OutputDealer> dealer =
      NumberedOutput(false, 3 * kRowBytes, 3 * kRowBytes);
  std::vector<int64_t> counts;
  v1::ShardOutput out;
  while (dealer->Next(&out)) {
    counts.push_back(out.count());
    CheckRows(out);
    out.Clear();
  }
  EXPECT_EQ(counts, (std::vector<int64_t>{3, 4, 3, 4}));
}

TEST(OutputDealer, ListsPositionsWhenAsked) {
  std::unique_ptr<OutputDealer> dealer = NumberedOutput(true, 1 << 20, 1 << 20);
  v1::ShardOutput out;
  ASSERT_TRUE(dealer->Next(&out));
  ASSERT_EQ(out.positions_size(), 3);
  EXPECT_EQ(out.positions(2), 12);
  CheckRows(out);
}

TEST(OutputDealer, StreamsTakingRowsAtOnceGetEachRowOnce) {
  std::unique_ptr<OutputDealer> dealer = NumberedOutput(false, 1, 1);
  std::vector<std::vector<std::pair<int64_t, int64_t>>> taken(4);
  std::vector<std::thread> threads;
  for (auto& rows : taken) {
    threads.emplace_back([&dealer, &rows] {
      v1::ShardOutput out;
      while (dealer->Next(&out)) {
        for (const auto& row : CheckRows(out)) rows.push_back(row);
        out.Clear();
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  std::map<std::pair<int64_t, int64_t>, int> times;
  for (const auto& rows : taken) {
    for (const auto& row : rows) ++times[row];
  }
  EXPECT_EQ(times.size(), static_cast<size_t>(kBatch * kRows));
  for (const auto& [row, count] : times) {
    EXPECT_EQ(count, 1) << row.first << "/" << row.second;
  }
}

TEST(OutputDealer, NoRowsDealsNothing) {
  OutputDealer dealer(TypedTensor(), Tensor<float>(), {}, false, 1 << 20,
                      1 << 20);
  v1::ShardOutput out;
  EXPECT_FALSE(dealer.HasMore());
  EXPECT_FALSE(dealer.Next(&out));
}

}  // namespace
}  // namespace ringattn
