// BlockAttention against a float64 brute force of the same task written here:
// global positions, causal shift, block mask, GQA and scale, one query row at a
// time, K and V in fp32 and in bf16. Inputs are fresh uniform random values in
// [-1, 1) from a fixed seed.
// fp32 tolerance: max |O - O_ref| <= 2e-5 * max |O_ref| and
// |LSE - LSE_ref| <= 2e-5 * (1 + |LSE_ref|); rows that see no key must be
// exactly O = 0, LSE = -inf, and nothing may be NaN.

#include "kernels/cpu/block_attention.h"

#include <algorithm>
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
#include "kernels/cpu/kv_view.h"

namespace ringattn {
namespace {

constexpr double kTolerance = 2e-5;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// One task: its sizes, positions and masking. The default scale is 1/sqrt(D).
struct Task {
  int64_t batch = 1;
  int64_t nq = 1;
  int64_t nk = 1;
  int64_t q_heads = 1;
  int64_t kv_heads = 1;
  int64_t dim = 64;
  int64_t q_position = 0;
  int64_t k_position = 0;
  float scale = 0;
  TileMask mask;
  // Whether q, k, v, o and lse are slices of longer tensors (seq-strided).
  bool strided = false;
  // Whether k and v are held in bf16 (the brute force takes the same values).
  bool bf16 = false;
};

// Positions of padding before and after a strided slice.
constexpr int64_t kPadBefore = 3;
constexpr int64_t kPadAfter = 5;
constexpr float kSentinel = 12345.0f;

// A tensor holding `shape` as a view: all of it, or when `strided` a slice
// between padding rows.
struct Buffer {
  Tensor<float> storage;
  View<float> view;
};

Buffer MakeBuffer(Shape shape, bool strided, std::mt19937& rng) {
  Buffer buffer;
  Shape full = shape;
  if (strided) full.seq += kPadBefore + kPadAfter;
  buffer.storage = RandomTensor(full, rng);
  buffer.view = buffer.storage.view();
  if (strided) {
    buffer.view = buffer.view.Slice(kPadBefore, kPadBefore + shape.seq);
  }
  return buffer;
}

// The float64 brute force: o [B][nq][Hq][D] and lse [B][nq][Hq].
struct Expected {
  std::vector<double> o;
  std::vector<double> lse;
};

bool Visible(const Task& task, int64_t q_pos, int64_t k_pos) {
  if (task.mask.causal && k_pos > q_pos + task.mask.causal_shift) return false;
  if (task.mask.blocks != nullptr) {
    const int64_t bs = task.mask.blocks->block_size();
    if (!task.mask.blocks->Allowed(q_pos / bs, k_pos / bs)) return false;
  }
  return true;
}

// Rounds the values of `buffer` to bf16 in place and returns them as bf16 bits
// laid out alike.
Tensor<uint16_t> RoundToBFloat16(Buffer& buffer) {
  Tensor<uint16_t> bits(buffer.storage.shape());
  std::vector<float>& values = buffer.storage.values();
  for (size_t i = 0; i < values.size(); ++i) {
    bits.values()[i] = FloatToBFloat16(values[i]);
    values[i] = BFloat16ToFloat(bits.values()[i]);
  }
  return bits;
}

// `bits` viewed as `buffer` views its storage.
KvView BFloat16Like(const Buffer& buffer, const Tensor<uint16_t>& bits) {
  const View<const uint16_t> all = bits.view();
  const int64_t first = (buffer.view.data() - buffer.storage.data()) /
                        buffer.storage.view().seq_stride();
  return KvView::BFloat16(all.Slice(first, first + buffer.view.shape().seq));
}

// `k` and `v` are args' keys and values in fp32.
Expected BruteForce(const Task& task, const BlockAttentionArgs& args,
                    View<const float> k_rows, View<const float> v_rows) {
  const int64_t group = task.q_heads / task.kv_heads;
  Expected out;
  out.o.assign(task.batch * task.nq * task.q_heads * task.dim, 0.0);
  out.lse.assign(task.batch * task.nq * task.q_heads,
                 -std::numeric_limits<double>::infinity());
  std::vector<double> scores(task.nk);
  for (int64_t b = 0; b < task.batch; ++b) {
    for (int64_t a = 0; a < task.nq; ++a) {
      for (int64_t h = 0; h < task.q_heads; ++h) {
        const int64_t g = h / group;
        const float* q = args.q.Row(b, a, h);
        double max_score = -std::numeric_limits<double>::infinity();
        for (int64_t c = 0; c < task.nk; ++c) {
          scores[c] = -std::numeric_limits<double>::infinity();
          if (!Visible(task, task.q_position + a, task.k_position + c)) {
            continue;
          }
          const float* k = k_rows.Row(b, c, g);
          double dot = 0;
          for (int64_t d = 0; d < task.dim; ++d) dot += double{q[d]} * k[d];
          scores[c] = dot * args.scale;
          max_score = std::max(max_score, scores[c]);
        }
        if (std::isinf(max_score)) continue;  // no visible key
        const int64_t row = (b * task.nq + a) * task.q_heads + h;
        double* o = &out.o[row * task.dim];
        double sum = 0;
        for (int64_t c = 0; c < task.nk; ++c) {
          if (std::isinf(scores[c])) continue;
          const double p = std::exp(scores[c] - max_score);
          sum += p;
          const float* v = v_rows.Row(b, c, g);
          for (int64_t d = 0; d < task.dim; ++d) o[d] += p * v[d];
        }
        for (int64_t d = 0; d < task.dim; ++d) o[d] /= sum;
        out.lse[row] = max_score + std::log(sum);
      }
    }
  }
  return out;
}

// Runs BlockAttention on fresh random inputs and checks it against the brute
// force. Counts the rows that saw no key into `rows_without_keys` if set.
void ExpectMatchesBruteForce(const Task& task,
                             int64_t* rows_without_keys = nullptr) {
  std::mt19937 rng(7);
  const Shape q_shape{task.batch, task.nq, task.q_heads, task.dim};
  const Shape kv_shape{task.batch, task.nk, task.kv_heads, task.dim};
  const Buffer q = MakeBuffer(q_shape, task.strided, rng);
  Buffer k = MakeBuffer(kv_shape, task.strided, rng);
  Buffer v = MakeBuffer(kv_shape, task.strided, rng);
  Buffer o = MakeBuffer(q_shape, task.strided, rng);
  Buffer lse =
      MakeBuffer({task.batch, task.nq, task.q_heads, 1}, task.strided, rng);
  std::fill(o.storage.values().begin(), o.storage.values().end(), kSentinel);
  std::fill(lse.storage.values().begin(), lse.storage.values().end(),
            kSentinel);

  BlockAttentionArgs args;
  args.q = q.view;
  args.k = k.view;
  args.v = v.view;
  Tensor<uint16_t> k_bits, v_bits;
  if (task.bf16) {
    k_bits = RoundToBFloat16(k);
    v_bits = RoundToBFloat16(v);
    args.k = BFloat16Like(k, k_bits);
    args.v = BFloat16Like(v, v_bits);
  }
  args.q_position = task.q_position;
  args.k_position = task.k_position;
  args.scale = task.scale != 0 ? task.scale
                               : 1.0f / std::sqrt(static_cast<float>(task.dim));
  args.mask = task.mask;
  BlockAttention(args, o.view, lse.view);
  const Expected expected = BruteForce(task, args, k.view, v.view);

  double max_ref = 0;
  for (double x : expected.o) max_ref = std::max(max_ref, std::abs(x));
  const double o_tolerance = kTolerance * std::max(max_ref, 1e-3);
  double max_error = 0;
  int64_t empty_rows = 0;
  for (int64_t b = 0; b < task.batch; ++b) {
    for (int64_t a = 0; a < task.nq; ++a) {
      for (int64_t h = 0; h < task.q_heads; ++h) {
        const int64_t row = (b * task.nq + a) * task.q_heads + h;
        const float* o_row = o.view.Row(b, a, h);
        const float lse_value = *lse.view.Row(b, a, h);
        const double lse_ref = expected.lse[row];
        ASSERT_FALSE(std::isnan(lse_value)) << "b=" << b << " a=" << a;
        if (std::isinf(lse_ref)) {
          ++empty_rows;
          ASSERT_EQ(lse_value, kNegInf) << "b=" << b << " a=" << a;
          for (int64_t d = 0; d < task.dim; ++d) {
            ASSERT_EQ(o_row[d], 0.0f) << "b=" << b << " a=" << a;
          }
          continue;
        }
        ASSERT_NEAR(lse_value, lse_ref, kTolerance * (1 + std::abs(lse_ref)))
            << "b=" << b << " a=" << a << " h=" << h;
        for (int64_t d = 0; d < task.dim; ++d) {
          ASSERT_FALSE(std::isnan(o_row[d]));
          max_error = std::max(
              max_error, std::abs(o_row[d] - expected.o[row * task.dim + d]));
        }
      }
    }
  }
  EXPECT_LE(max_error, o_tolerance) << "max |O_ref| = " << max_ref;
  if (rows_without_keys != nullptr) *rows_without_keys = empty_rows;

  if (task.strided) {  // the padding rows of the outputs are untouched
    for (const Buffer* out : {&o, &lse}) {
      const Shape& full = out->storage.shape();
      const int64_t row_floats = full.heads * full.dim;
      for (int64_t b = 0; b < full.batch; ++b) {
        for (int64_t n = 0; n < full.seq; ++n) {
          if (n >= kPadBefore && n < full.seq - kPadAfter) continue;
          const float* row = out->storage.view().Row(b, n, 0);
          for (int64_t i = 0; i < row_floats; ++i) {
            ASSERT_EQ(row[i], kSentinel) << "b=" << b << " n=" << n;
          }
        }
      }
    }
  }
}

TEST(BlockAttention, DenseMatchesReferenceForHeadDims) {
  for (int64_t dim : {64, 80, 128}) {
    SCOPED_TRACE("dim=" + std::to_string(dim));
    Task task;
    task.nq = 200;
    task.nk = 300;
    task.q_heads = 2;
    task.kv_heads = 2;
    task.dim = dim;
    ExpectMatchesBruteForce(task);
  }
}

TEST(BlockAttention, GenericHeadDimsMatchReference) {
  for (int64_t dim : {1, 8, 33, 200, 256}) {
    SCOPED_TRACE("dim=" + std::to_string(dim));
    Task task;
    task.nq = 70;
    task.nk = 130;
    task.dim = dim;
    ExpectMatchesBruteForce(task);
  }
}

TEST(BlockAttention, DenseMatchesReferenceForOddLengths) {
  const int64_t lengths[] = {1, 7, 257, 1000};
  for (int64_t nq : lengths) {
    for (int64_t nk : lengths) {
      SCOPED_TRACE("nq=" + std::to_string(nq) + " nk=" + std::to_string(nk));
      Task task;
      task.nq = nq;
      task.nk = nk;
      task.dim = 64;
      ExpectMatchesBruteForce(task);
    }
  }
}

TEST(BlockAttention, CausalMatchesReferenceForOddLengths) {
  const int64_t lengths[] = {1, 7, 257, 1000};
  for (int64_t nq : lengths) {
    for (int64_t nk : lengths) {
      SCOPED_TRACE("nq=" + std::to_string(nq) + " nk=" + std::to_string(nk));
      Task task;
      task.nq = nq;
      task.nk = nk;
      task.dim = 128;
      task.mask.causal = true;
      task.mask.causal_shift = nk - nq;  // bottom-right aligned
      ExpectMatchesBruteForce(task);
    }
  }
}

TEST(BlockAttention, CausalShiftsAndPositionsMatchReference) {
  // A query block at positions [300, 557) against key blocks before, around
  // and after it, under shifts that hide some or all keys from some rows.
  for (int64_t k_position : {0, 200, 300, 500}) {
    for (int64_t shift : {0, -1, -70, 5, 64, -400}) {
      SCOPED_TRACE("k_position=" + std::to_string(k_position) +
                   " shift=" + std::to_string(shift));
      Task task;
      task.nq = 257;
      task.nk = 150;
      task.dim = 64;
      task.q_position = 300;
      task.k_position = k_position;
      task.mask.causal = true;
      task.mask.causal_shift = shift;
      ExpectMatchesBruteForce(task);
    }
  }
}

TEST(BlockAttention, RowsThatSeeNoKeyGetZeroAndNegativeInfinity) {
  Task task;
  task.nq = 100;
  task.nk = 100;
  task.q_heads = 2;
  task.kv_heads = 1;
  task.dim = 80;
  task.mask.causal = true;
  int64_t empty_rows = 0;
  task.mask.causal_shift = -60;  // query a sees keys [0, a - 60]
  ExpectMatchesBruteForce(task, &empty_rows);
  EXPECT_EQ(empty_rows, 60 * 2);

  task.mask.causal_shift = -100;  // no row sees a key
  ExpectMatchesBruteForce(task, &empty_rows);
  EXPECT_EQ(empty_rows, 100 * 2);

  task.mask.causal = false;
  task.nk = 0;  // nothing to see at all
  ExpectMatchesBruteForce(task, &empty_rows);
  EXPECT_EQ(empty_rows, 100 * 2);
}

TEST(BlockAttention, BlockSparseMatchesReference) {
  // Block sizes below, at and above the kernel's tiles, not dividing them.
  for (int64_t block_size : {16, 40, 64, 100}) {
    SCOPED_TRACE("block_size=" + std::to_string(block_size));
    BlockSparseRules rules;
    rules.block_size = block_size;
    rules.local = 1;
    rules.global = 1;
    rules.random = 1;
    rules.seed = 3;
    const BlockMask blocks = BlockMask::FromRules(rules, 2000);
    Task task;
    task.nq = 300;
    task.nk = 500;
    task.q_heads = 2;
    task.kv_heads = 2;
    task.dim = 64;
    task.q_position = 1000;
    task.k_position = 700;
    task.mask.blocks = &blocks;
    ExpectMatchesBruteForce(task);

    task.mask.causal = true;
    task.mask.causal_shift = -10;
    ExpectMatchesBruteForce(task);
  }
}

TEST(BlockAttention, BlockSparseRowsWithoutBlocksGetZero) {
  // Only the diagonal blocks: queries [0, 64) against keys [64, 128) see
  // nothing.
  BlockSparseRules rules;
  rules.block_size = 64;
  rules.local = 0;
  const BlockMask blocks = BlockMask::FromRules(rules, 256);
  Task task;
  task.nq = 128;
  task.nk = 64;
  task.k_position = 64;
  task.dim = 128;
  task.mask.blocks = &blocks;
  int64_t empty_rows = 0;
  ExpectMatchesBruteForce(task, &empty_rows);
  EXPECT_EQ(empty_rows, 64);
}

TEST(BlockAttention, GroupedQueryHeadsReadTheirKeyValueHead) {
  for (int64_t kv_heads : {2, 1}) {
    SCOPED_TRACE("kv_heads=" + std::to_string(kv_heads));
    Task task;
    task.nq = 100;
    task.nk = 130;
    task.q_heads = 8;
    task.kv_heads = kv_heads;
    task.dim = 64;
    task.mask.causal = true;
    task.mask.causal_shift = 30;
    ExpectMatchesBruteForce(task);
  }
}

TEST(BlockAttention, BatchesAndStridedViewsMatchReference) {
  for (int64_t dim : {64, 80, 128}) {
    SCOPED_TRACE("dim=" + std::to_string(dim));
    Task task;
    task.batch = 2;
    task.nq = 257;
    task.nk = 7;
    task.q_heads = 4;
    task.kv_heads = 2;
    task.dim = dim;
    task.strided = true;
    ExpectMatchesBruteForce(task);

    task.nq = 7;
    task.nk = 257;
    task.mask.causal = true;
    task.mask.causal_shift = 250;
    ExpectMatchesBruteForce(task);
  }
}

TEST(BlockAttention, Bf16KeysAndValuesMatchReference) {
  for (int64_t dim : {64, 80, 128}) {
    SCOPED_TRACE("dim=" + std::to_string(dim));
    Task task;
    task.batch = 2;
    task.nq = 67;
    task.nk = 131;
    task.q_heads = 4;
    task.kv_heads = 2;
    task.dim = dim;
    task.mask.causal = true;
    task.mask.causal_shift = 64;
    task.strided = true;
    task.bf16 = true;
    ExpectMatchesBruteForce(task);
  }
}

TEST(BlockAttention, LargeScoresStayAccurate) {
  // Scale 1 on D = 128 gives logits with a spread of tens, so the running
  // max moves often and the online rescaling matters.
  Task task;
  task.nq = 150;
  task.nk = 1000;
  task.dim = 128;
  task.scale = 1.0f;
  ExpectMatchesBruteForce(task);
  task.mask.causal = true;
  task.mask.causal_shift = 850;
  ExpectMatchesBruteForce(task);
}

}  // namespace
}  // namespace ringattn
