#include "tests/attention_checks.h"

#include <cmath>
#include <random>

#include "core/dtype.h"
#include "core/random_tensor.h"
#include "kernels/cpu/reference_attention.h"
#include "proto/spec_conversion.h"

namespace ringattn {

RandomInputs MakeRandomInputs(const AttentionSpec& spec, uint32_t seed,
                              v1::DType wire) {
  std::mt19937 rng(seed);
  const DType dtype = *DTypeFromProto(wire);
  auto random = [&](Shape shape) {
    Tensor<float> t = RandomTensor(shape, rng);
    std::vector<uint16_t> narrow(t.values().size());
    if (dtype != DType::kFloat32) {
      ConvertFromFloat(dtype, t.data(), narrow.data(), t.shape().NumElements());
      ConvertToFloat(dtype, narrow.data(), t.data(), t.shape().NumElements());
    }
    return t;
  };
  RandomInputs in;
  in.q = random({spec.batch, spec.q_len, spec.q_heads, spec.head_dim});
  in.k = random({spec.batch, spec.kv_len, spec.kv_heads, spec.head_dim});
  in.v = random({spec.batch, spec.kv_len, spec.kv_heads, spec.head_dim});
  return in;
}

AttentionSpec SelfAttentionSpec(int64_t n, int64_t q_heads, int64_t kv_heads,
                                int64_t head_dim, bool causal) {
  AttentionSpec spec;
  spec.q_len = spec.kv_len = n;
  spec.q_heads = q_heads;
  spec.kv_heads = kv_heads;
  spec.head_dim = head_dim;
  spec.causal = causal;
  return spec;
}

v1::AttentionSpec RequestSpec(const AttentionSpec& spec, v1::DType wire) {
  v1::AttentionSpec proto = SpecToProto(spec);
  proto.set_wire_dtype(wire);
  proto.set_return_lse(true);
  return proto;
}

void ExpectMatchesReference(const AttentionSpec& spec,
                            const RandomInputs& inputs,
                            const AttendResult& result) {
  Tensor<double> o_ref(inputs.q.shape());
  Tensor<double> lse_ref({spec.batch, spec.q_len, spec.q_heads, 1});
  ReferenceAttention(spec, inputs.q.view(), inputs.k.view(), inputs.v.view(),
                     o_ref.view(), lse_ref.view());
  ASSERT_EQ(result.output.shape(), inputs.q.shape());
  double worst = 0;
  for (size_t i = 0; i < o_ref.values().size(); ++i) {
    const double got = result.output.values()[i];
    ASSERT_FALSE(std::isnan(got)) << "NaN at element " << i;
    worst = std::max(worst, std::fabs(got - o_ref.values()[i]) /
                                (1 + std::fabs(o_ref.values()[i])));
  }
  EXPECT_LE(worst, 2e-5);
  // Public LSE layout: [B, Hq, Nq]; the reference's: [B, Nq, Hq, 1].
  ASSERT_EQ(result.lse.size(), lse_ref.values().size());
  for (int64_t b = 0; b < spec.batch; ++b) {
    for (int64_t h = 0; h < spec.q_heads; ++h) {
      for (int64_t n = 0; n < spec.q_len; ++n) {
        const double want = lse_ref.view().At(b, n, h, 0);
        const float got = result.lse[(b * spec.q_heads + h) * spec.q_len + n];
        if (std::isinf(want)) {
          ASSERT_EQ(got, -INFINITY) << "row " << n << " sees no key";
        } else {
          ASSERT_NEAR(got, want, 2e-5 * (1 + std::fabs(want)))
              << "b=" << b << " h=" << h << " n=" << n;
        }
      }
    }
  }
}

}  // namespace ringattn
