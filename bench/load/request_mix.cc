#include "bench/load/request_mix.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/dtype.h"
#include "core/random_tensor.h"
#include "kernels/cpu/reference_attention.h"
#include "proto/spec_conversion.h"

namespace ringattn {
namespace {

// Requests with at most this many multiply-adds are checked in full.
constexpr double kFullCheckMacs = 2e7;
constexpr int kSampledRows = 12;

int64_t Uniform(std::mt19937& rng, int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

template <typename T>
const T& Pick(std::mt19937& rng, const std::vector<T>& choices) {
  return choices[Uniform(rng, 0, choices.size() - 1)];
}

// Log-uniform in [1, hi]: short and long sequences alike.
int64_t Length(std::mt19937& rng, int64_t hi) {
  const double x = std::uniform_real_distribution<double>(
      0, std::log(static_cast<double>(hi) + 1))(rng);
  return std::clamp<int64_t>(static_cast<int64_t>(std::exp(x)), 1, hi);
}

int64_t Bytes(const AttentionSpec& s) {
  return 4 * s.batch * s.head_dim *
         (s.q_len * s.q_heads + 2 * s.kv_len * s.kv_heads);
}

// A random spec of `kind`; it may break the byte budget or be invalid (the
// caller draws again).
AttentionSpec RandomSpec(std::mt19937& rng, const std::string& kind) {
  AttentionSpec s;
  s.batch = Uniform(rng, 0, 4) == 0 ? 2 : 1;
  s.head_dim = Pick<int64_t>(rng, {64, 64, 128, 80, 32, 57});
  s.kv_heads = Pick<int64_t>(rng, {1, 2, 4});
  s.q_heads = s.kv_heads;
  s.q_len = s.kv_len = Length(rng, 8192);
  s.causal = Uniform(rng, 0, 1) == 1;
  if (kind == "dense") {
    s.causal = false;
  } else if (kind == "causal") {
    s.causal = true;
  } else if (kind == "gqa") {
    s.q_heads = s.kv_heads * Pick<int64_t>(rng, {2, 4});
  } else if (kind == "mqa") {
    s.kv_heads = 1;
    s.q_heads = Pick<int64_t>(rng, {4, 8});
  } else if (kind == "short-query") {
    s.q_heads = s.kv_heads * Pick<int64_t>(rng, {1, 4});
    s.q_len = Length(rng, 64);
  } else if (kind == "block-sparse") {
    BlockSparseRules rules;
    rules.block_size = Pick<int64_t>(rng, {16, 32, 64, 100});
    rules.local = Uniform(rng, -1, 2);
    rules.global = Uniform(rng, 0, 1);
    rules.dilated = Pick<int64_t>(rng, {0, 0, 3});
    rules.random = Uniform(rng, 0, 2);
    rules.seed = rng();
    s.block_sparse = rules;
  } else if (kind == "dilated") {
    s.q_heads = Pick<int64_t>(rng, {2, 4});
    s.kv_heads = Uniform(rng, 0, 1) == 0 ? s.q_heads : 1;
    const int64_t w = Pick<int64_t>(rng, {16, 64, 256});
    s.dilated = {{w, 1}, {2 * w, 2}, {4 * w, 4}};
    s.combine = Uniform(rng, 0, 1) == 0 ? DilatedCombine::kLse
                                        : DilatedCombine::kHeadGroups;
  } else if (kind == "hilbert") {
    const int64_t height = Uniform(rng, 1, 70);
    const int64_t width = Uniform(rng, 1, 70);
    s.hilbert = HilbertGrid{height, width};
    s.q_len = s.kv_len = height * width;
  }
  return s;
}

}  // namespace

Tensor<float> RandomInput(Shape shape, v1::DType wire, std::mt19937& rng) {
  Tensor<float> t = RandomTensor(shape, rng);
  const DType dtype = *DTypeFromProto(wire);
  if (dtype != DType::kFloat32) {
    std::vector<uint16_t> narrow(t.values().size());
    ConvertFromFloat(dtype, t.data(), narrow.data(), t.values().size());
    ConvertToFloat(dtype, narrow.data(), t.data(), t.values().size());
  }
  return t;
}

LoadRequest RandomRequest(std::mt19937& rng, int64_t max_bytes) {
  static const std::vector<std::string> kKinds = {
      "dense",       "causal",       "gqa",     "mqa",
      "short-query", "block-sparse", "dilated", "hilbert"};
  LoadRequest r;
  r.kind = Pick(rng, kKinds);
  do {
    r.spec = RandomSpec(rng, r.kind);
  } while (Bytes(r.spec) > max_bytes || !r.spec.Validate().ok());
  r.bytes = Bytes(r.spec);
  const v1::DType wire =
      Pick<v1::DType>(rng, {v1::FP32, v1::FP32, v1::FP16, v1::BF16});
  r.proto = SpecToProto(r.spec);
  r.proto.set_wire_dtype(wire);
  r.proto.set_return_lse(true);
  const AttentionSpec& s = r.spec;
  r.q = RandomInput({s.batch, s.q_len, s.q_heads, s.head_dim}, wire, rng);
  r.k = RandomInput({s.batch, s.kv_len, s.kv_heads, s.head_dim}, wire, rng);
  r.v = RandomInput({s.batch, s.kv_len, s.kv_heads, s.head_dim}, wire, rng);
  return r;
}

absl::Status CheckResult(const AttentionSpec& spec, View<const float> q,
                         View<const float> k, View<const float> v,
                         const AttendResult& result, Tolerance tolerance,
                         std::mt19937& rng) {
  const Shape shape = q.shape();
  if (result.output.shape() != shape) {
    return absl::InternalError("output has the wrong shape");
  }
  if (result.lse.size() !=
      static_cast<size_t>(shape.NumElements() / shape.dim)) {
    return absl::InternalError(
        absl::StrCat("LSE has ", result.lse.size(), " values"));
  }
  std::vector<int64_t> rows;
  const double macs = static_cast<double>(spec.batch) * spec.q_len *
                      spec.kv_len * spec.q_heads * spec.head_dim;
  if (macs <= kFullCheckMacs || spec.q_len <= kSampledRows) {
    for (int64_t n = 0; n < spec.q_len; ++n) rows.push_back(n);
  } else {
    rows = {0, spec.q_len - 1};
    while (rows.size() < kSampledRows) {
      rows.push_back(Uniform(rng, 1, spec.q_len - 2));
    }
  }
  Tensor<double> o_ref(shape);
  Tensor<double> lse_ref({spec.batch, spec.q_len, spec.q_heads, 1});
  ReferenceAttentionRows(spec, q, k, v, rows, o_ref.view(), lse_ref.view());
  for (int64_t b = 0; b < spec.batch; ++b) {
    for (int64_t n : rows) {
      for (int64_t h = 0; h < spec.q_heads; ++h) {
        const std::string where = absl::StrCat("b=", b, " n=", n, " h=", h);
        const double want_lse = lse_ref.view().At(b, n, h, 0);
        // Public LSE layout: [B, Hq, Nq].
        const float got_lse =
            result.lse[(b * spec.q_heads + h) * spec.q_len + n];
        const bool lse_ok = std::isinf(want_lse)
                                ? got_lse == -INFINITY
                                : std::fabs(got_lse - want_lse) <=
                                      tolerance.lse * (1 + std::fabs(want_lse));
        if (!lse_ok) {
          return absl::InternalError(absl::StrCat(
              "LSE at ", where, ": got ", got_lse, ", want ", want_lse));
        }
        for (int64_t d = 0; d < spec.head_dim; ++d) {
          const double want = o_ref.view().At(b, n, h, d);
          const float got = result.output.view().At(b, n, h, d);
          if (!(std::fabs(got - want) <= tolerance.o * (1 + std::fabs(want)))) {
            return absl::InternalError(absl::StrCat(
                "O at ", where, " d=", d, ": got ", got, ", want ", want));
          }
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace ringattn
