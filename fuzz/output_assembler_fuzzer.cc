// Fuzzes OutputAssembler (client/chunking.h), the client's reassembly of the
// output stream, with a small output shape, dtype and mode (kept or handed to
// a consumer) taken from the first bytes and a sequence of arbitrary
// OutputChunks (fuzz_input.h). Invariants: what it accepts never exceeds the
// output, and it reports the output complete exactly when every byte arrived.

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "client/chunking.h"
#include "fuzz/fuzz_input.h"
#include "fuzz/proto_mutator.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ringattn::FuzzInput input(data, size);
  ringattn::Shape shape;
  shape.batch = 1 + input.TakeByte() % 3;
  shape.seq = 1 + input.TakeByte() % 64;
  shape.heads = 1 + input.TakeByte() % 4;
  shape.dim = 1 + input.TakeByte() % 8;
  // LSE or not, the wire dtype of O, and whether a consumer takes the chunks.
  const uint8_t mode = input.TakeByte();
  const bool with_lse = mode & 1;
  const auto dtype = static_cast<ringattn::DType>(mode / 2 % 3);
  int64_t consumed = 0;
  ringattn::OutputAssembler assembler =
      mode & 8 ? ringattn::OutputAssembler(
                     shape, with_lse, dtype,
                     [&consumed](const ringattn::v1::OutputChunk& chunk) {
                       consumed += chunk.token_count();
                       return absl::OkStatus();
                     })
               : ringattn::OutputAssembler(shape, with_lse, dtype);
  ringattn::v1::OutputChunk chunk;
  while (input.Next(&chunk)) {
    const int64_t before = assembler.bytes_received();
    const bool added = assembler.Add(chunk).ok();
    if (!added && assembler.bytes_received() != before) __builtin_trap();
    if (assembler.bytes_received() > assembler.total_bytes()) __builtin_trap();
  }
  if (consumed > shape.batch * shape.seq) __builtin_trap();
  const bool complete = assembler.CheckComplete().ok();
  if (complete != (assembler.bytes_received() == assembler.total_bytes())) {
    __builtin_trap();
  }
  return 0;
}

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size,
                                          size_t max_size, unsigned int seed) {
  return ringattn::MutateProtoSequence(
      ringattn::v1::OutputChunk::default_instance(), /*param_bytes=*/5, data,
      size, max_size, seed);
}
