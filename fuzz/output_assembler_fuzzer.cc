// Fuzzes OutputAssembler (client/chunking.h), the client's reassembly of the
// output stream, with a small output shape taken from the first bytes and a
// sequence of arbitrary OutputChunks (fuzz_input.h). Invariants: what it
// accepts never exceeds the output, and it reports the output complete exactly
// when every byte arrived.

#include <cstddef>
#include <cstdint>

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
  const bool with_lse = input.TakeByte() & 1;
  ringattn::OutputAssembler assembler(shape, with_lse);
  ringattn::v1::OutputChunk chunk;
  while (input.Next(&chunk)) {
    const int64_t before = assembler.bytes_received();
    const bool added = assembler.Add(chunk).ok();
    if (!added && assembler.bytes_received() != before) __builtin_trap();
    if (assembler.bytes_received() > assembler.total_bytes()) __builtin_trap();
  }
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
