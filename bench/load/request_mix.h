#ifndef RINGATTN_BENCH_LOAD_REQUEST_MIX_H_
#define RINGATTN_BENCH_LOAD_REQUEST_MIX_H_

// The requests of the load run: random attention requests of mixed shapes and
// patterns (dense, causal, GQA/MQA, short queries, block-sparse, dilated,
// Hilbert; odd lengths; fp32/fp16/bf16 on the wire), and the check of a
// service result against the float64 reference within a Tolerance; a row that
// sees no key must have LSE -inf; NaN is always wrong. Rows are sampled for
// large requests.

#include <cstdint>
#include <random>
#include <string>

#include "absl/status/status.h"
#include "client/client.h"
#include "core/attention_spec.h"
#include "core/tensor.h"
#include "ringattn/v1/attention.pb.h"

namespace ringattn {

// One attend request: spec, its proto form and inputs (already rounded to the
// wire dtype, so the reference sees what the workers see).
struct LoadRequest {
  std::string kind;  // e.g. "causal", "block-sparse"
  AttentionSpec spec;
  v1::AttentionSpec proto;
  Tensor<float> q, k, v;
  int64_t bytes = 0;  // Q, K and V in fp32
};

// How far a result may be from the float64 reference: |O - ref| <= o * (1 +
// |ref|) per element and |LSE - ref| <= lse * (1 + |ref|).
struct Tolerance {
  double o;
  double lse;
};
// CPU workers compute in fp32.
inline constexpr Tolerance kCpuTolerance{2e-5, 2e-5};
// GPU workers compute in bf16 for bf16 and fp32 wire data (an fp32 request's
// inputs are rounded to bf16 too) and in fp16 for fp16, with fp32
// accumulators and LSE: the bound of the GPU tests (gpu_worker_service_test).
inline constexpr Tolerance kGpuTolerance{3e-2, 1e-2};

// A random request whose Q, K and V take at most `max_bytes` in fp32.
LoadRequest RandomRequest(std::mt19937& rng, int64_t max_bytes);

// Uniform [-1, 1) values of `shape`, rounded to `wire`.
Tensor<float> RandomInput(Shape shape, v1::DType wire, std::mt19937& rng);

// OK if `result` is `spec`'s attention of q, k, v within `tolerance`
// (checking every row of small requests, else the first, the last and random
// rows drawn from `rng`); INTERNAL naming the first bad value otherwise.
absl::Status CheckResult(const AttentionSpec& spec, View<const float> q,
                         View<const float> k, View<const float> v,
                         const AttendResult& result, Tolerance tolerance,
                         std::mt19937& rng);

}  // namespace ringattn

#endif  // RINGATTN_BENCH_LOAD_REQUEST_MIX_H_
