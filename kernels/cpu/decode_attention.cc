#include "kernels/cpu/decode_attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/cpu/register_blocks.h"

// How the kernel works. For each (batch, key/value head) the query rows of the
// heads that read it are packed into R rows (packed row r is query row
// r / group of head kv_head * group + r % group) and prescaled by
// scale * log2(e). The keys are cut into splits; one OpenMP thread takes one
// (batch, kv head, split) and walks its keys kKeyChunk at a time: it transposes
// the chunk of K into a small buffer that stays in L1, computes the R x chunk
// scores as register-blocked outer products (GCC vectorizes them along the
// keys), runs an online softmax in base 2, and adds P V into R fp32 rows. Each
// split leaves a normalized O and its LSE; a last pass merges the splits by
// log-sum-exp. With a single block of 4 packed rows (one query row of a
// 4-to-1 GQA group, a decode step) and a head dim of 64 or 128, transposing K
// costs more than the scores: a thread then takes the split for every K/V
// head, walking each key's rows of all heads in order, and scores K and adds
// P V where the rows lie (at 64K keys, Hq=32, Hkv=8, 2 threads on the build
// VM: 83-98 ms against 96-126). K and V in bf16 are widened as they are read,
// K where it lies and V into the chunk's copy. The split loop is compiled for
// AVX-512, AVX2 + FMA and baseline x86-64 (target_clones) and chosen at load
// time.

namespace ringattn {
namespace {

constexpr int kKeyChunk = 64;        // keys per step
constexpr int kRowBlock = 4;         // packed rows per register block
constexpr int kColBlock = 32;        // keys (scores) or dims (output) per block
constexpr int kDimChunk = 16;        // head dims are padded to this many floats
constexpr int kTransposeBlock = 16;  // keys transposed together
constexpr int64_t kMinKeysPerSplit = 1024;
// A unit of work takes all key/value heads while they have at most this many
// packed rows together (their state then stays in L1).
constexpr int64_t kAllHeadsMaxRows = 64;
constexpr float kLog2e = 1.4426950408889634f;
constexpr double kLn2 = 0.6931471805599453;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t RoundUp(int64_t value, int64_t multiple) {
  return CeilDiv(value, multiple) * multiple;
}

// One call, resolved once.
struct Problem {
  const BlockAttentionArgs* args = nullptr;
  int64_t nq = 0;
  int64_t nk = 0;
  int64_t kv_heads = 0;
  int64_t group = 0;  // query heads per key/value head
  int64_t dim = 0;
  int64_t padded_dim = 0;   // dim rounded up to kDimChunk
  int64_t rows = 0;         // packed rows: nq * group
  int64_t padded_rows = 0;  // rows rounded up to kRowBlock
  int64_t splits = 0;
  int64_t split_keys = 0;   // a multiple of kKeyChunk
  int64_t unit_heads = 0;   // key/value heads one unit of work takes
  int64_t part_floats = 0;  // one (batch, kv head, split)'s O and LSE
  float score_scale = 0;    // scale * log2(e)
};

// Floats of one kv head's running state: its packed query rows, their
// unnormalized O, running maximum and sum.
int64_t StateFloats(const Problem& p) {
  return 2 * p.padded_rows * p.padded_dim + 2 * p.padded_rows;
}

// Floats of scratch one thread needs: the state of a unit's heads, and K^T,
// V and the scores of the chunk in hand.
int64_t ScratchFloats(const Problem& p) {
  return p.unit_heads * StateFloats(p) + 2 * kKeyChunk * p.padded_dim +
         p.padded_rows * kKeyChunk;
}

// row[c] = 2^(row[c] - max) for a row of kKeyChunk base-2 logits (to about
// 2e-7 relative error; exactly 0 for -inf); returns their sum. Written so that
// GCC vectorizes it.
[[gnu::always_inline]] inline float Exp2Row(float* row, float max) {
  constexpr float kRoundToInt = 12582912.0f;  // 1.5 * 2^23
  float lanes[kDimChunk] = {};
  for (int c0 = 0; c0 < kKeyChunk; c0 += kDimChunk) {
    for (int j = 0; j < kDimChunk; ++j) {
      const float x = std::max(row[c0 + j] - max, -127.0f);
      const float n = (x + kRoundToInt) - kRoundToInt;  // nearest integer
      const float f = x - n;                            // in [-0.5, 0.5]
      // Cephes' exp2f minimax polynomial for 2^f on [-0.5, 0.5].
      float poly = 1.535336188319500e-4f;
      poly = poly * f + 1.339887440266574e-3f;
      poly = poly * f + 9.618437357674640e-3f;
      poly = poly * f + 5.550332471162809e-2f;
      poly = poly * f + 2.402264791363012e-1f;
      poly = poly * f + 6.931472028550421e-1f;
      poly = poly * f + 1.0f;
      const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;  // 2^n
      float two_to_n;
      std::memcpy(&two_to_n, &bits, sizeof(two_to_n));
      row[c0 + j] = poly * two_to_n;
      lanes[j] += row[c0 + j];
    }
  }
  float sum = 0;
  for (int j = 0; j < kDimChunk; ++j) sum += lanes[j];
  return sum;
}

// Sets the scores of invisible pairs in a chunk of `cols` keys starting at key
// `c_begin` to -inf: keys past `cols`, beyond the causal limit, or dropped by
// the block mask.
void MaskChunk(const Problem& p, int64_t c_begin, int64_t cols, float* s) {
  const TileMask& mask = p.args->mask;
  const int64_t k_first = p.args->k_position + c_begin;
  for (int64_t r = 0; r < p.rows; ++r) {
    float* row = s + r * kKeyChunk;
    const int64_t q_pos = p.args->q_position + r / p.group;
    int64_t visible_end = cols;
    if (mask.causal) {
      visible_end = std::clamp<int64_t>(q_pos + mask.causal_shift - k_first + 1,
                                        0, visible_end);
    }
    std::fill(row + visible_end, row + kKeyChunk, kNegInf);
    if (mask.blocks != nullptr) {
      const int64_t bs = mask.blocks->block_size();
      for (int64_t c = 0; c < visible_end; ++c) {
        if (!mask.blocks->Allowed(q_pos / bs, (k_first + c) / bs)) {
          row[c] = kNegInf;
        }
      }
    }
  }
}

// s[r][c] = sum_d q[r][d] * k_c[d] (row stride kKeyChunk) for kRows rows and
// the `count` keys of a chunk read where they lie (key c at k + c *
// k_stride); the rest of the chunk's columns get -inf. For a single block of
// rows this is cheaper than transposing the keys first.
template <int kRows, int kDim, typename T>
[[gnu::always_inline]] inline void ScoreKeysInPlace(const float* q,
                                                    int64_t q_stride,
                                                    const T* k,
                                                    int64_t k_stride,
                                                    int64_t count, float* s) {
  constexpr int kLanes = 8;
  static_assert(kDim > 0 && kDim % kLanes == 0,
                "head dim must be a multiple of 8");
  for (int64_t c = 0; c < count; ++c) {
    const T* k_row = k + c * k_stride;
    float acc[kRows][kLanes] = {};
    for (int d0 = 0; d0 < kDim; d0 += kLanes) {
      for (int r = 0; r < kRows; ++r) {
        for (int j = 0; j < kLanes; ++j) {
          acc[r][j] += q[r * q_stride + d0 + j] * Widen(k_row[d0 + j]);
        }
      }
    }
    for (int r = 0; r < kRows; ++r) {
      float sum = 0;
      for (int j = 0; j < kLanes; ++j) sum += acc[r][j];
      s[r * kKeyChunk + c] = sum;
    }
  }
  for (int r = 0; r < kRows; ++r) {
    std::fill(s + r * kKeyChunk + count, s + (r + 1) * kKeyChunk, kNegInf);
  }
}

// Attention of the packed rows of (batch b, kv heads [g_begin, g_begin +
// p.unit_heads)) over the keys of `split`: writes each head's normalized O
// ([padded_rows][padded_dim]) and natural-log LSE ([padded_rows]) to its part
// of `parts`. A chunk of keys is taken for all of the unit's heads in turn
// while its rows are in cache. kDim is the head dim when fixed at compile
// time, 0 for any; T is how K and V are held: float, or uint16_t for bf16.
template <int kDim, typename T>
[[gnu::always_inline]] inline void AttendSplitFor(const Problem& p, int64_t b,
                                                  int64_t g_begin,
                                                  int64_t split, float* scratch,
                                                  float* parts) {
  const BlockAttentionArgs& args = *p.args;
  const View<const T>& keys = args.k.As<T>();
  const View<const T>& values = args.v.As<T>();
  const int64_t dim = kDim > 0 ? kDim : p.dim;
  const int64_t pd = kDim > 0 ? kDim : p.padded_dim;
  const int64_t rows = p.padded_rows;
  const int64_t state_floats = StateFloats(p);
  // K and V read where they lie (a unit of every head, one block of rows,
  // head dim 64 or 128).
  const bool in_place = kDim > 0 && p.unit_heads > 1 && rows == kRowBlock;
  // V is summed where it lies only in fp32.
  const bool v_in_place = in_place && std::is_same_v<T, float>;
  float* kt = scratch + p.unit_heads * state_floats;  // [pd][kKeyChunk]
  float* vc = kt + pd * kKeyChunk;  // [kKeyChunk][pd], V of a chunk
  float* s = vc + kKeyChunk * pd;   // [rows][kKeyChunk]
  // Head u of the unit: its prescaled queries, unnormalized O, running
  // maximum and sum.
  struct State {
    float* q;
    float* out;
    float* running_max;
    float* running_sum;
  };
  auto state = [&](int64_t u) {
    float* base = scratch + u * state_floats;
    return State{base, base + rows * pd, base + 2 * rows * pd,
                 base + 2 * rows * pd + rows};
  };

  for (int64_t u = 0; u < p.unit_heads; ++u) {
    const State st = state(u);
    const int64_t g = g_begin + u;
    for (int64_t r = 0; r < rows; ++r) {
      float* q_row = st.q + r * pd;
      std::fill(q_row, q_row + pd, 0.0f);
      if (r < p.rows) {
        const float* src =
            args.q.Row(b, r / p.group, g * p.group + r % p.group);
        for (int64_t d = 0; d < dim; ++d) q_row[d] = src[d] * p.score_scale;
      }
      st.running_max[r] = kNegInf;
      st.running_sum[r] = 0;
    }
    std::fill(st.out, st.out + rows * pd, 0.0f);
  }

  const TileMask& mask = args.mask;
  const int64_t first_q = args.q_position;
  const int64_t last_q = args.q_position + p.nq - 1;
  const int64_t key_begin = split * p.split_keys;
  const int64_t key_end = std::min(p.nk, key_begin + p.split_keys);
  const int64_t g_end = g_begin + p.unit_heads;
  for (int64_t c0 = key_begin; c0 < key_end; c0 += kKeyChunk) {
    const int64_t cols = std::min<int64_t>(kKeyChunk, key_end - c0);
    const int64_t k_first = args.k_position + c0;
    const int64_t k_last = k_first + cols - 1;
    if (mask.causal && k_first > last_q + mask.causal_shift) break;

    // One head's K/V rows lie a whole row of all heads apart (often a 4 KiB
    // page), too far for the hardware prefetchers: ask for the next chunk's
    // rows of the unit's heads while this one is computed.
    const int64_t next = c0 + kKeyChunk;
    for (int64_t c = next; c < std::min(key_end, next + kKeyChunk); ++c) {
      for (int64_t g = g_begin; g < g_end; ++g) {
        const char* k_row = reinterpret_cast<const char*>(keys.Row(b, c, g));
        const char* v_row = reinterpret_cast<const char*>(values.Row(b, c, g));
        for (int64_t byte = 0; byte < dim * int64_t{sizeof(T)}; byte += 64) {
          __builtin_prefetch(k_row + byte);
          __builtin_prefetch(v_row + byte);
        }
      }
    }
    const bool masked = cols < kKeyChunk || mask.blocks != nullptr ||
                        (mask.causal && k_last > first_q + mask.causal_shift);
    for (int64_t g = g_begin; g < g_end; ++g) {
      const State st = state(g - g_begin);
      if (in_place) {
        if constexpr (kDim > 0) {
          ScoreKeysInPlace<kRowBlock, kDim>(st.q, pd, keys.Row(b, c0, g),
                                            keys.seq_stride(), cols, s);
        }
      } else {
        // K^T, kTransposeBlock keys at a time so that each store is
        // contiguous; columns past `cols` repeat the last key (masked
        // below).
        for (int64_t c = 0; c < kKeyChunk; c += kTransposeBlock) {
          const T* k_rows[kTransposeBlock];
          for (int j = 0; j < kTransposeBlock; ++j) {
            k_rows[j] = keys.Row(b, c0 + std::min(c + j, cols - 1), g);
          }
          for (int64_t d = 0; d < dim; ++d) {
            float* to = kt + d * kKeyChunk + c;
            for (int j = 0; j < kTransposeBlock; ++j) {
              to[j] = Widen(k_rows[j][d]);
            }
          }
        }
        for (int64_t r = 0; r < rows; r += kRowBlock) {
          for (int c = 0; c < kKeyChunk; c += kColBlock) {
            ScoreBlock<kRowBlock, kColBlock, kKeyChunk>(
                st.q + r * pd, pd, kt + c, dim, s + r * kKeyChunk + c);
          }
        }
      }
      // V where it lies along with K, else a padded fp32 copy.
      const float* v_chunk = vc;
      int64_t v_stride = pd;
      if constexpr (std::is_same_v<T, float>) {
        if (v_in_place) {
          v_chunk = values.Row(b, c0, g);
          v_stride = values.seq_stride();
        }
      }
      if (!v_in_place) {
        for (int64_t c = 0; c < cols; ++c) {
          const T* v_row = values.Row(b, c0 + c, g);
          float* to = vc + c * pd;
          for (int64_t d = 0; d < dim; ++d) to[d] = Widen(v_row[d]);
          std::fill(to + dim, to + pd, 0.0f);
        }
      }
      if (masked) MaskChunk(p, c0, cols, s);
      for (int64_t r = 0; r < rows; ++r) {
        float* row = s + r * kKeyChunk;
        float max = st.running_max[r];
        for (int c = 0; c < kKeyChunk; ++c) max = std::max(max, row[c]);
        if (max == kNegInf) {  // nothing visible to this row so far
          std::fill(row, row + kKeyChunk, 0.0f);
          continue;
        }
        if (max != st.running_max[r]) {
          const float alpha = std::exp2(st.running_max[r] - max);
          st.running_sum[r] *= alpha;
          float* out_row = st.out + r * pd;
          for (int64_t d = 0; d < pd; ++d) out_row[d] *= alpha;
          st.running_max[r] = max;
        }
        st.running_sum[r] += Exp2Row(row, max);
      }
      for (int64_t r = 0; r < rows; r += kRowBlock) {
        const float* p_rows = s + r * kKeyChunk;
        float* out_rows = st.out + r * pd;
        int64_t d = 0;
        for (; d + kColBlock <= pd; d += kColBlock) {
          AccumulateBlock<kRowBlock, kColBlock, kKeyChunk>(
              p_rows, v_chunk + d, v_stride, cols, out_rows + d, pd);
        }
        for (; d < pd; d += kDimChunk) {
          AccumulateBlock<kRowBlock, kDimChunk, kKeyChunk>(
              p_rows, v_chunk + d, v_stride, cols, out_rows + d, pd);
        }
      }
    }
  }

  for (int64_t g = g_begin; g < g_end; ++g) {
    const State st = state(g - g_begin);
    float* part_o =
        parts + ((b * p.kv_heads + g) * p.splits + split) * p.part_floats;
    float* part_lse = part_o + rows * p.padded_dim;
    for (int64_t r = 0; r < p.rows; ++r) {
      const float sum = st.running_sum[r];
      const float inverse = sum > 0 ? 1.0f / sum : 0.0f;
      for (int64_t d = 0; d < dim; ++d) {
        part_o[r * p.padded_dim + d] = st.out[r * pd + d] * inverse;
      }
      part_lse[r] = sum > 0 ? static_cast<float>(st.running_max[r] * kLn2 +
                                                 std::log(double{sum}))
                            : kNegInf;
    }
  }
}

// The split loop for this CPU's widest vectors.
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3",
                             "default"))) void
AttendSplit(const Problem& p, int64_t b, int64_t g_begin, int64_t split,
            float* scratch, float* parts) {
  const bool bf16 = p.args->k.is_bf16();
  switch (p.dim) {
    case 64:
      bf16 ? AttendSplitFor<64, uint16_t>(p, b, g_begin, split, scratch, parts)
           : AttendSplitFor<64, float>(p, b, g_begin, split, scratch, parts);
      return;
    case 128:
      bf16 ? AttendSplitFor<128, uint16_t>(p, b, g_begin, split, scratch, parts)
           : AttendSplitFor<128, float>(p, b, g_begin, split, scratch, parts);
      return;
    default:
      bf16 ? AttendSplitFor<0, uint16_t>(p, b, g_begin, split, scratch, parts)
           : AttendSplitFor<0, float>(p, b, g_begin, split, scratch, parts);
  }
}

}  // namespace

// Preconditions as for BlockAttention (the caller validates shapes).
void DecodeAttention(const BlockAttentionArgs& args, View<float> o,
                     View<float> lse) {
  const Shape& q_shape = args.q.shape();
  const Shape& k_shape = args.k.shape();
  const int64_t batch = q_shape.batch;
  if (batch == 0 || q_shape.seq == 0 || q_shape.heads == 0) return;
  Problem p;
  p.args = &args;
  p.nq = q_shape.seq;
  p.nk = k_shape.seq;
  p.kv_heads = k_shape.heads;
  p.group = q_shape.heads / k_shape.heads;
  p.dim = q_shape.dim;
  p.padded_dim = RoundUp(p.dim, kDimChunk);
  p.rows = p.nq * p.group;
  p.padded_rows = RoundUp(p.rows, kRowBlock);
  p.score_scale = args.scale * kLog2e;

  // With one block of packed rows and a head dim of 64 or 128 the keys are
  // scored where they lie, and a unit of work takes every key/value head (up
  // to kAllHeadsMaxRows packed rows), so that it reads each key's row of all
  // heads whole, in order; otherwise a unit is one head. Enough splits for
  // every thread to have a unit, none shorter than kMinKeysPerSplit keys (nor
  // empty).
  const int threads = omp_get_max_threads();
  const bool keys_in_place =
      p.padded_rows == kRowBlock && (p.dim == 64 || p.dim == 128);
  p.unit_heads = keys_in_place && p.kv_heads * p.padded_rows <= kAllHeadsMaxRows
                     ? p.kv_heads
                     : 1;
  const int64_t heads = batch * p.kv_heads;
  const int64_t unit_groups = batch * (p.kv_heads / p.unit_heads);
  p.splits = std::clamp<int64_t>(CeilDiv(threads, unit_groups), 1,
                                 std::max<int64_t>(1, p.nk / kMinKeysPerSplit));
  p.split_keys =
      std::max<int64_t>(kKeyChunk, RoundUp(CeilDiv(p.nk, p.splits), kKeyChunk));
  p.splits = std::max<int64_t>(1, CeilDiv(p.nk, p.split_keys));

  p.part_floats = p.padded_rows * (p.padded_dim + 1);
  const int64_t part_floats = p.part_floats;
  const int64_t scratch_floats = ScratchFloats(p);
  std::vector<float> parts(static_cast<size_t>(heads * p.splits * part_floats));
  std::vector<float> scratch(static_cast<size_t>(threads * scratch_floats));
  const int64_t units = unit_groups * p.splits;
  const int64_t groups_per_batch = p.kv_heads / p.unit_heads;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t unit = 0; unit < units; ++unit) {
    const int64_t group = unit / p.splits;
    AttendSplit(p, group / groups_per_batch,
                group % groups_per_batch * p.unit_heads, unit % p.splits,
                scratch.data() + omp_get_thread_num() * scratch_floats,
                parts.data());
  }

  // Merge the splits of each packed row by log-sum-exp.
#pragma omp parallel for schedule(static)
  for (int64_t head = 0; head < heads; ++head) {
    const int64_t b = head / p.kv_heads;
    const int64_t g = head % p.kv_heads;
    const float* first = parts.data() + head * p.splits * part_floats;
    for (int64_t r = 0; r < p.rows; ++r) {
      const int64_t h = g * p.group + r % p.group;
      float* o_row = o.Row(b, r / p.group, h);
      float max = kNegInf;
      for (int64_t s = 0; s < p.splits; ++s) {
        max = std::max(
            max, first[s * part_floats + p.padded_rows * p.padded_dim + r]);
      }
      std::fill(o_row, o_row + p.dim, 0.0f);
      if (max == kNegInf) {
        *lse.Row(b, r / p.group, h) = kNegInf;
        continue;
      }
      double total = 0;
      for (int64_t s = 0; s < p.splits; ++s) {
        const float* part = first + s * part_floats;
        const float weight =
            std::exp(part[p.padded_rows * p.padded_dim + r] - max);
        if (weight == 0) continue;
        total += weight;
        for (int64_t d = 0; d < p.dim; ++d) {
          o_row[d] += weight * part[r * p.padded_dim + d];
        }
      }
      const float inverse = static_cast<float>(1.0 / total);
      for (int64_t d = 0; d < p.dim; ++d) o_row[d] *= inverse;
      *lse.Row(b, r / p.group, h) = static_cast<float>(max + std::log(total));
    }
  }
}

}  // namespace ringattn
