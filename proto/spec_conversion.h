#ifndef RINGATTN_PROTO_SPEC_CONVERSION_H_
#define RINGATTN_PROTO_SPEC_CONVERSION_H_

// Conversions between the wire types of attention.proto and core's types.

#include "absl/status/statusor.h"
#include "core/attention_spec.h"
#include "core/dtype.h"
#include "ringattn/v1/attention.pb.h"

namespace ringattn {

// The core spec a request describes, validated: INVALID_ARGUMENT naming the
// field otherwise.
absl::StatusOr<AttentionSpec> SpecFromProto(const v1::AttentionSpec& proto);

// The wire form of `spec` (wire dtype and options that core does not know stay
// unset).
v1::AttentionSpec SpecToProto(const AttentionSpec& spec);

// The core dtype of a wire dtype; INVALID_ARGUMENT for DTYPE_UNSPECIFIED or
// unknown values.
absl::StatusOr<DType> DTypeFromProto(v1::DType dtype);
v1::DType DTypeToProto(DType dtype);

// The dtype of O that `spec` asks for: its output_dtype, fp32 where unset;
// INVALID_ARGUMENT for unknown values.
absl::StatusOr<DType> OutputDType(const v1::AttentionSpec& spec);

}  // namespace ringattn

#endif  // RINGATTN_PROTO_SPEC_CONVERSION_H_
