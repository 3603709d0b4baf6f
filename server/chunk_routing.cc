#include "server/chunk_routing.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ringattn {

int64_t ChunkRowBytes(const AttentionSpec& spec, DType dtype,
                      v1::TensorName tensor) {
  const int64_t heads = tensor == v1::Q ? spec.q_heads : spec.kv_heads;
  return heads * spec.head_dim * DTypeSize(dtype);
}

absl::Status CheckChunkRows(const AttentionSpec& spec, DType dtype,
                            const v1::TensorChunk& chunk, int64_t index) {
  const v1::TensorName tensor = chunk.tensor();
  const char* name = tensor == v1::Q ? "Q" : tensor == v1::K ? "K" : "V";
  const bool keys = tensor != v1::Q;
  const int64_t len = keys ? spec.kv_len : spec.q_len;
  const int64_t heads = keys ? spec.kv_heads : spec.q_heads;
  if (chunk.batch() < 0 || chunk.batch() >= spec.batch) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk ", index, ": tensor ", name, " batch ",
                     chunk.batch(), " is outside [0, ", spec.batch, ")"));
  }
  const int64_t begin = chunk.token_offset();
  const int64_t count = chunk.token_count();
  // begin + count could overflow; len - count cannot.
  if (count < 1 || begin < 0 || begin > len - count) {
    int64_t end;
    const std::string end_text = __builtin_add_overflow(begin, count, &end)
                                     ? absl::StrCat(begin, " + ", count)
                                     : absl::StrCat(end);
    return absl::InvalidArgumentError(
        absl::StrCat("chunk ", index, ": tensor ", name, " tokens [", begin,
                     ", ", end_text, ") are not inside [0, ", len, ") (", name,
                     " has ", len, " tokens; token_count must be >= 1)"));
  }
  const int64_t row_bytes = ChunkRowBytes(spec, dtype, tensor);
  if (static_cast<int64_t>(chunk.data().size()) != count * row_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk ", index, ": tensor ", name, " carries ", chunk.data().size(),
        " bytes but ", count, " tokens x ", heads, " heads x ", spec.head_dim,
        " dims of ", DTypeName(dtype), " need ", count * row_bytes));
  }
  return absl::OkStatus();
}

void FillShardRows(v1::TensorChunk* chunk, const RequestLayout::Piece& piece,
                   int64_t row_bytes, v1::ShardRows* rows) {
  rows->set_tensor(chunk->tensor());
  rows->set_batch(chunk->batch());
  const int64_t n = static_cast<int64_t>(piece.positions.size());
  rows->set_first_position(piece.positions.front());
  rows->set_count(n);
  if (!piece.contiguous) {
    *rows->mutable_positions() = {piece.positions.begin(),
                                  piece.positions.end()};
  }
  if (n == chunk->token_count()) {
    rows->set_data(std::move(*chunk->mutable_data()));
  } else {
    rows->set_data(
        chunk->data().substr(piece.first_token * row_bytes, n * row_bytes));
  }
}

}  // namespace ringattn
