#include "kernels/cuda/decode_attention.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/mma_util.cuh"

// How it works. For one (batch, K/V head) the query rows that read that head
// are packed into R = q_len * group rows: packed row r is query row r / group
// of query head kv_head * group + r % group (these heads are adjacent in
// memory). A CTA of four warps takes kBlockM packed rows and one split of the
// keys, and walks its keys kBlockN at a time through a kStages-deep cp.async
// ring of shared K/V tiles. Its warps form a kWarpsM x kWarpsN grid: a warp
// owns kMTiles * 16 rows and kBlockN / kWarpsN keys of each tile and keeps its
// own online softmax; few rows (one 16-row tile) leave all four warps on
// different keys, more rows put them on different rows so that each K/V
// fragment read from shared memory feeds more products. At the end the warps
// of one row block merge through shared memory, and the CTA writes either the
// final O and LSE (one split) or its split's fp32 O and LSE, which the combine
// kernel merges by LSE.

namespace ringattn {
namespace {

using device::CommitCopies;
using device::CopyAsync16;
using device::Element;
using device::Exp2;
using device::LoadMatrices;
using device::LoadMatricesTransposed;
using device::OnlineSoftmaxStep;
using device::WaitCopies;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
// A split walks at least this many key tiles (fewer would spend more on its
// prologue and epilogue than on keys).
constexpr int kMinTilesPerSplit = 4;

// One compiled tile shape. Shared rows are padded by 16 bytes so that the
// eight rows one ldmatrix phase reads fall in distinct banks.
template <int kHeadDimArg, int kWarpsMArg, int kMTilesArg>
struct Config {
  static constexpr int kHeadDim = kHeadDimArg;
  static constexpr int kWarpsM = kWarpsMArg;
  static constexpr int kMTiles = kMTilesArg;
  static constexpr int kWarpsN = kWarps / kWarpsM;
  static constexpr int kBlockM = kWarpsM * kMTiles * 16;
  static constexpr int kBlockN = 64;
  static constexpr int kWarpKeys = kBlockN / kWarpsN;
  // Three stages where one CTA's 16 rows leave shared memory for two CTAs per
  // SM; two elsewhere, so that two CTAs (eight warps) still fit on an SM:
  // measured on one H200, 64 rows with three stages (one CTA per SM) ran at
  // half the speed of K/V reads.
  static constexpr int kStages = kWarpsM == 1 && kHeadDim <= 128 ? 3 : 2;
  static constexpr int kStride = kHeadDim + 8;  // elements per shared row
  static constexpr int kTileElements = kBlockN * kStride;
  static constexpr int kSharedBytes =
      (kBlockM + 2 * kStages * kBlockN) * kStride * 2;
  static_assert(kWarpKeys % 16 == 0, "a warp's keys are whole k16 steps");
  // The cross-warp merge reuses the K/V ring: fp32 O plus max and sum.
  static_assert(kWarpsN == 1 || (kBlockM * kHeadDim + 2 * kWarpsN * kBlockM) *
                                        4 <=
                                    2 * kStages * kTileElements * 2,
                "the merge buffer fits in the K/V ring");
};

// Everything the kernels read, with strides in elements.
struct Params {
  const void* q;
  const void* k;
  const void* v;
  void* o;
  float* lse;
  int64_t q_batch_stride, q_seq_stride;
  int64_t k_batch_stride, k_seq_stride;
  int64_t v_batch_stride, v_seq_stride;
  int64_t o_batch_stride, o_seq_stride;
  int q_len;
  int kv_len;
  int q_heads;
  int kv_heads;
  int group;  // q_heads / kv_heads
  int head_dim;
  int rows;           // packed rows per (batch, kv head): q_len * group
  int causal_shift;   // kv_len - q_len: query i sees key j iff j <= i + shift
  bool causal;
  float scale_log2;   // scale * log2(e)
  bool aligned;       // 16-byte rows: cp.async tiles and paired stores
  int split_keys;     // keys per split, a multiple of kBlockN
  int splits;
  // With splits > 1: [splits][batch * kv_heads][rows][partial_stride] fp32
  // normalized O, and [splits][batch * kv_heads][rows] natural-log LSE.
  float* partial_o;
  float* partial_lse;
  int partial_stride;
};

// Loads rows [first, first + kRows) of `kRows` rows into a shared tile;
// `row_address(r)` gives row r's start. Rows at or past `end` and columns at
// or past head_dim become zero. Aligned tensors go through cp.async (the
// caller commits and waits); others are copied element by element.
template <typename T, class C, int kRows, class RowAddress>
__device__ __forceinline__ void LoadTile(T* tile, int first, int end,
                                         int head_dim, bool aligned,
                                         RowAddress row_address) {
  constexpr int kChunks = C::kHeadDim / 8;  // 16-byte chunks per row
  for (int i = threadIdx.x; i < kRows * kChunks; i += kThreads) {
    const int r = i / kChunks;
    const int d = (i % kChunks) * 8;
    const int row = first + r;
    T* to = tile + r * C::kStride + d;
    const bool row_in = row < end;
    if (aligned) {
      const bool in = row_in && d < head_dim;
      const T* from = in ? row_address(row) + d : row_address(first);
      CopyAsync16(to, from, in ? 16 : 0);
    } else {
      const T* from = row_address(row_in ? row : first);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        to[e] = row_in && d + e < head_dim ? from[d + e] : T(0.0f);
      }
    }
  }
}

template <typename T, class C>
__global__ void __launch_bounds__(kThreads)
    DecodeSplitKernel(const Params p) {
  using E = Element<T>;
  constexpr int kMTiles = C::kMTiles;
  constexpr int kBlockM = C::kBlockM;
  constexpr int kBlockN = C::kBlockN;
  constexpr int kStride = C::kStride;
  constexpr int kStages = C::kStages;
  constexpr int kWarpKeys = C::kWarpKeys;
  constexpr int kDimTiles = C::kHeadDim / 8;  // n-tiles of O
  constexpr int kKeyTiles = kWarpKeys / 8;    // n-tiles of this warp's S

  extern __shared__ __align__(16) unsigned char shared_bytes[];
  T* q_tile = reinterpret_cast<T*>(shared_bytes);
  T* kv_ring = q_tile + kBlockM * kStride;  // stage s: K then V

  const int m0 = blockIdx.x * kBlockM;
  const int split = blockIdx.y;
  const int bh = blockIdx.z;  // batch * kv_heads + kv head
  const int b = bh / p.kv_heads;
  const int kv_h = bh % p.kv_heads;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int warp_m = warp % C::kWarpsM;
  const int warp_n = warp / C::kWarpsM;
  const int quad_row = lane / 4;
  const int quad_col = lane % 4;

  const T* q = static_cast<const T*>(p.q) + b * p.q_batch_stride +
               static_cast<int64_t>(kv_h) * p.group * p.head_dim;
  const T* k = static_cast<const T*>(p.k) + b * p.k_batch_stride +
               static_cast<int64_t>(kv_h) * p.head_dim;
  const T* v = static_cast<const T*>(p.v) + b * p.v_batch_stride +
               static_cast<int64_t>(kv_h) * p.head_dim;
  const auto q_row = [&](int r) {
    return q + static_cast<int64_t>(r / p.group) * p.q_seq_stride +
           (r % p.group) * p.head_dim;
  };
  const auto k_row = [&](int j) {
    return k + static_cast<int64_t>(j) * p.k_seq_stride;
  };
  const auto v_row = [&](int j) {
    return v + static_cast<int64_t>(j) * p.v_seq_stride;
  };

  // This split's keys, clipped to what the block's last row can see.
  const int key_begin = split * p.split_keys;
  int key_end = min(p.kv_len, key_begin + p.split_keys);
  if (p.causal) {
    const int last_query = (min(m0 + kBlockM, p.rows) - 1) / p.group;
    key_end = min(key_end, max(0, last_query + p.causal_shift + 1));
  }
  const int key_tiles = max(0, (key_end - key_begin + kBlockN - 1) / kBlockN);

  // In m-tile m this thread holds packed rows warp_row0 + 16 m + quad_row and
  // 8 below it (r = 0, 1); its keys in a tile start at warp_key0.
  const int warp_row0 = m0 + warp_m * 16 * kMTiles;
  const int thread_row0 = warp_row0 + quad_row;
  const int warp_key0 = warp_n * kWarpKeys;

  float o_acc[kMTiles][kDimTiles][4];
#pragma unroll
  for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
    for (int t = 0; t < kDimTiles; ++t) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o_acc[m][t][e] = 0.0f;
    }
  }
  float row_max[kMTiles][2];
  float row_sum[kMTiles][2];
#pragma unroll
  for (int m = 0; m < kMTiles; ++m) {
    row_max[m][0] = row_max[m][1] = -INFINITY;
    row_sum[m][0] = row_sum[m][1] = 0.0f;
  }

  const auto load_stage = [&](int tile) {
    T* k_tile = kv_ring + (tile % kStages) * 2 * C::kTileElements;
    const int n0 = key_begin + tile * kBlockN;
    LoadTile<T, C, kBlockN>(k_tile, n0, p.kv_len, p.head_dim, p.aligned,
                            k_row);
    LoadTile<T, C, kBlockN>(k_tile + C::kTileElements, n0, p.kv_len,
                            p.head_dim, p.aligned, v_row);
  };

  if (key_tiles > 0) {
    LoadTile<T, C, kBlockM>(q_tile, m0, p.rows, p.head_dim, p.aligned, q_row);
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < key_tiles) load_stage(s);
      CommitCopies();  // empty groups keep the count uniform
    }
  }

  for (int tile = 0; tile < key_tiles; ++tile) {
    if (tile + kStages - 1 < key_tiles) load_stage(tile + kStages - 1);
    CommitCopies();
    WaitCopies<kStages - 1>();  // Q and this tile have landed
    __syncthreads();
    const T* k_tile = kv_ring + (tile % kStages) * 2 * C::kTileElements;
    const T* v_tile = k_tile + C::kTileElements;
    const int n0 = key_begin + tile * kBlockN + warp_key0;

    // S = Q K^T for this warp's rows and keys.
    float s[kMTiles][kKeyTiles][4];
#pragma unroll
    for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
      for (int j = 0; j < kKeyTiles; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[m][j][e] = 0.0f;
      }
    }
#pragma unroll
    for (int kk = 0; kk < C::kHeadDim / 16; ++kk) {
      uint32_t a[kMTiles][4];
#pragma unroll
      for (int m = 0; m < kMTiles; ++m) {
        LoadMatrices(a[m], q_tile +
                               (warp_row0 - m0 + m * 16 + (lane % 8) +
                                (lane / 8 % 2) * 8) *
                                   kStride +
                               kk * 16 + (lane / 16) * 8);
      }
#pragma unroll
      for (int j = 0; j < kKeyTiles; j += 2) {
        uint32_t bk[4];
        LoadMatrices(bk, k_tile +
                             (warp_key0 + j * 8 + (lane % 8) + (lane / 16) * 8) *
                                 kStride +
                             kk * 16 + (lane / 8 % 2) * 8);
#pragma unroll
        for (int m = 0; m < kMTiles; ++m) {
          E::Mma(s[m][j], a[m], bk[0], bk[1]);
          E::Mma(s[m][j + 1], a[m], bk[2], bk[3]);
        }
      }
    }

    // Hide keys past the end and, under causal masking, right of the limit.
    const bool past_end = n0 + kWarpKeys > key_end;
    const bool crosses_limit =
        p.causal && n0 + kWarpKeys - 1 > warp_row0 / p.group + p.causal_shift;
    if (past_end || crosses_limit) {
#pragma unroll
      for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
        for (int j = 0; j < kKeyTiles; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = n0 + j * 8 + quad_col * 2 + (e & 1);
            const int query = (thread_row0 + m * 16 + (e >= 2 ? 8 : 0)) /
                              p.group;
            if (key >= key_end ||
                (p.causal && key > query + p.causal_shift)) {
              s[m][j][e] = -INFINITY;
            }
          }
        }
      }
    }

    OnlineSoftmaxStep(s, row_max, row_sum, o_acc, p.scale_log2);

    // O += P V; the S accumulator layout is the A operand layout.
#pragma unroll
    for (int kk = 0; kk < kWarpKeys / 16; ++kk) {
      uint32_t a[kMTiles][4];
#pragma unroll
      for (int m = 0; m < kMTiles; ++m) {
        a[m][0] = E::Pack(s[m][2 * kk][0], s[m][2 * kk][1]);
        a[m][1] = E::Pack(s[m][2 * kk][2], s[m][2 * kk][3]);
        a[m][2] = E::Pack(s[m][2 * kk + 1][0], s[m][2 * kk + 1][1]);
        a[m][3] = E::Pack(s[m][2 * kk + 1][2], s[m][2 * kk + 1][3]);
      }
#pragma unroll
      for (int t = 0; t < kDimTiles; t += 2) {
        uint32_t bv[4];
        LoadMatricesTransposed(
            bv, v_tile +
                    (warp_key0 + kk * 16 + (lane % 8) + (lane / 8 % 2) * 8) *
                        kStride +
                    t * 8 + (lane / 16) * 8);
#pragma unroll
        for (int m = 0; m < kMTiles; ++m) {
          E::Mma(o_acc[m][t], a[m], bv[0], bv[1]);
          E::Mma(o_acc[m][t + 1], a[m], bv[2], bv[3]);
        }
      }
    }
    __syncthreads();  // every warp is done with this stage
  }

  // Row sums over the quad: each thread held its own columns' share.
#pragma unroll
  for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      row_sum[m][r] += __shfl_xor_sync(0xffffffffu, row_sum[m][r], 1);
      row_sum[m][r] += __shfl_xor_sync(0xffffffffu, row_sum[m][r], 2);
    }
  }

  // Warps on different keys of the same rows merge: each rescales to the
  // common max, then they add their O into shared memory in turn and the last
  // one holds the result.
  if constexpr (C::kWarpsN > 1) {
    WaitCopies<0>();
    float* merged_o = reinterpret_cast<float*>(kv_ring);  // [kBlockM][D]
    float* maxes = merged_o + kBlockM * C::kHeadDim;     // [kWarpsN][kBlockM]
    float* sums = maxes + C::kWarpsN * kBlockM;
#pragma unroll
    for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        if (quad_col == 0) {
          const int row = thread_row0 - m0 + m * 16 + r * 8;
          maxes[warp_n * kBlockM + row] = row_max[m][r];
          sums[warp_n * kBlockM + row] = row_sum[m][r];
        }
      }
    }
    __syncthreads();
#pragma unroll
    for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = thread_row0 - m0 + m * 16 + r * 8;
        float common = -INFINITY;
#pragma unroll
        for (int w = 0; w < C::kWarpsN; ++w) {
          common = fmaxf(common, maxes[w * kBlockM + row]);
        }
        const float offset = common == -INFINITY ? 0.0f : common;
        float total = 0.0f;
#pragma unroll
        for (int w = 0; w < C::kWarpsN; ++w) {
          total += sums[w * kBlockM + row] *
                   Exp2(maxes[w * kBlockM + row] - offset);
        }
        const float rescale = Exp2(row_max[m][r] - offset);
#pragma unroll
        for (int t = 0; t < kDimTiles; ++t) {
          o_acc[m][t][2 * r] *= rescale;
          o_acc[m][t][2 * r + 1] *= rescale;
        }
        row_max[m][r] = common;
        row_sum[m][r] = total;
      }
    }
    for (int w = 0; w < C::kWarpsN; ++w) {
      if (warp_n == w) {
#pragma unroll
        for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            float* row = merged_o +
                         (thread_row0 - m0 + m * 16 + r * 8) * C::kHeadDim +
                         quad_col * 2;
#pragma unroll
            for (int t = 0; t < kDimTiles; ++t) {
              float2* cell = reinterpret_cast<float2*>(row + t * 8);
              if (w > 0) {
                const float2 before = *cell;
                o_acc[m][t][2 * r] += before.x;
                o_acc[m][t][2 * r + 1] += before.y;
              }
              if (w + 1 < C::kWarpsN) {
                *cell = make_float2(o_acc[m][t][2 * r], o_acc[m][t][2 * r + 1]);
              }
            }
          }
        }
      }
      __syncthreads();
    }
    if (warp_n != C::kWarpsN - 1) return;
  }

  // Store: a row that saw no key has sum 0 and gets O = 0, LSE = -inf.
#pragma unroll
  for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = thread_row0 + m * 16 + r * 8;
      if (row >= p.rows) continue;
      const float sum = row_sum[m][r];
      const float inverse = sum > 0.0f ? 1.0f / sum : 0.0f;
      const float lse =
          sum > 0.0f ? (row_max[m][r] + __log2f(sum)) * kLn2 : -INFINITY;
      const int query = row / p.group;
      const int h = kv_h * p.group + row % p.group;
      if (p.splits > 1) {
        const int64_t cell =
            (static_cast<int64_t>(split) * gridDim.z + bh) * p.rows + row;
        float* out = p.partial_o + cell * p.partial_stride;
#pragma unroll
        for (int t = 0; t < kDimTiles; ++t) {
          *reinterpret_cast<float2*>(out + t * 8 + quad_col * 2) =
              make_float2(o_acc[m][t][2 * r] * inverse,
                          o_acc[m][t][2 * r + 1] * inverse);
        }
        if (quad_col == 0) p.partial_lse[cell] = lse;
        continue;
      }
      T* out = static_cast<T*>(p.o) + b * p.o_batch_stride +
               static_cast<int64_t>(query) * p.o_seq_stride +
               static_cast<int64_t>(h) * p.head_dim;
#pragma unroll
      for (int t = 0; t < kDimTiles; ++t) {
        const int d = t * 8 + quad_col * 2;
        const float x0 = o_acc[m][t][2 * r] * inverse;
        const float x1 = o_acc[m][t][2 * r + 1] * inverse;
        if (p.aligned) {
          if (d < p.head_dim) {
            *reinterpret_cast<uint32_t*>(out + d) = E::Pack(x0, x1);
          }
        } else {
          if (d < p.head_dim) out[d] = E::From(x0);
          if (d + 1 < p.head_dim) out[d + 1] = E::From(x1);
        }
      }
      if (p.lse != nullptr && quad_col == 0) {
        p.lse[(static_cast<int64_t>(b) * p.q_len + query) * p.q_heads + h] =
            lse;
      }
    }
  }
}

// Merges the splits of one packed row per warp: O = sum_s w_s O_s / sum_s
// w_s with w_s = e^(lse_s - max lse), LSE = max + ln(sum w_s).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    DecodeCombineKernel(const Params p, int64_t cells) {
  using E = Element<T>;
  const int64_t cell = static_cast<int64_t>(blockIdx.x) * kWarps +
                       threadIdx.x / 32;  // (batch * kv_heads) * rows + row
  const int lane = threadIdx.x % 32;
  if (cell >= cells) return;
  float common = -INFINITY;
  for (int s = lane; s < p.splits; s += 32) {
    common = fmaxf(common, p.partial_lse[s * cells + cell]);
  }
#pragma unroll
  for (int delta = 16; delta > 0; delta /= 2) {
    common = fmaxf(common, __shfl_xor_sync(0xffffffffu, common, delta));
  }
  const float offset = common == -INFINITY ? 0.0f : common;
  float total = 0.0f;
  for (int s = lane; s < p.splits; s += 32) {
    total += Exp2((p.partial_lse[s * cells + cell] - offset) * kLog2e);
  }
#pragma unroll
  for (int delta = 16; delta > 0; delta /= 2) {
    total += __shfl_xor_sync(0xffffffffu, total, delta);
  }
  const float inverse = total > 0.0f ? 1.0f / total : 0.0f;

  const int bh = static_cast<int>(cell / p.rows);
  const int row = static_cast<int>(cell % p.rows);
  const int b = bh / p.kv_heads;
  const int query = row / p.group;
  const int h = bh % p.kv_heads * p.group + row % p.group;
  T* out = static_cast<T*>(p.o) + b * p.o_batch_stride +
           static_cast<int64_t>(query) * p.o_seq_stride +
           static_cast<int64_t>(h) * p.head_dim;
  for (int d = lane; d < p.head_dim; d += 32) {
    float acc = 0.0f;
    for (int s = 0; s < p.splits; ++s) {
      const float weight =
          Exp2((p.partial_lse[s * cells + cell] - offset) * kLog2e);
      acc += weight * p.partial_o[(s * cells + cell) * p.partial_stride + d];
    }
    out[d] = E::From(acc * inverse);
  }
  if (p.lse != nullptr && lane == 0) {
    p.lse[(static_cast<int64_t>(b) * p.q_len + query) * p.q_heads + h] =
        total > 0.0f ? common + logf(total) : -INFINITY;
  }
}

bool Aligned16(const void* pointer) {
  return reinterpret_cast<uintptr_t>(pointer) % 16 == 0;
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The compiled tile shapes: one 16-row tile with the warps on different keys
// for the fewest rows, then 64 and 128 rows per CTA.
template <int kHeadDim>
struct Shapes {
  using Small = Config<kHeadDim, 1, 1>;
  using Medium = Config<kHeadDim, 2, kHeadDim <= 128 ? 2 : 1>;
  using Large = Config<kHeadDim, 4, kHeadDim <= 128 ? 2 : 1>;
};

// How one call runs: kernel shape, grid and splits.
struct Plan {
  int m_blocks = 0;
  int splits = 1;
  int split_keys = 0;
  size_t workspace_bytes = 0;  // for `splits`
};

// The split count that fills every SM once with CTAs of `C`, at most
// `max_splits`.
template <typename T, class C>
cudaError_t MakePlan(const DeviceAttentionArgs& args, size_t max_workspace,
                     Plan* plan) {
  const int64_t rows = args.q_len * (args.q_heads / args.kv_heads);
  plan->m_blocks = static_cast<int>(CeilDiv(rows, C::kBlockM));
  int device = 0;
  int sms = 0;
  int per_sm = 0;
  cudaError_t error = cudaGetDevice(&device);
  if (error == cudaSuccess) {
    error = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount,
                                   device);
  }
  if (error == cudaSuccess) {
    error = cudaFuncSetAttribute(DecodeSplitKernel<T, C>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 C::kSharedBytes);
  }
  if (error == cudaSuccess) {
    error = cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &per_sm, DecodeSplitKernel<T, C>, kThreads, C::kSharedBytes);
  }
  if (error != cudaSuccess) return error;
  const int64_t units = args.batch * args.kv_heads * plan->m_blocks;
  const int64_t slots = static_cast<int64_t>(sms) * std::max(per_sm, 1);
  const int64_t key_tiles = CeilDiv(args.kv_len, C::kBlockN);
  int64_t splits = std::min(slots / units,
                            CeilDiv(key_tiles, kMinTilesPerSplit));
  const size_t split_bytes = static_cast<size_t>(args.batch * args.kv_heads *
                                                 rows * (C::kHeadDim + 1)) *
                             sizeof(float);
  splits = std::min<int64_t>(splits, max_workspace / split_bytes);
  splits = std::clamp<int64_t>(splits, 1, 65535);
  plan->split_keys =
      static_cast<int>(std::max<int64_t>(1, CeilDiv(key_tiles, splits)) *
                       C::kBlockN);
  plan->splits = static_cast<int>(
      std::max<int64_t>(1, CeilDiv(args.kv_len, plan->split_keys)));
  plan->workspace_bytes = plan->splits > 1 ? plan->splits * split_bytes : 0;
  return cudaSuccess;
}

template <typename T, class C>
cudaError_t Run(const DeviceAttentionArgs& args, Params params,
                void* workspace, size_t workspace_bytes, cudaStream_t stream,
                size_t* needed_bytes) {
  Plan plan;
  const size_t budget = needed_bytes != nullptr ? SIZE_MAX : workspace_bytes;
  if (cudaError_t error = MakePlan<T, C>(args, budget, &plan);
      error != cudaSuccess) {
    return error;
  }
  if (needed_bytes != nullptr) {
    *needed_bytes = plan.workspace_bytes;
    return cudaSuccess;
  }
  params.split_keys = plan.split_keys;
  params.splits = plan.splits;
  params.partial_stride = C::kHeadDim;
  const int64_t cells = args.batch * args.kv_heads * params.rows;
  params.partial_o = static_cast<float*>(workspace);
  params.partial_lse =
      params.partial_o + static_cast<int64_t>(plan.splits) * cells * C::kHeadDim;
  const dim3 grid(static_cast<unsigned>(plan.m_blocks),
                  static_cast<unsigned>(plan.splits),
                  static_cast<unsigned>(args.batch * args.kv_heads));
  DecodeSplitKernel<T, C><<<grid, kThreads, C::kSharedBytes, stream>>>(params);
  if (cudaError_t error = cudaGetLastError(); error != cudaSuccess) {
    return error;
  }
  if (plan.splits == 1) return cudaSuccess;
  DecodeCombineKernel<T>
      <<<static_cast<unsigned>(CeilDiv(cells, kWarps)), kThreads, 0, stream>>>(
          params, cells);
  return cudaGetLastError();
}

template <typename T, int kHeadDim>
cudaError_t RunForRows(const DeviceAttentionArgs& args, const Params& params,
                       void* workspace, size_t workspace_bytes,
                       cudaStream_t stream, size_t* needed_bytes) {
  using S = Shapes<kHeadDim>;
  if (params.rows <= S::Small::kBlockM) {
    return Run<T, typename S::Small>(args, params, workspace, workspace_bytes,
                                     stream, needed_bytes);
  }
  if (params.rows <= S::Medium::kBlockM) {
    return Run<T, typename S::Medium>(args, params, workspace, workspace_bytes,
                                      stream, needed_bytes);
  }
  return Run<T, typename S::Large>(args, params, workspace, workspace_bytes,
                                   stream, needed_bytes);
}

template <typename T>
cudaError_t RunForHeadDim(const DeviceAttentionArgs& args,
                          const Params& params, void* workspace,
                          size_t workspace_bytes, cudaStream_t stream,
                          size_t* needed_bytes) {
  if (params.head_dim <= 64) {
    return RunForRows<T, 64>(args, params, workspace, workspace_bytes, stream,
                             needed_bytes);
  }
  if (params.head_dim <= 80) {
    return RunForRows<T, 80>(args, params, workspace, workspace_bytes, stream,
                             needed_bytes);
  }
  if (params.head_dim <= 96) {
    return RunForRows<T, 96>(args, params, workspace, workspace_bytes, stream,
                             needed_bytes);
  }
  if (params.head_dim <= 128) {
    return RunForRows<T, 128>(args, params, workspace, workspace_bytes, stream,
                              needed_bytes);
  }
  return RunForRows<T, 256>(args, params, workspace, workspace_bytes, stream,
                            needed_bytes);
}

// Checks `args` and fills the kernel parameters; false if they are rejected.
bool MakeParams(const DeviceAttentionArgs& args, Params* params) {
  constexpr int64_t kMaxGrid = 65535;
  constexpr int64_t kMaxLength = int64_t{1} << 30;
  if (FindAttentionArgsProblem(args) != nullptr) return false;
  const int64_t group = args.q_heads / args.kv_heads;
  if (args.batch * args.kv_heads > kMaxGrid || args.q_len > kMaxLength ||
      args.kv_len > kMaxLength || args.q_len * group > kMaxLength) {
    return false;
  }
  Params& p = *params;
  p = Params{};
  p.q = args.q.data;
  p.k = args.k.data;
  p.v = args.v.data;
  p.o = args.o.data;
  p.lse = args.lse;
  p.q_batch_stride = args.q.batch_stride;
  p.q_seq_stride = args.q.seq_stride;
  p.k_batch_stride = args.k.batch_stride;
  p.k_seq_stride = args.k.seq_stride;
  p.v_batch_stride = args.v.batch_stride;
  p.v_seq_stride = args.v.seq_stride;
  p.o_batch_stride = args.o.batch_stride;
  p.o_seq_stride = args.o.seq_stride;
  p.q_len = static_cast<int>(args.q_len);
  p.kv_len = static_cast<int>(args.kv_len);
  p.q_heads = static_cast<int>(args.q_heads);
  p.kv_heads = static_cast<int>(args.kv_heads);
  p.group = static_cast<int>(group);
  p.head_dim = static_cast<int>(args.head_dim);
  p.rows = static_cast<int>(args.q_len * group);
  p.causal_shift = static_cast<int>(args.kv_len - args.q_len);
  p.causal = args.causal;
  p.scale_log2 = args.scale * kLog2e;
  const bool strides_aligned =
      args.head_dim % 8 == 0 && args.q.batch_stride % 8 == 0 &&
      args.q.seq_stride % 8 == 0 && args.k.batch_stride % 8 == 0 &&
      args.k.seq_stride % 8 == 0 && args.v.batch_stride % 8 == 0 &&
      args.v.seq_stride % 8 == 0 && args.o.batch_stride % 8 == 0 &&
      args.o.seq_stride % 8 == 0;
  p.aligned = strides_aligned && Aligned16(args.q.data) &&
              Aligned16(args.k.data) && Aligned16(args.v.data) &&
              Aligned16(args.o.data);
  return true;
}

cudaError_t Dispatch(const DeviceAttentionArgs& args, const Params& params,
                     void* workspace, size_t workspace_bytes,
                     cudaStream_t stream, size_t* needed_bytes) {
  return args.dtype == DeviceDType::kBFloat16
             ? RunForHeadDim<__nv_bfloat16>(args, params, workspace,
                                            workspace_bytes, stream,
                                            needed_bytes)
             : RunForHeadDim<__half>(args, params, workspace, workspace_bytes,
                                     stream, needed_bytes);
}

}  // namespace

size_t DecodeAttentionWorkspaceBytes(const DeviceAttentionArgs& args) {
  Params params;
  if (!MakeParams(args, &params) || args.batch == 0 || args.q_len == 0) {
    return 0;
  }
  size_t bytes = 0;
  if (Dispatch(args, params, nullptr, 0, nullptr, &bytes) != cudaSuccess) {
    return 0;
  }
  return bytes;
}

cudaError_t LaunchDecodeAttention(const DeviceAttentionArgs& args,
                                  void* workspace, size_t workspace_bytes,
                                  cudaStream_t stream) {
  Params params;
  if (!MakeParams(args, &params)) return cudaErrorInvalidValue;
  if (args.batch == 0 || args.q_len == 0) return cudaSuccess;
  if (workspace == nullptr) workspace_bytes = 0;
  return Dispatch(args, params, workspace, workspace_bytes, stream, nullptr);
}

}  // namespace ringattn
