#ifndef RINGATTN_TESTS_ATTENTION_CHECKS_H_
#define RINGATTN_TESTS_ATTENTION_CHECKS_H_

// What the end-to-end tests share: specs, random inputs for a spec, and the
// comparison of a service result with the float64 reference (|O - ref| <= 2e-5
// * (1 + |ref|) per element; rows that see no key exactly 0 with LSE -inf).

#include <cstdint>

#include "client/client.h"
#include "core/attention_spec.h"
#include "core/tensor.h"
#include "gtest/gtest.h"

namespace ringattn {

struct RandomInputs {
  Tensor<float> q, k, v;
};

// n query rows against the same n keys, with these heads, head dim and mask.
AttentionSpec SelfAttentionSpec(int64_t n, int64_t q_heads, int64_t kv_heads,
                                int64_t head_dim, bool causal);

// Uniform [-1, 1) inputs for `spec`, rounded to `wire` so the reference sees
// exactly what the workers see.
RandomInputs MakeRandomInputs(const AttentionSpec& spec, uint32_t seed,
                              v1::DType wire = v1::FP32);

// The spec's proto form for a request (wire dtype and LSE return set).
v1::AttentionSpec RequestSpec(const AttentionSpec& spec,
                              v1::DType wire = v1::FP32);

// Adds a gtest failure unless `result` matches the reference for `inputs`.
void ExpectMatchesReference(const AttentionSpec& spec,
                            const RandomInputs& inputs,
                            const AttendResult& result);

}  // namespace ringattn

#endif  // RINGATTN_TESTS_ATTENTION_CHECKS_H_
