#include "client/attached_streams.h"

#include <map>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace ringattn {
namespace {

// 12 chunks of one row each: rows 0..11 of Q, the row's values equal to its
// index.
struct TwelveRows {
  TwelveRows() : q(Shape{1, 12, 1, 4}) {
    for (int64_t t = 0; t < 12; ++t) {
      for (int64_t d = 0; d < 4; ++d) q.view().Row(0, t, 0)[d] = t;
    }
    stream.Add(v1::Q, q.view());
  }
  Tensor<float> q;
  ChunkStream stream{DType::kFloat32, 1};
};

// A source that can only hand out its chunks in order: one token each.
class InOrderOnly : public ChunkSource {
 public:
  explicit InOrderOnly(int64_t chunks) : chunks_(chunks) {}
  bool Next(v1::TensorChunk* chunk) override {
    if (next_ == chunks_) return false;
    chunk->set_tensor(v1::K);
    chunk->set_token_offset(next_++);
    chunk->set_token_count(1);
    chunk->set_data("x");
    return true;
  }
  int64_t total_bytes() const override { return chunks_; }

 private:
  const int64_t chunks_;
  int64_t next_ = 0;
};

TEST(SharedChunks, EachStreamStartsOnARunOfItsOwn) {
  TwelveRows rows;
  SharedChunks chunks(&rows.stream, 3, nullptr);
  v1::TensorChunk chunk;
  for (int stream : {0, 1, 2}) {
    ASSERT_TRUE(chunks.Next(stream, &chunk));
    EXPECT_EQ(chunk.token_offset(), 4 * stream) << "stream " << stream;
  }
  // Stream 2 goes on along its own run.
  ASSERT_TRUE(chunks.Next(2, &chunk));
  EXPECT_EQ(chunk.token_offset(), 9);
}

TEST(SharedChunks, StreamWithItsRunOutTakesTheEndOfTheLongest) {
  TwelveRows rows;
  SharedChunks chunks(&rows.stream, 3, nullptr);
  v1::TensorChunk chunk;
  ASSERT_TRUE(chunks.Next(1, &chunk));  // token 4: run 1 has 5..7 left
  std::vector<int64_t> offsets;
  while (chunks.Next(0, &chunk)) offsets.push_back(chunk.token_offset());
  // Its own run 0..3, then from the end of whichever run has the most left:
  // run 2 (8..11), then runs 1 (5..7) and 2 in turn, the first on ties.
  EXPECT_EQ(offsets, (std::vector<int64_t>{0, 1, 2, 3, 11, 7, 10, 6, 9, 5, 8}));
  EXPECT_FALSE(chunks.Next(1, &chunk));
}

TEST(SharedChunks, StreamsFillingAtOnceHandOutEveryRowOnceWithItsData) {
  TwelveRows rows;
  int64_t last_done = 0;
  SharedChunks chunks(&rows.stream, 4, [&](int64_t done, int64_t total) {
    EXPECT_GE(done, last_done);
    EXPECT_EQ(total, 12 * 16);
    last_done = done;
  });
  std::vector<std::map<int64_t, float>> seen(4);
  std::vector<std::thread> streams;
  for (int s = 0; s < 4; ++s) {
    streams.emplace_back([&chunks, &seen, s] {
      v1::TensorChunk chunk;
      while (chunks.Next(s, &chunk)) {
        float value;
        std::memcpy(&value, chunk.data().data(), sizeof(value));
        seen[s][chunk.token_offset()] = value;
      }
    });
  }
  for (std::thread& stream : streams) stream.join();
  std::map<int64_t, int> times;
  for (const auto& stream_rows : seen) {
    for (const auto& [token, value] : stream_rows) {
      ++times[token];
      EXPECT_EQ(value, token);
    }
  }
  ASSERT_EQ(times.size(), 12u);
  for (const auto& [token, count] : times) EXPECT_EQ(count, 1) << token;
  EXPECT_EQ(last_done, 12 * 16);
}

TEST(SharedChunks, InOrderSourceIsHandedOutInOrder) {
  InOrderOnly source(5);
  SharedChunks chunks(&source, 2, nullptr);
  v1::TensorChunk chunk;
  std::vector<int64_t> offsets;
  for (int i = 0; chunks.Next(i % 2, &chunk); ++i) {
    offsets.push_back(chunk.token_offset());
  }
  EXPECT_EQ(offsets, (std::vector<int64_t>{0, 1, 2, 3, 4}));
}

}  // namespace
}  // namespace ringattn
