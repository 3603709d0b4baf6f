// Fuzzes the path an Attend request's bytes take before any compute: the
// header through SpecFromProto and the coordinator's checks, then every chunk
// through CheckChunkRows, the duplicate check (RowCoverage) and routing
// (RequestLayout, FillShardRows), and the ShardRows it becomes through each
// worker's ShardRowsTarget::Place, for 1 to 8 workers. The input is a byte
// choosing the workers and the dtype they stage rows in, then an AttendRequest
// header and chunks (fuzz_input.h); the stream ends, as the coordinator's call
// does, at the first message it refuses.
//
// Invariants: an accepted spec's upload size fits in int64 (the coordinator
// multiplies it out); a chunk the coordinator accepts is accepted by every
// worker it is routed to; and the workers hold every row exactly when the
// coordinator saw every row.

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "core/attention_spec.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "core/typed_tensor.h"
#include "fuzz/fuzz_input.h"
#include "fuzz/proto_mutator.h"
#include "proto/spec_conversion.h"
#include "ringattn/v1/attention.pb.h"
#include "server/chunk_routing.h"
#include "server/request_layout.h"
#include "server/row_coverage.h"
#include "worker/shard_rows.h"

namespace ringattn {
namespace {

// Upload sizes the harness runs; larger ones the coordinator would refuse by
// --max_request_bytes, and they would only slow the fuzzer down.
constexpr int64_t kMaxElements = int64_t{1} << 18;

// The elements of Q, K and V, or nullopt if they overflow int64 (as the
// coordinator's byte count of the request would).
std::optional<int64_t> UploadElements(const AttentionSpec& spec) {
  int64_t q, kv, total;
  if (__builtin_mul_overflow(spec.batch, spec.q_len, &q) ||
      __builtin_mul_overflow(q, spec.q_heads, &q) ||
      __builtin_mul_overflow(q, spec.head_dim, &q) ||
      __builtin_mul_overflow(spec.batch, spec.kv_len, &kv) ||
      __builtin_mul_overflow(kv, spec.kv_heads, &kv) ||
      __builtin_mul_overflow(kv, spec.head_dim, &kv) ||
      __builtin_mul_overflow(kv, 2, &kv) ||
      __builtin_add_overflow(q, kv, &total) ||
      __builtin_mul_overflow(total, 4, &total)) {
    return std::nullopt;
  }
  return total / 4;
}

// One worker's shard of Q, K and V and the targets its rows land in.
struct WorkerShard {
  std::array<TypedTensor, 3> tensors;
  std::array<ShardRowsTarget, 3> targets;
};

void Run(FuzzInput& input) {
  // Workers, and the dtype they stage rows in (fp32 on CPU workers, the
  // compute dtype on GPU workers).
  const uint8_t setup = input.TakeByte();
  const int64_t workers = 1 + setup % 8;
  const DType staged = static_cast<DType>(setup / 8 % 3);
  v1::AttendRequest request;
  if (!input.Next(&request) || !request.has_header()) return;
  const absl::StatusOr<AttentionSpec> spec = SpecFromProto(request.header());
  const absl::StatusOr<DType> dtype =
      DTypeFromProto(request.header().wire_dtype());
  if (!spec.ok() || !dtype.ok()) return;
  const std::optional<int64_t> elements = UploadElements(*spec);
  if (!elements.has_value()) __builtin_trap();
  if (*elements > kMaxElements) return;

  const RequestLayout layout(*spec, workers);
  std::vector<WorkerShard> shards(static_cast<size_t>(workers));
  for (int64_t w = 0; w < workers; ++w) {
    WorkerShard& shard = shards[w];
    const int rank = static_cast<int>(w);
    shard.tensors[0] =
        TypedTensor(staged, Shape{spec->batch, layout.q_layout().ShardLength(w),
                                  spec->q_heads, spec->head_dim});
    for (int t = 1; t < 3; ++t) {
      shard.tensors[t] = TypedTensor(
          staged, Shape{spec->batch, layout.kv_layout().ShardLength(w),
                        spec->kv_heads, spec->head_dim});
    }
    shard.targets[0] =
        ShardRowsTarget("Q", shard.tensors[0].view(), &layout.q_layout(), rank);
    shard.targets[1] = ShardRowsTarget("K", shard.tensors[1].view(),
                                       &layout.kv_layout(), rank);
    shard.targets[2] = ShardRowsTarget("V", shard.tensors[2].view(),
                                       &layout.kv_layout(), rank);
  }
  std::vector<RowCoverage> coverage;  // [tensor * batch + b]
  for (int t = 0; t < 3; ++t) {
    for (int64_t b = 0; b < spec->batch; ++b) {
      coverage.emplace_back(t == 0 ? spec->q_len : spec->kv_len);
    }
  }

  for (int64_t index = 1; input.Next(&request); ++index) {
    if (!request.has_chunk()) return;
    v1::TensorChunk& chunk = *request.mutable_chunk();
    const v1::TensorName tensor = chunk.tensor();
    if (tensor != v1::Q && tensor != v1::K && tensor != v1::V) return;
    if (!CheckChunkRows(*spec, *dtype, chunk, index).ok()) return;
    const int t = tensor == v1::Q ? 0 : tensor == v1::K ? 1 : 2;
    const int64_t begin = chunk.token_offset();
    const int64_t count = chunk.token_count();
    if (coverage[t * spec->batch + chunk.batch()].Mark(begin, begin + count)) {
      return;
    }
    const int64_t row_bytes = ChunkRowBytes(*spec, *dtype, tensor);
    for (const RequestLayout::Piece& piece :
         layout.Route(t != 0, begin, count)) {
      v1::ShardRows rows;
      FillShardRows(&chunk, piece, row_bytes, &rows);
      if (!shards[piece.worker].targets[t].Place(rows, *dtype).ok()) {
        __builtin_trap();
      }
    }
  }

  bool coordinator_complete = true;
  for (const RowCoverage& rows : coverage) {
    coordinator_complete &= !rows.FirstMissing().has_value();
  }
  bool workers_complete = true;
  for (const WorkerShard& shard : shards) {
    for (const ShardRowsTarget& target : shard.targets) {
      workers_complete &= target.CheckComplete().ok();
    }
  }
  if (coordinator_complete != workers_complete) __builtin_trap();
}

}  // namespace
}  // namespace ringattn

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ringattn::FuzzInput input(data, size);
  ringattn::Run(input);
  return 0;
}

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size,
                                          size_t max_size, unsigned int seed) {
  return ringattn::MutateProtoSequence(
      ringattn::v1::AttendRequest::default_instance(), /*param_bytes=*/1, data,
      size, max_size, seed);
}
