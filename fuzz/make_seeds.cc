// Writes the seed corpus of the fuzz targets into DIR/<target>/ (fuzz/corpus
// in the tree): valid .npy files of both dtypes, three format versions and
// several shapes; valid Attend request streams cut by the client's own
// ChunkStream for dense, causal, GQA, Hilbert, dilated and block-sparse specs
// over 1 to 8 workers; valid output streams; every row of a worker's shard.
// Deterministic.
//
//   make_seeds DIR

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "client/chunking.h"
#include "client/npy.h"
#include "core/shard_layout.h"
#include "fuzz/fuzz_input.h"
#include "proto/spec_conversion.h"
#include "ringattn/v1/worker.pb.h"

namespace ringattn {
namespace {

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// A float16 .npy file of format `major`.0 by hand: WriteNpy writes only
// float32 in version 1.0 where the header fits.
std::string Float16Npy(int major, const std::string& shape,
                       const std::vector<uint16_t>& values) {
  std::string dict =
      "{'descr': '<f2', 'fortran_order': False, 'shape': " + shape + ", }";
  const size_t preamble = major == 1 ? 10 : 12;
  dict.resize((preamble + dict.size() + 1 + 63) / 64 * 64 - preamble - 1, ' ');
  dict.push_back('\n');
  std::string bytes("\x93NUMPY", 6);
  bytes.push_back(static_cast<char>(major));
  bytes.push_back(0);
  for (size_t i = 0; i < preamble - 8; ++i) {
    bytes.push_back(static_cast<char>(dict.size() >> (8 * i) & 0xff));
  }
  bytes += dict;
  bytes.append(reinterpret_cast<const char*>(values.data()),
               values.size() * sizeof(uint16_t));
  return bytes;
}

void NpySeeds(const std::string& dir) {
  const std::vector<std::vector<int64_t>> shapes = {
      {}, {0}, {5}, {2, 3}, {1, 3, 2, 4}};
  for (size_t i = 0; i < shapes.size(); ++i) {
    int64_t count = 1;
    for (int64_t dim : shapes[i]) count *= dim;
    std::vector<float> values(static_cast<size_t>(count));
    for (int64_t v = 0; v < count; ++v) values[v] = 0.5f * v - 1;
    const std::string path = dir + "/f4_" + std::to_string(i) + ".npy";
    if (!WriteNpy(path, shapes[i], values).ok()) std::perror(path.c_str());
  }
  // 1.0, -2.0, 0.5, infinity, 65504 (the largest float16), NaN.
  const std::vector<uint16_t> halves = {0x3c00, 0xc000, 0x3800,
                                        0x7c00, 0x7bff, 0x7e00};
  WriteFile(dir + "/f2_v1.npy", Float16Npy(1, "(2, 3)", halves));
  WriteFile(dir + "/f2_v2.npy", Float16Npy(2, "(6,)", halves));
  WriteFile(dir + "/f2_v3_long.npy", Float16Npy(3, "(1L, 6L)", halves));
}

// A [batch, seq, heads, dim] tensor of small distinct values.
Tensor<float> Values(int64_t batch, int64_t seq, int64_t heads, int64_t dim) {
  Tensor<float> tensor(Shape{batch, seq, heads, dim});
  for (size_t i = 0; i < tensor.values().size(); ++i) {
    tensor.values()[i] = static_cast<float>(i % 97) / 8 - 6;
  }
  return tensor;
}

// The fuzz input of one whole Attend upload of `spec` to `workers` workers.
std::string RequestStream(int workers, const v1::AttentionSpec& header,
                          int64_t chunk_bytes) {
  std::string out(1, static_cast<char>(workers - 1));
  v1::AttendRequest request;
  *request.mutable_header() = header;
  AppendMessage(request, &out);
  const Tensor<float> q = Values(header.batch(), header.q_len(),
                                 header.q_heads(), header.head_dim());
  const Tensor<float> k = Values(header.batch(), header.kv_len(),
                                 header.kv_heads(), header.head_dim());
  ChunkStream stream(*DTypeFromProto(header.wire_dtype()), chunk_bytes);
  stream.Add(v1::Q, q.view());
  stream.Add(v1::K, k.view());
  stream.Add(v1::V, k.view());
  request.Clear();
  while (stream.Next(request.mutable_chunk())) AppendMessage(request, &out);
  return out;
}

v1::AttentionSpec Header(int64_t batch, int64_t q_len, int64_t kv_len,
                         int64_t q_heads, int64_t kv_heads, int64_t head_dim,
                         v1::DType dtype) {
  v1::AttentionSpec spec;
  spec.set_batch(batch);
  spec.set_q_len(q_len);
  spec.set_kv_len(kv_len);
  spec.set_q_heads(q_heads);
  spec.set_kv_heads(kv_heads);
  spec.set_head_dim(head_dim);
  spec.set_wire_dtype(dtype);
  return spec;
}

void RequestSeeds(const std::string& dir) {
  WriteFile(dir + "/dense_fp32_p3",
            RequestStream(3, Header(1, 6, 6, 2, 1, 4, v1::FP32), 40));
  v1::AttentionSpec causal = Header(2, 5, 9, 4, 2, 3, v1::FP16);
  causal.set_causal(true);
  WriteFile(dir + "/causal_gqa_fp16_p4", RequestStream(4, causal, 30));
  v1::AttentionSpec hilbert = Header(1, 12, 12, 1, 1, 2, v1::BF16);
  hilbert.mutable_hilbert()->set_height(3);
  hilbert.mutable_hilbert()->set_width(4);
  WriteFile(dir + "/hilbert_bf16_p2", RequestStream(2, hilbert, 12));
  v1::AttentionSpec dilated = Header(1, 10, 10, 2, 2, 2, v1::FP32);
  for (const auto& [segment, dilation] : {std::pair{4, 2}, std::pair{10, 5}}) {
    v1::DilatedBranch* branch = dilated.add_dilated();
    branch->set_segment_length(segment);
    branch->set_dilation(dilation);
  }
  WriteFile(dir + "/dilated_p3", RequestStream(3, dilated, 64));
  v1::AttentionSpec sparse = Header(1, 9, 9, 1, 1, 4, v1::FP16);
  v1::BlockSparse* rules = sparse.mutable_block_sparse();
  rules->set_block_size(2);
  rules->set_local_blocks(1);
  v1::BlockPair* pair = rules->add_pairs();
  pair->set_query_block(4);
  pair->set_key_block(0);
  WriteFile(dir + "/block_sparse_p5", RequestStream(5, sparse, 16));
  WriteFile(dir + "/fewer_tokens_than_workers_p8",
            RequestStream(8, Header(1, 2, 3, 1, 1, 1, v1::FP32), 4));
}

// The fuzz input of a whole output stream of `shape`, `rows` token rows per
// chunk.
std::string OutputStream(Shape shape, bool with_lse, int64_t rows) {
  std::string out;
  for (int64_t extent : {shape.batch, shape.seq, shape.heads, shape.dim}) {
    out.push_back(static_cast<char>(extent - 1));
  }
  out.push_back(with_lse ? 1 : 0);
  for (int64_t b = 0; b < shape.batch; ++b) {
    for (int64_t t = 0; t < shape.seq; t += rows) {
      v1::OutputChunk chunk;
      const int64_t count = std::min(rows, shape.seq - t);
      chunk.set_batch(b);
      chunk.set_token_offset(t);
      chunk.set_token_count(count);
      chunk.set_data(std::string(count * shape.heads * shape.dim * 4, '\1'));
      if (with_lse) chunk.set_lse(std::string(count * shape.heads * 4, '\2'));
      AppendMessage(chunk, &out);
    }
  }
  return out;
}

void OutputSeeds(const std::string& dir) {
  WriteFile(dir + "/one_chunk", OutputStream(Shape{1, 4, 2, 3}, false, 4));
  WriteFile(dir + "/lse_uneven_chunks",
            OutputStream(Shape{2, 7, 3, 2}, true, 3));
}

// The fuzz input of every row of one worker's shard: `rank` of `workers` in a
// zigzag or contiguous layout of `seq_len` positions, as runs or as listed
// positions.
std::string ShardRowsStream(bool zigzag, int64_t seq_len, int64_t workers,
                            int64_t rank, Shape shape, DType dtype,
                            bool listed) {
  std::string out;
  for (int64_t param :
       {int64_t{zigzag}, seq_len - 1, workers - 1, rank, shape.batch - 1,
        shape.heads - 1, shape.dim - 1, static_cast<int64_t>(dtype)}) {
    out.push_back(static_cast<char>(param));
  }
  const ShardLayout layout = ShardLayout::Make(
      zigzag ? ShardKind::kZigzag : ShardKind::kContiguous, seq_len, workers);
  const int64_t row_bytes = shape.heads * shape.dim * DTypeSize(dtype);
  for (int64_t b = 0; b < shape.batch; ++b) {
    for (const Range& chunk : layout.Chunks(rank)) {
      if (chunk.size() == 0) continue;
      v1::ShardRows rows;
      rows.set_tensor(v1::K);
      rows.set_batch(b);
      if (listed) {
        for (int64_t p = chunk.end - 1; p >= chunk.begin; --p) {
          rows.add_positions(p);
        }
      } else {
        rows.set_first_position(chunk.begin);
        rows.set_count(chunk.size());
      }
      rows.set_data(std::string(chunk.size() * row_bytes, '\x3c'));
      AppendMessage(rows, &out);
    }
  }
  return out;
}

void ShardRowsSeeds(const std::string& dir) {
  WriteFile(dir + "/zigzag_runs", ShardRowsStream(true, 10, 3, 1, {2, 0, 2, 3},
                                                  DType::kFloat16, false));
  WriteFile(
      dir + "/contiguous_listed",
      ShardRowsStream(false, 7, 2, 0, {1, 0, 1, 4}, DType::kFloat32, true));
}

}  // namespace
}  // namespace ringattn

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seeds DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  ringattn::NpySeeds(dir + "/npy_fuzzer");
  ringattn::RequestSeeds(dir + "/request_stream_fuzzer");
  ringattn::OutputSeeds(dir + "/output_assembler_fuzzer");
  ringattn::ShardRowsSeeds(dir + "/shard_rows_fuzzer");
  return 0;
}
