#ifndef RINGATTN_SERVER_CHUNK_ROUTING_H_
#define RINGATTN_SERVER_CHUNK_ROUTING_H_

// The coordinator's handling of one uploaded TensorChunk that needs no
// network: checking that it lies inside its tensor, and cutting it into the
// ShardRows messages its rows' workers receive. Pure functions, so that the
// checks can be unit-tested and fuzzed apart from the gRPC call.

#include <cstdint>

#include "absl/status/status.h"
#include "core/attention_spec.h"
#include "core/dtype.h"
#include "ringattn/v1/attention.pb.h"
#include "ringattn/v1/worker.pb.h"
#include "server/request_layout.h"

namespace ringattn {

// Wire bytes of one token row of `tensor` (Q, K or V) in a request of `spec`.
int64_t ChunkRowBytes(const AttentionSpec& spec, DType dtype,
                      v1::TensorName tensor);

// OK if `chunk`, message `index` of the upload and a chunk of Q, K or V, lies
// inside its tensor: an existing batch entry, token rows [token_offset,
// token_offset + token_count) with token_count >= 1, and exactly the data
// bytes those rows take. INVALID_ARGUMENT naming the chunk otherwise.
absl::Status CheckChunkRows(const AttentionSpec& spec, DType dtype,
                            const v1::TensorChunk& chunk, int64_t index);

// Fills `rows` with `piece` of a checked `chunk` (a piece RequestLayout::Route
// returned for the chunk's tokens): its positions and its rows' data. A piece
// that is the whole chunk takes the data over instead of copying it.
void FillShardRows(v1::TensorChunk* chunk, const RequestLayout::Piece& piece,
                   int64_t row_bytes, v1::ShardRows* rows);

}  // namespace ringattn

#endif  // RINGATTN_SERVER_CHUNK_ROUTING_H_
