// DecodeAttention against the float64 reference (reference_attention.h) on
// fresh random inputs in [-1, 1): few query rows (1, 3, 17) and more, prime key
// counts, head dims 64, 80, 128 and odd ones, GQA and MQA, causal and dense,
// strided slices, K and V in fp32 and in bf16 (the reference then takes the
// same bf16 values); and against BlockAttention on a block-sparse task at
// non-zero positions. fp32 tolerance: |o - ref| <= 2e-5 * (1 + |ref|), the
// same for LSE; rows that see no key exactly O = 0, LSE = -inf. Outputs are
// NaN-filled before each run.

#include "kernels/cpu/decode_attention.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/attention_spec.h"
#include "core/block_mask.h"
#include "core/dtype.h"
#include "core/random_tensor.h"
#include "core/tensor.h"
#include "gtest/gtest.h"
#include "kernels/cpu/block_attention.h"
#include "kernels/cpu/reference_attention.h"

namespace ringattn {
namespace {

constexpr double kTolerance = 2e-5;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

struct Case {
  std::string name;
  int64_t batch = 1;
  int64_t nq = 1;
  int64_t nk = 1;
  int64_t q_heads = 1;
  int64_t kv_heads = 1;
  int64_t dim = 64;
  bool causal = false;
  bool strided = false;  // q, k, v are slices of longer tensors
  bool bf16 = false;     // k and v held in bf16
};

// `shape` as a view into a random tensor, or into the middle of a longer one.
View<const float> RandomView(Shape shape, bool strided, std::mt19937& rng,
                             std::vector<Tensor<float>>& storage) {
  Shape full = shape;
  if (strided) full.seq += 7;
  storage.push_back(RandomTensor(full, rng));
  View<const float> view = storage.back().view();
  return strided ? view.Slice(3, 3 + shape.seq) : view;
}

// Rounds `rows` to bf16: returns them as bf16 bits (kept in `bits`, strided
// like a slice of a longer tensor when `strided`) and leaves the same values
// widened to fp32 in `widened`, for the reference.
KvView RoundToBFloat16(View<const float> rows, bool strided,
                       std::vector<Tensor<uint16_t>>& bits,
                       std::vector<Tensor<float>>& widened) {
  const Shape shape = rows.shape();
  Shape full = shape;
  if (strided) full.seq += 7;
  bits.emplace_back(full);
  widened.emplace_back(shape);
  const int64_t first = strided ? 3 : 0;
  const View<uint16_t> to = bits.back().view().Slice(first, first + shape.seq);
  for (int64_t b = 0; b < shape.batch; ++b) {
    for (int64_t n = 0; n < shape.seq; ++n) {
      for (int64_t h = 0; h < shape.heads; ++h) {
        for (int64_t d = 0; d < shape.dim; ++d) {
          to.At(b, n, h, d) = FloatToBFloat16(rows.At(b, n, h, d));
          widened.back().view().At(b, n, h, d) =
              BFloat16ToFloat(to.At(b, n, h, d));
        }
      }
    }
  }
  return KvView::BFloat16(to);
}

::testing::AssertionResult Near(const char* what, int64_t index, double got,
                                double want) {
  if (std::isinf(want) && got == want) return ::testing::AssertionSuccess();
  if (std::abs(got - want) <= kTolerance * (1 + std::abs(want))) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << what << "[" << index << "] = " << got << ", reference " << want;
}

class DecodeAttentionTest : public ::testing::TestWithParam<Case> {};

TEST_P(DecodeAttentionTest, MatchesFloat64Reference) {
  const Case& c = GetParam();
  const uint32_t seed = std::random_device()();
  std::mt19937 rng(seed);
  std::vector<Tensor<float>> storage;
  BlockAttentionArgs args;
  args.q =
      RandomView({c.batch, c.nq, c.q_heads, c.dim}, c.strided, rng, storage);
  View<const float> k =
      RandomView({c.batch, c.nk, c.kv_heads, c.dim}, c.strided, rng, storage);
  View<const float> v =
      RandomView({c.batch, c.nk, c.kv_heads, c.dim}, c.strided, rng, storage);
  args.k = k;
  args.v = v;
  std::vector<Tensor<uint16_t>> bits;
  std::vector<Tensor<float>> widened;
  if (c.bf16) {
    args.k = RoundToBFloat16(k, c.strided, bits, widened);
    args.v = RoundToBFloat16(v, c.strided, bits, widened);
    k = widened[0].view();
    v = widened[1].view();
  }
  args.scale = 1.0f / std::sqrt(static_cast<float>(c.dim));
  args.mask.causal = c.causal;
  args.mask.causal_shift = c.nk - c.nq;
  Tensor<float> o({c.batch, c.nq, c.q_heads, c.dim});
  Tensor<float> lse({c.batch, c.nq, c.q_heads, 1});
  std::fill(o.data(), o.data() + o.shape().NumElements(), kNaN);
  std::fill(lse.data(), lse.data() + lse.shape().NumElements(), kNaN);
  DecodeAttention(args, o.view(), lse.view());

  AttentionSpec spec;
  spec.batch = c.batch;
  spec.q_len = c.nq;
  spec.kv_len = c.nk;
  spec.q_heads = c.q_heads;
  spec.kv_heads = c.kv_heads;
  spec.head_dim = c.dim;
  spec.causal = c.causal;
  Tensor<double> want_o(o.shape());
  Tensor<double> want_lse(lse.shape());
  ReferenceAttention(spec, args.q, k, v, want_o.view(), want_lse.view());
  for (int64_t i = 0; i < o.shape().NumElements(); ++i) {
    ASSERT_TRUE(Near("o", i, o.data()[i], want_o.data()[i])) << "seed " << seed;
  }
  for (int64_t i = 0; i < lse.shape().NumElements(); ++i) {
    ASSERT_TRUE(Near("lse", i, lse.data()[i], want_lse.data()[i]))
        << "seed " << seed;
  }
}

std::vector<Case> Cases() {
  return {
      {"OneRowGqaCausal", 1, 1, 4099, 32, 8, 128, true},
      {"OneRowMqaDense", 2, 1, 1009, 8, 1, 64, false},
      // Four packed rows: keys and values read in place, here strided.
      {"OneRowGqaStrided", 2, 1, 3001, 8, 2, 64, true, true},
      {"ThreeRowsCausal", 1, 3, 4099, 8, 2, 128, true},
      {"SeventeenRowsDim80", 2, 17, 2003, 6, 2, 80, true},
      {"SeventeenRowsMqa", 1, 17, 4099, 4, 1, 64, false},
      {"OddDimStrided", 2, 3, 1009, 4, 2, 37, true, true},
      {"MoreQueriesThanKeys", 1, 17, 5, 2, 1, 64, true},
      {"OneKey", 1, 3, 1, 4, 2, 128, false},
      {"NoKeys", 1, 3, 0, 4, 2, 64, false},
      {"LongerQueryBlock", 1, 100, 1009, 4, 2, 128, true},
      {"Dim256", 1, 2, 3001, 2, 1, 256, true},
      // K and V in bf16: read in place (one row of 4-to-1 GQA at D 128 and
      // 64, strided), transposed, and at an odd head dim.
      {"Bf16OneRowGqaCausal", 1, 1, 4099, 32, 8, 128, true, false, true},
      {"Bf16OneRowGqaStrided", 2, 1, 3001, 8, 2, 64, true, true, true},
      {"Bf16SeventeenRowsDim80", 2, 17, 2003, 6, 2, 80, true, false, true},
      {"Bf16OddDimStrided", 2, 3, 1009, 4, 2, 37, false, true, true},
  };
}

INSTANTIATE_TEST_SUITE_P(Shapes, DecodeAttentionTest,
                         ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.name;
                         });

// Block-sparse masks and global positions as in a ring task: the same result
// as BlockAttention (itself tested against a brute force).
TEST(DecodeAttentionMaskTest, MatchesBlockAttentionOnBlockSparseTask) {
  const uint32_t seed = std::random_device()();
  std::mt19937 rng(seed);
  const Shape q_shape{1, 5, 8, 64};
  const Shape kv_shape{1, 3001, 2, 64};
  const Tensor<float> q = RandomTensor(q_shape, rng);
  const Tensor<float> k = RandomTensor(kv_shape, rng);
  const Tensor<float> v = RandomTensor(kv_shape, rng);
  BlockSparseRules rules;
  rules.block_size = 64;
  rules.local = 1;
  rules.global = 2;
  const BlockMask blocks = BlockMask::FromRules(rules, 8000);
  BlockAttentionArgs args;
  args.q = q.view();
  args.k = k.view();
  args.v = v.view();
  args.q_position = 4000;
  args.k_position = 1000;
  args.scale = 0.125f;
  args.mask.causal = true;
  args.mask.causal_shift = 0;
  args.mask.blocks = &blocks;
  Tensor<float> o(q_shape), want_o(q_shape);
  Tensor<float> lse({1, 5, 8, 1}), want_lse({1, 5, 8, 1});
  std::fill(o.data(), o.data() + o.shape().NumElements(), kNaN);
  std::fill(lse.data(), lse.data() + lse.shape().NumElements(), kNaN);
  DecodeAttention(args, o.view(), lse.view());
  BlockAttention(args, want_o.view(), want_lse.view());
  for (int64_t i = 0; i < o.shape().NumElements(); ++i) {
    ASSERT_TRUE(Near("o", i, o.data()[i], want_o.data()[i])) << "seed " << seed;
  }
  for (int64_t i = 0; i < lse.shape().NumElements(); ++i) {
    ASSERT_TRUE(Near("lse", i, lse.data()[i], want_lse.data()[i]))
        << "seed " << seed;
  }
}

}  // namespace
}  // namespace ringattn
