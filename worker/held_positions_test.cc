// HeldPositions: positions map to rows piece after piece, appends come in
// order, a query's chunks are found as one run of rows or refused, and undone
// appends are forgotten.

#include "worker/held_positions.h"

#include "gtest/gtest.h"

namespace ringattn {
namespace {

// Positions [0, 3), [5, 7) and [10, 11): rows 0-2, 3-4 and 5.
HeldPositions ThreePieces() {
  HeldPositions held;
  held.Append({0, 3});
  held.Append({5, 7});
  held.Append({10, 11});
  return held;
}

TEST(HeldPositions, PositionsMapToRowsPieceAfterPiece) {
  const HeldPositions held = ThreePieces();
  EXPECT_EQ(held.rows(), 6);
  EXPECT_EQ(held.RowOf(0), 0);
  EXPECT_EQ(held.RowOf(2), 2);
  EXPECT_EQ(held.RowOf(3), -1);
  EXPECT_EQ(held.RowOf(6), 4);
  EXPECT_EQ(held.RowOf(10), 5);
  EXPECT_EQ(held.RowOf(11), -1);
  EXPECT_EQ(held.RowOf(-1), -1);
}

TEST(HeldPositions, AppendsComeAfterEveryPositionHeld) {
  const HeldPositions held = ThreePieces();
  EXPECT_TRUE(held.CheckAppend("c", {11, 12}).ok());
  EXPECT_TRUE(held.CheckAppend("c", {20, 21}).ok());
  const absl::Status overlap = held.CheckAppend("c", {10, 12});
  EXPECT_EQ(overlap.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(overlap.message().find("'c'"), std::string::npos) << overlap;
  EXPECT_EQ(held.CheckAppend("c", {3, 5}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(HeldPositions().CheckAppend("c", {0, 1}).ok());
}

TEST(HeldPositions, ChunksAreOneRunOfRowsOrRefused) {
  const HeldPositions held = ThreePieces();
  absl::StatusOr<Range> rows = held.RowsOf("c", {{1, 3}, {5, 7}, {10, 11}});
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(rows->begin, 1);
  EXPECT_EQ(rows->end, 6);
  rows = held.RowsOf("c", {{5, 5}, {6, 7}});  // an empty chunk is skipped
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(rows->begin, 4);
  EXPECT_EQ(rows->end, 5);
  rows = held.RowsOf("c", {});
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(rows->size(), 0);
  EXPECT_EQ(held.RowsOf("c", {{2, 6}}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // Held, but rows 0 and 2 are not one run.
  EXPECT_EQ(held.RowsOf("c", {{0, 1}, {2, 3}}).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(HeldPositions, RunsFollowThePieces) {
  const HeldPositions held = ThreePieces();
  absl::StatusOr<std::vector<HeldPositions::RowRun>> runs =
      held.RunsOf("c", {6, 7});
  ASSERT_TRUE(runs.ok()) << runs.status();
  ASSERT_EQ(runs->size(), 1u);
  EXPECT_EQ((*runs)[0].row, 4);
  EXPECT_EQ((*runs)[0].count, 1);
  EXPECT_EQ(held.RunsOf("c", {2, 6}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  HeldPositions adjacent;
  adjacent.Append({0, 4});
  adjacent.Append({4, 6});
  runs = adjacent.RunsOf("c", {2, 6});
  ASSERT_TRUE(runs.ok()) << runs.status();
  ASSERT_EQ(runs->size(), 2u);
  EXPECT_EQ((*runs)[0].row, 2);
  EXPECT_EQ((*runs)[0].count, 2);
  EXPECT_EQ((*runs)[1].row, 4);
  EXPECT_EQ((*runs)[1].count, 2);
}

TEST(HeldPositions, DropForgetsPiecesFromKeepLength) {
  HeldPositions held = ThreePieces();
  held.DropFrom(6);  // [5, 7) starts before 6 and stays
  EXPECT_EQ(held.rows(), 5);
  EXPECT_EQ(held.RowOf(10), -1);
  held.DropFrom(5);
  EXPECT_EQ(held.rows(), 3);
  EXPECT_TRUE(held.CheckAppend("c", {3, 4}).ok());
  held.DropFrom(0);
  EXPECT_TRUE(held.empty());
}

}  // namespace
}  // namespace ringattn
