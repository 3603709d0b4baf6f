#include "client/chunking.h"

#include <array>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace ringattn {
namespace {

Tensor<float> Iota(Shape shape) {
  Tensor<float> tensor(shape);
  for (size_t i = 0; i < tensor.values().size(); ++i) {
    tensor.values()[i] = 0.5f * i - 7.0f;
  }
  return tensor;
}

std::vector<float> AsFloats(const std::string& bytes) {
  std::vector<float> values(bytes.size() / sizeof(float));
  std::memcpy(values.data(), bytes.data(), bytes.size());
  return values;
}

std::vector<uint16_t> AsHalves(const std::string& bytes) {
  std::vector<uint16_t> values(bytes.size() / sizeof(uint16_t));
  std::memcpy(values.data(), bytes.data(), bytes.size());
  return values;
}

std::string Bytes(const std::vector<float>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()),
                     values.size() * sizeof(float));
}

TEST(SplitTensorTest, CutsWholeRowsWithinTheByteBudget) {
  const Tensor<float> tensor = Iota({2, 5, 3, 4});  // 48 bytes a row
  const std::vector<v1::TensorChunk> chunks =
      SplitTensor(v1::K, tensor.view(), DType::kFloat32, 100);
  // Two rows a chunk: [0, 2), [2, 4), [4, 5) of each batch entry.
  ASSERT_EQ(chunks.size(), 6u);
  const int64_t offsets[] = {0, 2, 4};
  const int64_t counts[] = {2, 2, 1};
  for (size_t i = 0; i < chunks.size(); ++i) {
    const v1::TensorChunk& chunk = chunks[i];
    const int64_t b = i / 3;
    EXPECT_EQ(chunk.tensor(), v1::K);
    EXPECT_EQ(chunk.batch(), b);
    EXPECT_EQ(chunk.token_offset(), offsets[i % 3]);
    EXPECT_EQ(chunk.token_count(), counts[i % 3]);
    const float* first = tensor.view().Row(b, chunk.token_offset(), 0);
    EXPECT_EQ(AsFloats(chunk.data()),
              std::vector<float>(first, first + chunk.token_count() * 12));
  }
}

TEST(SplitTensorTest, SendsARowAloneWhenItExceedsTheBudget) {
  const Tensor<float> tensor = Iota({1, 3, 2, 8});  // 64 bytes a row
  const std::vector<v1::TensorChunk> chunks =
      SplitTensor(v1::Q, tensor.view(), DType::kFloat32, 10);
  ASSERT_EQ(chunks.size(), 3u);
  for (const v1::TensorChunk& chunk : chunks) {
    EXPECT_EQ(chunk.token_count(), 1);
    EXPECT_EQ(chunk.data().size(), 64u);
  }
}

TEST(SplitTensorTest, ConvertsToTheWireDtype) {
  Tensor<float> tensor({1, 4, 1, 2});
  tensor.values() = {1.0f,  -2.5f,    1.0f / 3, 65504.0f,
                     1e-8f, 3.14159f, 0.0f,     -0.0f};
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    const std::vector<v1::TensorChunk> chunks =
        SplitTensor(v1::V, tensor.view(), dtype, 8);  // 2 rows of 4 bytes
    ASSERT_EQ(chunks.size(), 2u);
    std::vector<uint16_t> wire;
    for (const v1::TensorChunk& chunk : chunks) {
      EXPECT_EQ(chunk.data().size(), 8u);
      const std::vector<uint16_t> halves = AsHalves(chunk.data());
      wire.insert(wire.end(), halves.begin(), halves.end());
    }
    for (size_t i = 0; i < tensor.values().size(); ++i) {
      const float value = tensor.values()[i];
      EXPECT_EQ(wire[i], dtype == DType::kFloat16 ? FloatToHalf(value)
                                                  : FloatToBFloat16(value))
          << DTypeName(dtype) << " value " << value;
    }
  }
}

TEST(SplitTensorTest, ReadsAStridedView) {
  const Tensor<float> tensor = Iota({2, 6, 1, 2});
  const View<const float> middle = tensor.view().Slice(2, 5);
  const std::vector<v1::TensorChunk> chunks =
      SplitTensor(v1::Q, middle, DType::kFloat32, 1 << 20);
  ASSERT_EQ(chunks.size(), 2u);
  for (int64_t b = 0; b < 2; ++b) {
    EXPECT_EQ(chunks[b].batch(), b);
    EXPECT_EQ(chunks[b].token_offset(), 0);
    EXPECT_EQ(chunks[b].token_count(), 3);
    const float* first = tensor.view().Row(b, 2, 0);
    EXPECT_EQ(AsFloats(chunks[b].data()), std::vector<float>(first, first + 6));
  }
}

TEST(ChunkStreamTest, SendsTensorsInTheOrderAdded) {
  const Tensor<float> q = Iota({1, 2, 2, 2});
  const Tensor<float> k = Iota({1, 3, 1, 2});
  ChunkStream stream(DType::kBFloat16, 1 << 20);
  stream.Add(v1::Q, q.view());
  stream.Add(v1::K, k.view());
  stream.Add(v1::V, k.view());
  EXPECT_EQ(stream.total_bytes(), (8 + 6 + 6) * 2);
  std::vector<v1::TensorName> names;
  v1::TensorChunk chunk;
  while (stream.Next(&chunk)) names.push_back(chunk.tensor());
  EXPECT_EQ(names, (std::vector<v1::TensorName>{v1::Q, v1::K, v1::V}));
  EXPECT_FALSE(stream.Next(&chunk));
}

TEST(ChunkStreamTest, FillMakesAnyChunkAsNextWould) {
  const Tensor<float> q = Iota({2, 7, 3, 4});  // 48 bytes a row
  const Tensor<float> k = Iota({2, 5, 1, 4});
  ChunkStream in_order(DType::kFloat32, 100);
  ChunkStream on_demand(DType::kFloat32, 100);
  for (ChunkStream* stream : {&in_order, &on_demand}) {
    stream->Add(v1::Q, q.view());
    stream->Add(v1::K, k.view());
  }
  std::vector<v1::TensorChunk> chunks;
  v1::TensorChunk chunk;
  while (in_order.Next(&chunk)) chunks.push_back(chunk);
  ASSERT_EQ(on_demand.chunk_count(), static_cast<int64_t>(chunks.size()));
  // Backwards, to show that the order does not matter.
  for (int64_t i = on_demand.chunk_count() - 1; i >= 0; --i) {
    v1::TensorChunk made;
    on_demand.Fill(i, &made);
    EXPECT_EQ(made.SerializeAsString(), chunks[i].SerializeAsString())
        << "chunk " << i;
  }
}

// Chunk sizes of `tokens` rows of 8 KiB (32 heads, D=128, bf16) in a stream
// whose limit is 4 MiB.
std::vector<int64_t> ChunkTokens(int64_t tokens) {
  const Tensor<float> q(Shape{1, tokens, 32, 128});
  ChunkStream stream(DType::kBFloat16, 4 << 20);
  stream.Add(v1::Q, q.view());
  std::vector<int64_t> counts;
  v1::TensorChunk chunk;
  while (stream.Next(&chunk)) counts.push_back(chunk.token_count());
  return counts;
}

TEST(ChunkStreamTest, SplitsAFewMebibytesIntoChunksThatPipeline) {
  // 2 MiB: sixteen chunks of 128 KiB (16 rows), not one of 2 MiB.
  EXPECT_EQ(ChunkTokens(256), std::vector<int64_t>(16, 16));
  // 32 MiB: thirty-seconds of 1 MiB.
  EXPECT_EQ(ChunkTokens(4096), std::vector<int64_t>(32, 128));
  // 160 MiB: the 4 MiB limit.
  EXPECT_EQ(ChunkTokens(20480), std::vector<int64_t>(40, 512));
  // Under 4 MiB: chunks of 128 KiB; under 128 KiB in all: one chunk.
  EXPECT_EQ(ChunkTokens(20), (std::vector<int64_t>{16, 4}));
  EXPECT_EQ(ChunkTokens(15), std::vector<int64_t>{15});
}

v1::OutputChunk OutputRows(int64_t batch, int64_t offset, int64_t count,
                           int64_t heads, int64_t dim, bool with_lse) {
  v1::OutputChunk chunk;
  chunk.set_batch(batch);
  chunk.set_token_offset(offset);
  chunk.set_token_count(count);
  std::vector<float> data;
  for (int64_t t = offset; t < offset + count; ++t) {
    for (int64_t i = 0; i < heads * dim; ++i) {
      data.push_back(batch * 1000 + t * 10 + i);
    }
  }
  chunk.set_data(Bytes(data));
  if (with_lse) {
    std::vector<float> lse;
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t t = offset; t < offset + count; ++t) {
        lse.push_back(-(batch * 100 + h * 10 + t));
      }
    }
    chunk.set_lse(Bytes(lse));
  }
  return chunk;
}

TEST(OutputAssemblerTest, ReassemblesChunksInAnyOrder) {
  const Shape shape{2, 5, 3, 2};
  OutputAssembler output(shape, /*with_lse=*/true);
  EXPECT_EQ(output.total_bytes(), (60 + 30) * 4);
  const std::vector<std::array<int64_t, 3>> chunks = {
      {1, 3, 2}, {0, 0, 1}, {1, 0, 3}, {0, 1, 4}};
  for (const auto& [b, offset, count] : chunks) {
    EXPECT_FALSE(output.CheckComplete().ok());
    ASSERT_TRUE(output.Add(OutputRows(b, offset, count, 3, 2, true)).ok());
  }
  ASSERT_TRUE(output.CheckComplete().ok());
  EXPECT_EQ(output.bytes_received(), output.total_bytes());
  const View<float> o = output.output().view();
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t t = 0; t < 5; ++t) {
      for (int64_t h = 0; h < 3; ++h) {
        for (int64_t d = 0; d < 2; ++d) {
          EXPECT_EQ(o.At(b, t, h, d), b * 1000 + t * 10 + h * 2 + d);
        }
        EXPECT_EQ(output.lse()[(b * 3 + h) * 5 + t], -(b * 100 + h * 10 + t));
      }
    }
  }
}

TEST(OutputAssemblerTest, ReportsDuplicateRows) {
  OutputAssembler output({1, 6, 1, 2}, /*with_lse=*/false);
  ASSERT_TRUE(output.Add(OutputRows(0, 0, 4, 1, 2, false)).ok());
  const absl::Status status = output.Add(OutputRows(0, 3, 3, 1, 2, false));
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_NE(status.message().find("row 3 of batch entry 0 twice"),
            std::string::npos)
      << status;
  // Nothing of the rejected chunk was taken.
  ASSERT_TRUE(output.Add(OutputRows(0, 4, 2, 1, 2, false)).ok());
  EXPECT_TRUE(output.CheckComplete().ok());
}

TEST(OutputAssemblerTest, ReportsMissingRows) {
  OutputAssembler output({2, 4, 1, 1}, /*with_lse=*/false);
  ASSERT_TRUE(output.Add(OutputRows(0, 0, 4, 1, 1, false)).ok());
  ASSERT_TRUE(output.Add(OutputRows(1, 0, 2, 1, 1, false)).ok());
  const absl::Status status = output.CheckComplete();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(status.message().find(
                "missing 2 of 8 token rows (the first: token 2 of batch "
                "entry 1)"),
            std::string::npos)
      << status;
}

// Found by fuzz/output_assembler_fuzzer: the message naming the rows of a
// chunk at token_offset INT64_MAX computed offset + count, which overflowed.
TEST(OutputAssemblerTest, NamesRowsWhoseEndOverflows) {
  OutputAssembler output({1, 4, 2, 2}, /*with_lse=*/false);
  const absl::Status status = output.Add(
      OutputRows(0, std::numeric_limits<int64_t>::max(), 4, 2, 2, false));
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_NE(status.message().find("4 output rows from token "
                                  "9223372036854775807 of batch entry 0, "
                                  "outside the output"),
            std::string::npos)
      << status;
}

TEST(OutputAssemblerTest, RejectsMalformedChunks) {
  OutputAssembler output({2, 4, 2, 2}, /*with_lse=*/true);
  const auto expect_internal = [&](const v1::OutputChunk& chunk,
                                   const std::string& words) {
    const absl::Status status = output.Add(chunk);
    EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
    EXPECT_NE(status.message().find(words), std::string::npos) << status;
  };
  expect_internal(OutputRows(2, 0, 1, 2, 2, true), "outside the output");
  expect_internal(OutputRows(0, 3, 2, 2, 2, true), "outside the output");
  expect_internal(OutputRows(0, -1, 1, 2, 2, true), "outside the output");
  v1::OutputChunk empty = OutputRows(0, 0, 1, 2, 2, true);
  empty.set_token_count(0);
  expect_internal(empty, "outside the output");
  expect_internal(OutputRows(0, 0, 1, 2, 3, true),
                  "24 data bytes, expected 16");
  expect_internal(OutputRows(0, 0, 1, 2, 2, false), "0 LSE bytes, expected 8");

  OutputAssembler without_lse({1, 1, 2, 2}, /*with_lse=*/false);
  const absl::Status status = without_lse.Add(OutputRows(0, 0, 1, 2, 2, true));
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_NE(status.message().find("LSE was not asked for"), std::string::npos);
}

}  // namespace
}  // namespace ringattn
