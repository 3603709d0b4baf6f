#ifndef RINGATTN_KERNELS_CPU_REFERENCE_ATTENTION_H_
#define RINGATTN_KERNELS_CPU_REFERENCE_ATTENTION_H_

// The float64 oracle: attention computed directly from the definitions in
// DESIGN.md
// ("Semantics"), one query row and one visible-key test at a time. Slow by
// design; every other path is tested against it. Thread-compatible.

#include <cstdint>
#include <vector>

#include "core/attention_spec.h"
#include "core/tensor.h"

namespace ringattn {

// q: [B, Nq, Hq, D], k/v: [B, Nk, Hkv, D] in fp32 (the values every path sees);
// writes o: [B, Nq, Hq, D] and lse: [B, Nq, Hq, 1] (natural log) in float64, in
// the caller's order. Requires spec.Validate().ok() and shapes matching the
// spec.
void ReferenceAttention(const AttentionSpec& spec, View<const float> q,
                        View<const float> k, View<const float> v,
                        View<double> o, View<double> lse);

// The same for the query rows `rows` (caller's indices) only: writes those rows
// of o and lse and leaves the others untouched. For checking long sequences by
// sampling.
void ReferenceAttentionRows(const AttentionSpec& spec, View<const float> q,
                            View<const float> k, View<const float> v,
                            const std::vector<int64_t>& rows, View<double> o,
                            View<double> lse);

}  // namespace ringattn

#endif  // RINGATTN_KERNELS_CPU_REFERENCE_ATTENTION_H_
