#ifndef RINGATTN_FUZZ_PROTO_MUTATOR_H_
#define RINGATTN_FUZZ_PROTO_MUTATOR_H_

// A structure-aware mutator for inputs in the FuzzInput format (fuzz_input.h).
// Byte-level mutations rarely survive the length prefixes of a proto sequence,
// and rarely build the ten-byte varints near the int64 limits where overflow
// bugs live; this one decodes the sequence and changes one field of one
// message through protobuf reflection (nested messages and repeated fields
// included), then encodes it again. Targets hand it to libFuzzer from
// LLVMFuzzerCustomMutator.

#include <cstddef>
#include <cstdint>

#include "google/protobuf/message.h"

namespace ringattn {

// Mutates `data` (`size` bytes, room for `max_size`) in place and returns its
// new size: `param_bytes` raw parameter bytes, then messages of the type of
// `prototype`. A quarter of the time, or where no message decodes, it falls
// back to libFuzzer's byte-level mutation of the whole input.
size_t MutateProtoSequence(const google::protobuf::Message& prototype,
                           size_t param_bytes, uint8_t* data, size_t size,
                           size_t max_size, unsigned int seed);

}  // namespace ringattn

#endif  // RINGATTN_FUZZ_PROTO_MUTATOR_H_
