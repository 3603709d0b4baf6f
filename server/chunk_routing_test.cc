#include "server/chunk_routing.h"

#include <limits>
#include <string>
#include <utility>

#include "gtest/gtest.h"

namespace ringattn {
namespace {

AttentionSpec Spec() {
  AttentionSpec spec;
  spec.batch = 2;
  spec.q_len = 5;
  spec.kv_len = 7;
  spec.q_heads = 4;
  spec.kv_heads = 2;
  spec.head_dim = 3;
  return spec;
}

v1::TensorChunk Chunk(v1::TensorName tensor, int64_t batch, int64_t offset,
                      int64_t count, size_t bytes) {
  v1::TensorChunk chunk;
  chunk.set_tensor(tensor);
  chunk.set_batch(batch);
  chunk.set_token_offset(offset);
  chunk.set_token_count(count);
  chunk.set_data(std::string(bytes, '\0'));
  return chunk;
}

TEST(CheckChunkRows, AcceptsRowsInsideTheirTensor) {
  // Q rows take 4 x 3 fp16 values, K rows 2 x 3.
  EXPECT_TRUE(
      CheckChunkRows(Spec(), DType::kFloat16, Chunk(v1::Q, 1, 3, 2, 2 * 24), 1)
          .ok());
  EXPECT_TRUE(
      CheckChunkRows(Spec(), DType::kFloat16, Chunk(v1::K, 0, 0, 7, 7 * 12), 2)
          .ok());
}

TEST(CheckChunkRows, RefusesBadBatchRangeAndSize) {
  const AttentionSpec spec = Spec();
  for (const v1::TensorChunk& chunk :
       {Chunk(v1::Q, 2, 0, 1, 48), Chunk(v1::Q, -1, 0, 1, 48),
        Chunk(v1::Q, 0, 4, 2, 96), Chunk(v1::V, 0, 0, 0, 0),
        Chunk(v1::V, 0, -1, 1, 24), Chunk(v1::K, 0, 0, 1, 25)}) {
    const absl::Status status = CheckChunkRows(spec, DType::kFloat32, chunk, 3);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument)
        << chunk.DebugString();
    EXPECT_NE(status.message().find("chunk 3"), std::string::npos);
  }
}

// Found by fuzz/request_stream_fuzzer: token_offset INT64_MAX with
// token_count 2 overflowed the range check, passed it, and sent routing past
// the end of the sequence.
TEST(CheckChunkRows, RefusesARangeWhoseEndOverflows) {
  const int64_t max = std::numeric_limits<int64_t>::max();
  for (const auto& [offset, count] :
       {std::pair{max, int64_t{2}}, std::pair{int64_t{1}, max}}) {
    const absl::Status status = CheckChunkRows(
        Spec(), DType::kFloat32, Chunk(v1::Q, 0, offset, count, 0), 4);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_NE(status.message().find("are not inside [0, 5)"), std::string::npos)
        << status;
  }
  EXPECT_NE(
      CheckChunkRows(Spec(), DType::kFloat32, Chunk(v1::Q, 0, max, 2, 0), 4)
          .message()
          .find("tokens [9223372036854775807, 9223372036854775807 + 2)"),
      std::string::npos);
  EXPECT_NE(CheckChunkRows(Spec(), DType::kFloat32, Chunk(v1::Q, 0, 4, 2, 0), 4)
                .message()
                .find("tokens [4, 6) are not inside [0, 5)"),
            std::string::npos);
}

TEST(FillShardRows, ListsPositionsOnlyWhenNotContiguous) {
  v1::TensorChunk chunk = Chunk(v1::K, 1, 2, 3, 3 * 2);
  chunk.set_data("aabbcc");
  v1::ShardRows rows;
  FillShardRows(&chunk, RequestLayout::Piece{1, 1, {5, 3}, false}, 2, &rows);
  EXPECT_EQ(rows.tensor(), v1::K);
  EXPECT_EQ(rows.batch(), 1);
  EXPECT_EQ(rows.count(), 2);
  ASSERT_EQ(rows.positions_size(), 2);
  EXPECT_EQ(rows.positions(1), 3);
  EXPECT_EQ(rows.data(), "bbcc");
  rows.Clear();
  FillShardRows(&chunk, RequestLayout::Piece{0, 0, {2}, true}, 2, &rows);
  EXPECT_EQ(rows.first_position(), 2);
  EXPECT_EQ(rows.positions_size(), 0);
  EXPECT_EQ(rows.data(), "aa");
}

TEST(FillShardRows, APieceThatIsTheWholeChunkTakesItsData) {
  v1::TensorChunk chunk = Chunk(v1::V, 0, 2, 3, 3 * 2);
  chunk.set_data("aabbcc");
  v1::ShardRows rows;
  FillShardRows(&chunk, RequestLayout::Piece{0, 0, {2, 3, 4}, true}, 2, &rows);
  EXPECT_EQ(rows.count(), 3);
  EXPECT_EQ(rows.data(), "aabbcc");
}

}  // namespace
}  // namespace ringattn
