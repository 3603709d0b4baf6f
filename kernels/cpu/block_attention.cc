#include "kernels/cpu/block_attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>

#include "kernels/cpu/register_blocks.h"

// How the kernel works. Each call first packs K transposed, tile by tile, and V
// into contiguous rows. Then for each (batch, query head, tile of query rows)
// one OpenMP thread runs a flash-attention loop over tiles of keys: S = Q K^T
// as register-blocked outer products, an online softmax in base 2 (Q is
// prescaled by scale * log2(e)), and O += P V. Both products are plain loops of
// a * b + c over contiguous floats, which GCC vectorizes into FMAs; the softmax
// uses GCC vector extensions for its row reductions. The tile loop is compiled
// three times (AVX-512, AVX2 + FMA, baseline x86-64) with `target` attributes
// and chosen at run time, so the binary runs on any x86-64 machine. Tile pairs
// that are fully masked are skipped; only partially masked ones are masked
// element by element.

namespace ringattn {
namespace {

// Head dims are processed in chunks of this many floats (one 512-bit vector);
// V rows are copied into rows padded to a multiple of it.
constexpr int kDimChunk = 16;
// PackKeysTransposed moves keys this many at a time: each step reads one float
// from each of kTransposeBlock key rows and writes as many contiguous floats.
constexpr int kTransposeBlock = 16;
constexpr float kLog2e = 1.4426950408889634f;
constexpr double kLn2 = 0.6931471805599453;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// One vector register of floats and of int32s, as GCC vector-extension types,
// and the register of half its width. GCC's auto-vectorizer gives up on the max
// and sum reductions along a row of scores, so SoftmaxRow spells those out on
// these.
struct Lanes128 {
  using Float = float __attribute__((vector_size(16)));
  using Int = int32_t __attribute__((vector_size(16)));
};

struct Lanes256 {
  using Float = float __attribute__((vector_size(32)));
  using Int = int32_t __attribute__((vector_size(32)));
  using Half = Lanes128;
};

struct Lanes512 {
  using Float = float __attribute__((vector_size(64)));
  using Int = int32_t __attribute__((vector_size(64)));
  using Half = Lanes256;
};

// Tile and register-block shapes for one instruction set. A tile is
// kQueryTile x kKeyTile scores; S is computed in kScoreRows x kScoreCols blocks
// and O in kOutRows x kOutCols blocks. The shapes were picked by measurement:
// the accumulators fit in the vector registers and GCC vectorizes the blocks
// along their columns, and one tile of K^T or V (kKeyTile x D) fits in L1.
struct Avx512Tiles {
  using Lanes = Lanes512;
  static constexpr int kQueryTile = 48;
  static constexpr int kKeyTile = 64;
  static constexpr int kScoreRows = 6;
  static constexpr int kScoreCols = 64;  // 6 x 4 zmm accumulators
  static constexpr int kOutRows = 6;
  static constexpr int kOutCols = 64;
};

struct Avx2Tiles {
  using Lanes = Lanes256;
  static constexpr int kQueryTile = 48;
  static constexpr int kKeyTile = 64;
  static constexpr int kScoreRows = 3;
  static constexpr int kScoreCols = 32;  // 3 x 4 ymm accumulators
  static constexpr int kOutRows = 3;
  static constexpr int kOutCols = 32;
};

// SSE2 has only 16 xmm registers, so these blocks spill a little; they are
// still the fastest shape measured.
struct BaselineTiles {
  using Lanes = Lanes128;
  static constexpr int kQueryTile = 48;
  static constexpr int kKeyTile = 64;
  static constexpr int kScoreRows = 3;
  static constexpr int kScoreCols = 32;
  static constexpr int kOutRows = 3;
  static constexpr int kOutCols = 32;
};

int64_t RoundUp(int64_t value, int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

// Everything a worker needs about one call, resolved once.
struct Problem {
  View<const float> q;
  View<float> o;
  View<float> lse;
  // K transposed tile by tile: [B][Hkv][key_tiles][dim][key_tile].
  const float* packed_k = nullptr;
  // V in rows of padded_dim floats: [B][Hkv][nk][padded_dim], zero past dim.
  const float* packed_v = nullptr;
  int64_t nq = 0;
  int64_t nk = 0;
  int64_t q_heads = 0;
  int64_t kv_heads = 0;
  int64_t dim = 0;
  int64_t padded_dim = 0;  // dim rounded up to kDimChunk
  int64_t key_tiles = 0;
  int64_t q_position = 0;
  int64_t k_position = 0;
  float score_scale = 0;  // scale * log2(e)
  TileMask mask;
};

// How much of a (query tile, key tile) pair is visible.
enum class Coverage { kNone, kPartial, kFull };

// Query rows [a_begin, a_end) against keys [c_begin, c_end), as task-local
// indices.
Coverage Classify(const Problem& p, int64_t a_begin, int64_t a_end,
                  int64_t c_begin, int64_t c_end) {
  const int64_t q_first = p.q_position + a_begin;
  const int64_t q_last = p.q_position + a_end - 1;
  const int64_t k_first = p.k_position + c_begin;
  const int64_t k_last = p.k_position + c_end - 1;
  bool full = true;
  if (p.mask.causal) {
    if (k_first > q_last + p.mask.causal_shift) return Coverage::kNone;
    full = k_last <= q_first + p.mask.causal_shift;
  }
  if (p.mask.blocks != nullptr) {
    const BlockMask& blocks = *p.mask.blocks;
    if (!blocks.AnyAllowed(q_first, q_last + 1, k_first, k_last + 1)) {
      return Coverage::kNone;
    }
    const int64_t bs = blocks.block_size();
    for (int64_t qb = q_first / bs; full && qb <= q_last / bs; ++qb) {
      for (int64_t kb = k_first / bs; full && kb <= k_last / bs; ++kb) {
        full = blocks.Allowed(qb, kb);
      }
    }
  }
  return full ? Coverage::kFull : Coverage::kPartial;
}

// Sets the scores of invisible pairs in a tile of `key_tile` columns to -inf:
// keys past `cols`, keys beyond the causal limit, pairs the block mask drops,
// and all of the padding rows [rows, rows_computed).
void MaskScores(const Problem& p, int key_tile, int64_t a_begin, int64_t rows,
                int64_t rows_computed, int64_t c_begin, int64_t cols,
                float* s) {
  const int64_t k_first = p.k_position + c_begin;
  const BlockMask* blocks = p.mask.blocks;
  for (int64_t r = 0; r < rows_computed; ++r) {
    float* row = s + r * key_tile;
    const int64_t q_pos = p.q_position + a_begin + r;
    int64_t visible_end = r < rows ? cols : 0;
    if (p.mask.causal) {
      visible_end = std::clamp<int64_t>(
          q_pos + p.mask.causal_shift - k_first + 1, 0, visible_end);
    }
    std::fill(row + visible_end, row + key_tile, kNegInf);
    if (blocks != nullptr) {
      const int64_t bs = blocks->block_size();
      for (int64_t c = 0; c < visible_end; ++c) {
        if (!blocks->Allowed(q_pos / bs, (k_first + c) / bs)) row[c] = kNegInf;
      }
    }
  }
}

template <class V>
constexpr int kLaneCount = sizeof(V) / sizeof(float);

template <class V>
[[gnu::always_inline]] inline V LoadLanes(const float* from) {
  V v;
  std::memcpy(&v, from, sizeof(v));
  return v;
}

template <class V>
[[gnu::always_inline]] inline void StoreLanes(const V& v, float* to) {
  std::memcpy(to, &v, sizeof(v));
}

template <class V>
[[gnu::always_inline]] inline V MaxLanes(const V& a, const V& b) {
  return a > b ? a : b;
}

// The largest lane, by folding the upper half of the register onto the lower.
template <class L>
[[gnu::always_inline]] inline float HorizontalMax(const typename L::Float& v) {
  if constexpr (kLaneCount<typename L::Float> == 4) {
    return std::max(std::max(v[0], v[1]), std::max(v[2], v[3]));
  } else {
    using Half = typename L::Half::Float;
    Half low;
    Half high;
    std::memcpy(&low, &v, sizeof(low));
    std::memcpy(&high, reinterpret_cast<const char*>(&v) + sizeof(low),
                sizeof(high));
    return HorizontalMax<typename L::Half>(MaxLanes(low, high));
  }
}

template <class V>
[[gnu::always_inline]] inline float HorizontalSum(const V& v) {
  float sum = 0;
  for (int i = 0; i < kLaneCount<V>; ++i) sum += v[i];
  return sum;
}

// 2^x per lane for x <= 0, to about 2e-7 relative error; exactly 0 where
// x <= -127 (and -inf).
template <class L>
[[gnu::always_inline]] inline typename L::Float Exp2NonPositive(
    typename L::Float x) {
  using Float = typename L::Float;
  constexpr float kRoundToInt = 12582912.0f;  // 1.5 * 2^23
  x = MaxLanes(x, Float{} - 127.0f);
  const Float n = (x + kRoundToInt) - kRoundToInt;  // nearest integer
  const Float f = x - n;                            // in [-0.5, 0.5]
  // Cephes' exp2f minimax polynomial for 2^f on [-0.5, 0.5].
  Float poly = Float{} + 1.535336188319500e-4f;
  poly = poly * f + 1.339887440266574e-3f;
  poly = poly * f + 9.618437357674640e-3f;
  poly = poly * f + 5.550332471162809e-2f;
  poly = poly * f + 2.402264791363012e-1f;
  poly = poly * f + 6.931472028550421e-1f;
  poly = poly * f + 1.0f;
  // 2^n from its exponent bits; 0 at n = -127.
  using Int = typename L::Int;
  const Int bits = (__builtin_convertvector(n, Int) + 127) << 23;
  Float two_to_n;
  std::memcpy(&two_to_n, &bits, sizeof(two_to_n));
  return poly * two_to_n;
}

// One online-softmax step for a row of kWidth base-2 logits: turns the row into
// probabilities relative to the new running max and rescales the running
// per-lane sums and the row's output accumulator `out` (padded_dim floats) to
// that max.
template <int kWidth, class L>
[[gnu::always_inline]] inline void SoftmaxRow(float* row, float& running_max,
                                              typename L::Float& running_sum,
                                              float* out, int64_t padded_dim) {
  using Float = typename L::Float;
  constexpr int kStep = kLaneCount<Float>;
  static_assert(kWidth % kStep == 0, "rows are whole vectors");
  Float max_lanes = LoadLanes<Float>(row);
  for (int c = kStep; c < kWidth; c += kStep) {
    max_lanes = MaxLanes(max_lanes, LoadLanes<Float>(row + c));
  }
  const float new_max = std::max(running_max, HorizontalMax<L>(max_lanes));
  if (new_max == kNegInf) {  // nothing visible to this row so far
    std::fill(row, row + kWidth, 0.0f);
    return;
  }
  if (new_max != running_max) {
    const float alpha = std::exp2(running_max - new_max);
    running_sum *= alpha;
    for (int64_t d = 0; d < padded_dim; ++d) out[d] *= alpha;
    running_max = new_max;
  }
  for (int c = 0; c < kWidth; c += kStep) {
    const Float prob = Exp2NonPositive<L>(LoadLanes<Float>(row + c) - new_max);
    StoreLanes(prob, row + c);
    running_sum += prob;
  }
}

// Floats of per-thread scratch that AttendQueryTile needs.
template <class Tiles>
int64_t ScratchFloats(int64_t padded_dim) {
  return Tiles::kQueryTile * (2 * padded_dim + Tiles::kKeyTile);
}

// Attention of query rows [tile * kQueryTile, ...) of (batch b, query head h)
// against all keys. kDim is the head dim when fixed at compile time, 0 for any
// dim. `scratch` holds ScratchFloats<Tiles>(padded_dim) floats, 64-byte
// aligned.
template <int kDim, class Tiles>
[[gnu::always_inline]] inline void AttendQueryTile(const Problem& p, int64_t b,
                                                   int64_t h, int64_t tile,
                                                   float* scratch) {
  constexpr int kM = Tiles::kQueryTile;
  constexpr int kN = Tiles::kKeyTile;
  constexpr int kRowStep = std::max(Tiles::kScoreRows, Tiles::kOutRows);
  constexpr int kTailCols = std::min(Tiles::kOutCols, kDimChunk);
  static_assert(kM % Tiles::kScoreRows == 0 && kM % Tiles::kOutRows == 0 &&
                    kRowStep % Tiles::kScoreRows == 0 &&
                    kRowStep % Tiles::kOutRows == 0,
                "row blocks must tile the query tile");
  static_assert(kN % Tiles::kScoreCols == 0 && kN % kTransposeBlock == 0,
                "score blocks and transpose blocks must tile keys");
  const int64_t dim = kDim > 0 ? kDim : p.dim;
  const int64_t padded_dim = kDim > 0 ? kDim : p.padded_dim;
  float* q = scratch;                // [kM][padded_dim], prescaled
  float* out = q + kM * padded_dim;  // [kM][padded_dim], unnormalized O
  float* s = out + kM * padded_dim;  // [kM][kN], scores then probabilities
  using Lanes = typename Tiles::Lanes;
  float running_max[kM];
  typename Lanes::Float running_sum[kM];  // per-lane partial sums

  const int64_t a_begin = tile * kM;
  const int64_t rows = std::min<int64_t>(kM, p.nq - a_begin);
  const int64_t rows_computed = RoundUp(rows, kRowStep);
  for (int64_t r = 0; r < rows_computed; ++r) {
    float* q_row = q + r * padded_dim;
    std::fill(q_row, q_row + padded_dim, 0.0f);
    if (r < rows) {
      const float* src = p.q.Row(b, a_begin + r, h);
      for (int64_t d = 0; d < dim; ++d) q_row[d] = src[d] * p.score_scale;
    }
    running_max[r] = kNegInf;
    running_sum[r] = typename Lanes::Float{};
  }
  std::fill(out, out + rows_computed * padded_dim, 0.0f);

  const int64_t g = h / (p.q_heads / p.kv_heads);
  const float* k_head =
      p.packed_k + (b * p.kv_heads + g) * p.key_tiles * dim * kN;
  const float* v_head = p.packed_v + (b * p.kv_heads + g) * p.nk * padded_dim;
  for (int64_t t = 0; t < p.key_tiles; ++t) {
    const int64_t c_begin = t * kN;
    const int64_t cols = std::min<int64_t>(kN, p.nk - c_begin);
    const Coverage coverage =
        Classify(p, a_begin, a_begin + rows, c_begin, c_begin + cols);
    if (coverage == Coverage::kNone) continue;

    const float* kt = k_head + t * dim * kN;
    for (int64_t r = 0; r < rows_computed; r += Tiles::kScoreRows) {
      for (int c = 0; c < kN; c += Tiles::kScoreCols) {
        ScoreBlock<Tiles::kScoreRows, Tiles::kScoreCols, kN>(
            q + r * padded_dim, padded_dim, kt + c, dim, s + r * kN + c);
      }
    }
    if (coverage == Coverage::kPartial || cols < kN || rows < rows_computed) {
      MaskScores(p, kN, a_begin, rows, rows_computed, c_begin, cols, s);
    }
    for (int64_t r = 0; r < rows_computed; ++r) {
      SoftmaxRow<kN, Lanes>(s + r * kN, running_max[r], running_sum[r],
                            out + r * padded_dim, padded_dim);
    }
    const float* v_tile = v_head + c_begin * padded_dim;
    for (int64_t r = 0; r < rows_computed; r += Tiles::kOutRows) {
      const float* p_rows = s + r * kN;
      float* out_rows = out + r * padded_dim;
      int64_t d = 0;
      for (; d + Tiles::kOutCols <= padded_dim; d += Tiles::kOutCols) {
        AccumulateBlock<Tiles::kOutRows, Tiles::kOutCols, kN>(
            p_rows, v_tile + d, padded_dim, cols, out_rows + d, padded_dim);
      }
      for (; d < padded_dim; d += kTailCols) {
        AccumulateBlock<Tiles::kOutRows, kTailCols, kN>(
            p_rows, v_tile + d, padded_dim, cols, out_rows + d, padded_dim);
      }
    }
  }

  for (int64_t r = 0; r < rows; ++r) {
    float* o_row = p.o.Row(b, a_begin + r, h);
    float* lse = p.lse.Row(b, a_begin + r, h);
    const float sum = HorizontalSum(running_sum[r]);
    if (sum == 0.0f) {  // the row saw no key
      std::fill(o_row, o_row + dim, 0.0f);
      *lse = kNegInf;
      continue;
    }
    const float inv_sum = 1.0f / sum;
    const float* out_row = out + r * padded_dim;
    for (int64_t d = 0; d < dim; ++d) o_row[d] = out_row[d] * inv_sum;
    *lse = static_cast<float>(running_max[r] * kLn2 +
                              std::log(static_cast<double>(sum)));
  }
}

// The tile loop compiled for each instruction set. GCC inlines the
// always_inline helpers into these, so all of the above is generated for the
// caller's ISA.
template <int kDim>
__attribute__((target("avx512f,avx512vl,avx512dq,avx512bw,avx2,fma"))) void
AttendQueryTileAvx512(const Problem& p, int64_t b, int64_t h, int64_t tile,
                      float* scratch) {
  AttendQueryTile<kDim, Avx512Tiles>(p, b, h, tile, scratch);
}

template <int kDim>
__attribute__((target("avx2,fma"))) void AttendQueryTileAvx2(
    const Problem& p, int64_t b, int64_t h, int64_t tile, float* scratch) {
  AttendQueryTile<kDim, Avx2Tiles>(p, b, h, tile, scratch);
}

template <int kDim>
void AttendQueryTileBaseline(const Problem& p, int64_t b, int64_t h,
                             int64_t tile, float* scratch) {
  AttendQueryTile<kDim, BaselineTiles>(p, b, h, tile, scratch);
}

// The tile loop for one instruction set and head dim, with its tile shape.
struct TileKernel {
  void (*run)(const Problem& p, int64_t b, int64_t h, int64_t tile,
              float* scratch);
  int query_tile;
  int key_tile;
  int64_t scratch_floats;
};

template <class Tiles>
TileKernel MakeTileKernel(void (*run)(const Problem&, int64_t, int64_t, int64_t,
                                      float*),
                          int64_t padded_dim) {
  return {run, Tiles::kQueryTile, Tiles::kKeyTile,
          ScratchFloats<Tiles>(padded_dim)};
}

template <int kDim>
TileKernel SelectForDim(int64_t padded_dim) {
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("fma")) {
    return MakeTileKernel<Avx512Tiles>(&AttendQueryTileAvx512<kDim>,
                                       padded_dim);
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    return MakeTileKernel<Avx2Tiles>(&AttendQueryTileAvx2<kDim>, padded_dim);
  }
  return MakeTileKernel<BaselineTiles>(&AttendQueryTileBaseline<kDim>,
                                       padded_dim);
}

// The fastest tile loop this CPU runs for head dim `dim`.
TileKernel SelectTileKernel(int64_t dim, int64_t padded_dim) {
  switch (dim) {
    case 64:
      return SelectForDim<64>(padded_dim);
    case 128:
      return SelectForDim<128>(padded_dim);
    default:
      return SelectForDim<0>(padded_dim);
  }
}

// Writes K^T tile by tile: [B][Hkv][key_tiles][dim][key_tile]. Columns past nk
// repeat the last key; the kernel masks them out.
template <typename T>
void PackKeysTransposed(const View<const T>& k, int key_tile, int64_t key_tiles,
                        float* packed) {
  const Shape& shape = k.shape();
  const int64_t tile_floats = shape.dim * key_tile;
#pragma omp parallel for collapse(3) schedule(static)
  for (int64_t b = 0; b < shape.batch; ++b) {
    for (int64_t g = 0; g < shape.heads; ++g) {
      for (int64_t t = 0; t < key_tiles; ++t) {
        float* tile =
            packed + ((b * shape.heads + g) * key_tiles + t) * tile_floats;
        for (int64_t c = 0; c < key_tile; c += kTransposeBlock) {
          const T* rows[kTransposeBlock];
          for (int j = 0; j < kTransposeBlock; ++j) {
            rows[j] =
                k.Row(b, std::min(t * key_tile + c + j, shape.seq - 1), g);
          }
          for (int64_t d = 0; d < shape.dim; ++d) {
            float* out = tile + d * key_tile + c;
            for (int j = 0; j < kTransposeBlock; ++j)
              out[j] = Widen(rows[j][d]);
          }
        }
      }
    }
  }
}

// Copies V into [B][Hkv][nk][padded_dim] rows, zero past dim. Contiguous rows
// also avoid the cache-set conflicts of V's own row stride (often 4 KiB).
template <typename T>
void PackValues(const View<const T>& v, int64_t padded_dim, float* packed) {
  const Shape& shape = v.shape();
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < shape.batch; ++b) {
    for (int64_t g = 0; g < shape.heads; ++g) {
      for (int64_t n = 0; n < shape.seq; ++n) {
        float* dst =
            packed + ((b * shape.heads + g) * shape.seq + n) * padded_dim;
        const T* src = v.Row(b, n, g);
        for (int64_t d = 0; d < shape.dim; ++d) dst[d] = Widen(src[d]);
        std::fill(dst + shape.dim, dst + padded_dim, 0.0f);
      }
    }
  }
}

// An uninitialized float buffer whose start is aligned to a cache line.
class AlignedFloats {
 public:
  explicit AlignedFloats(int64_t size)
      : storage_(new float[size + kAlignFloats]) {
    void* start = storage_.get();
    size_t space = (size + kAlignFloats) * sizeof(float);
    data_ = static_cast<float*>(
        std::align(kAlignBytes, size * sizeof(float), start, space));
  }
  float* data() const { return data_; }

 private:
  static constexpr size_t kAlignBytes = 64;
  static constexpr int64_t kAlignFloats = kAlignBytes / sizeof(float);
  std::unique_ptr<float[]> storage_;
  float* data_;
};

}  // namespace

// Preconditions (the caller validates): q is [B, nq, Hq, D], k and v are
// [B, nk, Hkv, D] with Hkv > 0 and Hq % Hkv == 0, o is [B, nq, Hq, D] and lse
// [B, nq, Hq, 1]; the outputs overlap no input. With a block mask, positions
// are >= 0 and the mask covers every position of the task. Allocates one
// buffer per call: packed K and V plus a tile's scratch per OpenMP thread.
void BlockAttention(const BlockAttentionArgs& args, View<float> o,
                    View<float> lse) {
  const Shape& q_shape = args.q.shape();
  const Shape& k_shape = args.k.shape();
  const int64_t batch = q_shape.batch;
  if (batch == 0 || q_shape.seq == 0 || q_shape.heads == 0) return;
  Problem p;
  p.q = args.q;
  p.o = o;
  p.lse = lse;
  p.nq = q_shape.seq;
  p.nk = k_shape.seq;
  p.q_heads = q_shape.heads;
  p.kv_heads = k_shape.heads;
  p.dim = q_shape.dim;
  p.padded_dim = RoundUp(p.dim, kDimChunk);
  p.q_position = args.q_position;
  p.k_position = args.k_position;
  p.score_scale = args.scale * kLog2e;
  p.mask = args.mask;

  const TileKernel kernel = SelectTileKernel(p.dim, p.padded_dim);
  p.key_tiles = (p.nk + kernel.key_tile - 1) / kernel.key_tile;
  const int64_t query_tiles =
      (p.nq + kernel.query_tile - 1) / kernel.query_tile;
  const int64_t k_floats =
      batch * p.kv_heads * p.key_tiles * kernel.key_tile * p.dim;
  const int64_t v_floats = batch * p.kv_heads * p.nk * p.padded_dim;
  const int64_t scratch_floats = RoundUp(kernel.scratch_floats, kDimChunk);
  const int threads = omp_get_max_threads();
  AlignedFloats buffer(k_floats + v_floats + threads * scratch_floats);
  float* packed_k = buffer.data();
  float* packed_v = packed_k + k_floats;
  float* scratch = packed_v + v_floats;
  if (args.k.is_bf16()) {
    PackKeysTransposed(args.k.bf16(), kernel.key_tile, p.key_tiles, packed_k);
    PackValues(args.v.bf16(), p.padded_dim, packed_v);
  } else {
    PackKeysTransposed(args.k.f32(), kernel.key_tile, p.key_tiles, packed_k);
    PackValues(args.v.f32(), p.padded_dim, packed_v);
  }
  p.packed_k = packed_k;
  p.packed_v = packed_v;

#pragma omp parallel for collapse(3) schedule(dynamic, 1)
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < p.q_heads; ++h) {
      for (int64_t tile = 0; tile < query_tiles; ++tile) {
        kernel.run(p, b, h, tile,
                   scratch + omp_get_thread_num() * scratch_floats);
      }
    }
  }
}

}  // namespace ringattn
