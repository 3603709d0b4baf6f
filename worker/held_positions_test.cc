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
}

// A decode session appends one position at a time: they join the last piece,
// so its rows stay one run however long the session.
TEST(HeldPositions, AppendsThatFollowOnExtendTheLastPiece) {
  HeldPositions held = ThreePieces();
  for (int64_t position = 11; position < 1011; ++position) {
    held.Append({position, position + 1});
  }
  held.Append({2000, 2002});
  EXPECT_EQ(held.rows(), 1008);
  EXPECT_EQ(held.RowOf(10), 5);
  EXPECT_EQ(held.RowOf(1010), 1005);
  EXPECT_EQ(held.RowOf(1011), -1);
  EXPECT_EQ(held.RowOf(2001), 1007);
  absl::StatusOr<std::vector<HeldPositions::RowRun>> runs =
      held.RunsOf("c", {10, 1011});
  ASSERT_TRUE(runs.ok()) << runs.status();
  ASSERT_EQ(runs->size(), 1u);
  EXPECT_EQ((*runs)[0].row, 5);
  EXPECT_EQ((*runs)[0].count, 1001);
}

TEST(HeldPositions, DropForgetsPositionsFromKeepLength) {
  HeldPositions held = ThreePieces();
  held.DropFrom(6);  // [5, 7) keeps 5
  EXPECT_EQ(held.rows(), 4);
  EXPECT_EQ(held.RowOf(5), 3);
  EXPECT_EQ(held.RowOf(6), -1);
  EXPECT_EQ(held.RowOf(10), -1);
  EXPECT_TRUE(held.CheckAppend("c", {6, 7}).ok());
  held.DropFrom(5);
  EXPECT_EQ(held.rows(), 3);
  EXPECT_TRUE(held.CheckAppend("c", {3, 4}).ok());
  held.DropFrom(0);
  EXPECT_TRUE(held.empty());
}

// An undone append that had joined the last piece leaves it as it was.
TEST(HeldPositions, DropUndoesAnAppendThatJoinedTheLastPiece) {
  HeldPositions held = ThreePieces();
  held.Append({11, 14});
  EXPECT_EQ(held.rows(), 9);
  held.DropFrom(11);
  EXPECT_EQ(held.rows(), 6);
  EXPECT_EQ(held.RowOf(10), 5);
  EXPECT_EQ(held.RowOf(11), -1);
  held.Append({11, 12});
  EXPECT_EQ(held.RowOf(11), 6);
}

}  // namespace
}  // namespace ringattn
