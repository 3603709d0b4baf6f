// Fuzzes ShardRowsTarget::Place (worker/shard_rows.h), where a worker stores
// the rows the coordinator routed to it, with arbitrary ShardRows messages.
// The first bytes pick a small layout (contiguous or zigzag, sequence length,
// workers, this worker's rank), the shape, the wire dtype and the dtype rows
// are staged in; then come the
// messages (fuzz_input.h). Invariants: an accepted message stores exactly the
// rows it carries, a refused one fewer, and the target reports itself complete
// exactly when no row is missing.

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "core/shard_layout.h"
#include "core/tensor.h"
#include "core/typed_tensor.h"
#include "fuzz/fuzz_input.h"
#include "fuzz/proto_mutator.h"
#include "ringattn/v1/worker.pb.h"
#include "worker/shard_rows.h"

namespace ringattn {
namespace {

constexpr size_t kParamBytes = 8;

void Run(FuzzInput& input) {
  const ShardKind kind =
      input.TakeByte() & 1 ? ShardKind::kZigzag : ShardKind::kContiguous;
  const int64_t seq_len = 1 + input.TakeByte() % 64;
  const int64_t workers = 1 + input.TakeByte() % 8;
  const int rank = input.TakeByte() % workers;
  const ShardLayout layout = ShardLayout::Make(kind, seq_len, workers);
  const Shape shape{1 + input.TakeByte() % 3, layout.ShardLength(rank),
                    1 + input.TakeByte() % 3, 1 + input.TakeByte() % 5};
  // The wire dtype, and the one the worker stages rows in.
  const uint8_t dtypes = input.TakeByte();
  const DType dtype = static_cast<DType>(dtypes % 3);
  TypedTensor rows(static_cast<DType>(dtypes / 3 % 3), shape);
  ShardRowsTarget target("K", rows.view(), &layout, rank);
  v1::ShardRows message;
  while (input.Next(&message)) {
    const int64_t before = target.missing();
    const bool placed = target.Place(message, dtype).ok();
    const int64_t stored = before - target.missing();
    const int64_t count = message.positions_size() > 0
                              ? message.positions_size()
                              : message.count();
    // A refused message may have stored the rows before the bad one (the
    // request fails then anyway), never all of them.
    if (placed ? stored != count
               : stored < 0 || stored >= std::max<int64_t>(count, 1)) {
      __builtin_trap();
    }
  }
  if (target.missing() < 0 ||
      target.CheckComplete().ok() != (target.missing() == 0)) {
    __builtin_trap();
  }
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
      ringattn::v1::ShardRows::default_instance(), ringattn::kParamBytes, data,
      size, max_size, seed);
}
