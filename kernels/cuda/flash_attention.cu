#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/cuda/flash_attention.h"
#include "kernels/cuda/mma_util.cuh"

namespace ringattn {
namespace {

using device::CommitCopies;
using device::CopyAsync16;
using device::Element;
using device::LoadMatrices;
using device::LoadMatricesTransposed;
using device::OnlineSoftmaxStep;
using device::WaitCopies;

// A block of kWarps warps takes kBlockM query rows of one (batch, head), each
// warp kMTiles * 16 of them, and walks the visible keys kBlockN at a time.
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Tile shape for one compiled head dim. Two 16-row tiles per warp let each K
// and V fragment read from shared memory feed two products (half the shared
// traffic per flop); at head dim 256 the accumulators leave room for one.
// Shared-memory rows are padded by 16 bytes so that the eight rows one
// ldmatrix phase reads fall in distinct banks.
template <int kHeadDim>
struct Tile {
  static constexpr int kMTiles = kHeadDim <= 128 ? 2 : 1;
  static constexpr int kBlockM = kWarps * 16 * kMTiles;
  static constexpr int kBlockN = kHeadDim <= 128 ? 64 : 32;
  static constexpr int kStride = kHeadDim + 8;  // elements per shared row
  static constexpr int kSharedBytes = (kBlockM + 2 * kBlockN) * kStride * 2;
};

// Everything the kernel reads, with strides in elements.
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
  int group;  // q_heads / kv_heads
  int head_dim;
  int causal_shift;  // kv_len - q_len: query i sees key j iff j <= i + shift
  bool causal;
  float scale_log2;  // scale * log2(e)
  bool aligned;      // 16-byte rows: cp.async tiles and paired stores
  // The work list (device memory); tiles null for the whole block.
  const QueryTile* tiles;
  const KeySpan* spans;
  int span_count;
};

// Loads rows [first, first + kRows) of one head into a shared tile of kHeadDim
// columns. Rows at or past `rows` and columns at or past `head_dim` become
// zero. Aligned tensors go through cp.async (the caller commits and waits);
// others are copied element by element.
template <typename T, int kHeadDim, int kRows>
__device__ __forceinline__ void LoadTile(T* tile, const T* head,
                                         int64_t seq_stride, int first,
                                         int rows, int head_dim, bool aligned) {
  constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per row
  constexpr int kStride = Tile<kHeadDim>::kStride;
  for (int i = threadIdx.x; i < kRows * kChunks; i += kThreads) {
    const int r = i / kChunks;
    const int d = (i % kChunks) * 8;
    const int row = first + r;
    T* to = tile + r * kStride + d;
    const bool row_in = row < rows;
    if (aligned) {
      const bool in = row_in && d < head_dim;
      const T* from = in ? head + row * seq_stride + d : head;
      CopyAsync16(to, from, in ? 16 : 0);
    } else {
      const T* from = head + (row_in ? row : 0) * seq_stride;
      for (int e = 0; e < 8; ++e) {
        to[e] = row_in && d + e < head_dim ? from[d + e] : T(0.0f);
      }
    }
  }
}

// Keys [begin, end) of the block, with the causal mask `shift` if `causal`,
// cut to what some row of one kBlockM-row window of queries may see.
struct Span {
  int begin;
  int end;
  bool causal;
  int shift;
};

// The spans of one window of query rows (last row `last_row`): the whole
// block as the args say, or a QueryTile's spans of the work list. Spans are
// clipped to the block's keys and, if causal, to the keys the window's last
// row sees; Seek skips the ones that leave no key.
template <bool kList>
struct SpanWalk {
  const KeySpan* spans;  // the tile's first span (kList)
  int count;             // spans in the tile (kList)
  int next;              // the next span Seek looks at

  // Moves `span` to the next span with a visible key, if any.
  __device__ __forceinline__ bool Seek(const Params& p, int last_row,
                                       Span& span) {
    while (next < count) {
      const int index = next++;
      if constexpr (kList) {
        const KeySpan listed = spans[index];
        span.begin = max(listed.begin, 0);
        span.end = min(listed.end, p.kv_len);
        span.causal = listed.causal != 0;
        span.shift = listed.shift;
      } else {
        span.begin = 0;
        span.end = p.kv_len;
        span.causal = p.causal;
        span.shift = p.causal_shift;
      }
      if (span.causal)
        span.end = min(span.end, max(0, last_row + span.shift + 1));
      if (span.begin < span.end) return true;
    }
    return false;
  }
};

// Attention of query rows [m0, min(m0 + kBlockM, row_end)) of one (batch,
// head) against the keys `walk` gives, walked kBlockN at a time with one
// online softmax: writes their O and LSE. Ends with every warp done with the
// shared tiles.
template <typename T, int kHeadDim, bool kList>
__device__ __forceinline__ void AttendRows(const Params& p, const T* q,
                                           const T* k, const T* v, T* o, int m0,
                                           int row_end, SpanWalk<kList> walk) {
  using E = Element<T>;
  constexpr int kMTiles = Tile<kHeadDim>::kMTiles;
  constexpr int kBlockM = Tile<kHeadDim>::kBlockM;
  constexpr int kBlockN = Tile<kHeadDim>::kBlockN;
  constexpr int kStride = Tile<kHeadDim>::kStride;
  constexpr int kDimTiles = kHeadDim / 8;  // n-tiles of O
  constexpr int kKeyTiles = kBlockN / 8;   // n-tiles of S

  extern __shared__ __align__(16) unsigned char shared_bytes[];
  T* q_tile = reinterpret_cast<T*>(shared_bytes);
  T* k_tile = q_tile + kBlockM * kStride;
  T* v_tile = k_tile + kBlockN * kStride;

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int quad_row = lane / 4;  // fragment row within 8
  const int quad_col = lane % 4;  // fragment column pair
  const int last_row = min(m0 + kBlockM, row_end) - 1;

  // This warp's rows start at warp_row0; in m-tile m, this thread holds rows
  // warp_row0 + 16 m + quad_row and 8 below it (r = 0, 1).
  const int warp_row0 = m0 + warp * 16 * kMTiles;
  const int thread_row0 = warp_row0 + quad_row;

  float o_acc[kMTiles][kDimTiles][4];
#pragma unroll
  for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
    for (int t = 0; t < kDimTiles; ++t) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o_acc[m][t][e] = 0.0f;
    }
  }
  // Per row: the running max of the scaled log2 scores, and this thread's
  // share of the softmax denominator.
  float row_max[kMTiles][2];
  float row_sum[kMTiles][2];
#pragma unroll
  for (int m = 0; m < kMTiles; ++m) {
    row_max[m][0] = row_max[m][1] = -INFINITY;
    row_sum[m][0] = row_sum[m][1] = 0.0f;
  }

  // The chunk of keys [n0, n0 + kBlockN) of `span` is the one computed next.
  Span span;
  bool more = walk.Seek(p, last_row, span);
  int n0 = span.begin;
  if (more) {
    LoadTile<T, kHeadDim, kBlockM>(q_tile, q, p.q_seq_stride, m0, row_end,
                                   p.head_dim, p.aligned);
    LoadTile<T, kHeadDim, kBlockN>(k_tile, k, p.k_seq_stride, n0, p.kv_len,
                                   p.head_dim, p.aligned);
    CommitCopies();
  }

  while (more) {
    LoadTile<T, kHeadDim, kBlockN>(v_tile, v, p.v_seq_stride, n0, p.kv_len,
                                   p.head_dim, p.aligned);
    CommitCopies();
    WaitCopies<1>();  // Q and this K tile have landed
    __syncthreads();

    // S = Q K^T for this warp's rows.
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
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
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
                             (j * 8 + (lane % 8) + (lane / 16) * 8) * kStride +
                             kk * 16 + (lane / 8 % 2) * 8);
#pragma unroll
        for (int m = 0; m < kMTiles; ++m) {
          E::Mma(s[m][j], a[m], bk[0], bk[1]);
          E::Mma(s[m][j + 1], a[m], bk[2], bk[3]);
        }
      }
    }

    // Hide keys past the span's end and, under causal masking, above its
    // diagonal.
    // (The whole block's mask stays in the kernel's parameters.)
    const bool causal = kList ? span.causal : p.causal;
    const int shift = kList ? span.shift : p.causal_shift;
    const int end = kList ? span.end : p.kv_len;
    const bool past_end = n0 + kBlockN > end;
    const bool crosses_diagonal =
        causal && n0 + kBlockN - 1 > warp_row0 + shift;
    if (past_end || crosses_diagonal) {
#pragma unroll
      for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
        for (int j = 0; j < kKeyTiles; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = n0 + j * 8 + quad_col * 2 + (e & 1);
            const int row = thread_row0 + m * 16 + (e >= 2 ? 8 : 0);
            if (key >= end || (causal && key > row + shift)) {
              s[m][j][e] = -INFINITY;
            }
          }
        }
      }
    }

    OnlineSoftmaxStep(s, row_max, row_sum, o_acc, p.scale_log2);

    WaitCopies<0>();  // this V tile has landed
    __syncthreads();  // and every warp is done with the K tile
    // The next chunk: further into this span, or the start of the next span
    // that shows a key.
    n0 += kBlockN;
    if constexpr (kList) {
      if (n0 >= span.end) {
        more = walk.Seek(p, last_row, span);
        n0 = span.begin;
      }
    } else {
      more = n0 < span.end;  // the whole block is one span
    }
    if (more) {
      LoadTile<T, kHeadDim, kBlockN>(k_tile, k, p.k_seq_stride, n0, p.kv_len,
                                     p.head_dim, p.aligned);
      CommitCopies();
    }

    // O += P V; the S accumulator layout is the A operand layout.
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
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
            bv, v_tile + (kk * 16 + (lane % 8) + (lane / 8 % 2) * 8) * kStride +
                    t * 8 + (lane / 16) * 8);
#pragma unroll
        for (int m = 0; m < kMTiles; ++m) {
          E::Mma(o_acc[m][t], a[m], bv[0], bv[1]);
          E::Mma(o_acc[m][t + 1], a[m], bv[2], bv[3]);
        }
      }
    }
    __syncthreads();  // every warp is done with the V tile
  }

  // Normalize and store. A row that saw no key has sum 0: O = 0, LSE = -inf.
#pragma unroll
  for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float sum = row_sum[m][r];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const int row = thread_row0 + m * 16 + r * 8;
      if (row >= (kList ? row_end : p.q_len)) continue;
      const float inverse = sum > 0.0f ? 1.0f / sum : 0.0f;
      T* out = o + row * p.o_seq_stride;
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
        const int b = blockIdx.y / p.q_heads;
        const int h = blockIdx.y % p.q_heads;
        p.lse[(static_cast<int64_t>(b) * p.q_len + row) * p.q_heads + h] =
            sum > 0.0f ? (row_max[m][r] + __log2f(sum)) * kLn2 : -INFINITY;
      }
    }
  }
}

// One block per kBlockM query rows (whole block) or per QueryTile of the work
// list (kList), of one (batch, head) of blockIdx.y.
template <typename T, int kHeadDim, bool kList>
__global__ void __launch_bounds__(kThreads)
    FlashAttentionKernel(const Params p) {
  constexpr int kBlockM = Tile<kHeadDim>::kBlockM;
  const int b = blockIdx.y / p.q_heads;
  const int h = blockIdx.y % p.q_heads;
  const int kv_h = h / p.group;
  const T* q = static_cast<const T*>(p.q) + b * p.q_batch_stride +
               static_cast<int64_t>(h) * p.head_dim;
  const T* k = static_cast<const T*>(p.k) + b * p.k_batch_stride +
               static_cast<int64_t>(kv_h) * p.head_dim;
  const T* v = static_cast<const T*>(p.v) + b * p.v_batch_stride +
               static_cast<int64_t>(kv_h) * p.head_dim;
  T* o = static_cast<T*>(p.o) + b * p.o_batch_stride +
         static_cast<int64_t>(h) * p.head_dim;

  if constexpr (kList) {
    // A tile of up to kWorkListTileRows rows, kBlockM at a time (two passes
    // at head dim 256). Tiles and spans outside the block are clipped.
    const QueryTile tile = p.tiles[blockIdx.x];
    const int first = min(max(tile.first_span, 0), p.span_count);
    const SpanWalk<true> walk{
        p.spans + first, min(max(tile.span_count, 0), p.span_count - first), 0};
    const int row_end = min(tile.end, p.q_len);
    for (int m0 = max(tile.begin, 0); m0 < row_end; m0 += kBlockM) {
      AttendRows<T, kHeadDim, true>(p, q, k, v, o, m0, row_end, walk);
    }
  } else {
    // Later query tiles see more keys under causal masking: start them first.
    const int m0 = (gridDim.x - 1 - blockIdx.x) * kBlockM;
    AttendRows<T, kHeadDim, false>(p, q, k, v, o, m0, p.q_len,
                                   SpanWalk<false>{nullptr, 1, 0});
  }
}

bool Aligned16(const void* pointer) {
  return reinterpret_cast<uintptr_t>(pointer) % 16 == 0;
}

template <typename T, int kHeadDim, bool kList>
cudaError_t Launch(const Params& params, const dim3& grid,
                   cudaStream_t stream) {
  constexpr int kBytes = Tile<kHeadDim>::kSharedBytes;
  const cudaError_t error =
      cudaFuncSetAttribute(FlashAttentionKernel<T, kHeadDim, kList>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes);
  if (error != cudaSuccess) return error;
  FlashAttentionKernel<T, kHeadDim, kList>
      <<<grid, kThreads, kBytes, stream>>>(params);
  return cudaGetLastError();
}

// One block per kBlockM rows of each (batch, head), or per listed tile.
template <typename T, int kHeadDim>
cudaError_t LaunchWithTile(const Params& params, int64_t tile_count,
                           int64_t batch_heads, cudaStream_t stream) {
  constexpr int kBlockM = Tile<kHeadDim>::kBlockM;
  if (params.tiles != nullptr) {
    const dim3 grid(static_cast<unsigned>(tile_count),
                    static_cast<unsigned>(batch_heads));
    return Launch<T, kHeadDim, true>(params, grid, stream);
  }
  const dim3 grid(static_cast<unsigned>((params.q_len + kBlockM - 1) / kBlockM),
                  static_cast<unsigned>(batch_heads));
  return Launch<T, kHeadDim, false>(params, grid, stream);
}

template <typename T>
cudaError_t LaunchForHeadDim(const Params& params, int64_t tile_count,
                             int64_t batch_heads, cudaStream_t stream) {
  if (params.head_dim <= 64) {
    return LaunchWithTile<T, 64>(params, tile_count, batch_heads, stream);
  }
  if (params.head_dim <= 128) {
    return LaunchWithTile<T, 128>(params, tile_count, batch_heads, stream);
  }
  return LaunchWithTile<T, 256>(params, tile_count, batch_heads, stream);
}

}  // namespace

cudaError_t LaunchFlashAttention(const DeviceAttentionArgs& args,
                                 cudaStream_t stream) {
  if (FindAttentionArgsProblem(args) != nullptr) return cudaErrorInvalidValue;
  if (args.batch == 0 || args.q_len == 0) return cudaSuccess;
  constexpr int64_t kMaxGridY = 65535;
  constexpr int64_t kMaxLength = int64_t{1} << 30;
  if (args.batch * args.q_heads > kMaxGridY || args.q_len > kMaxLength ||
      args.kv_len > kMaxLength || args.work.tile_count > kMaxWorkListTiles ||
      args.work.span_count > kMaxWorkListSpans) {
    return cudaErrorInvalidValue;
  }
  Params params;
  params.q = args.q.data;
  params.k = args.k.data;
  params.v = args.v.data;
  params.o = args.o.data;
  params.lse = args.lse;
  params.q_batch_stride = args.q.batch_stride;
  params.q_seq_stride = args.q.seq_stride;
  params.k_batch_stride = args.k.batch_stride;
  params.k_seq_stride = args.k.seq_stride;
  params.v_batch_stride = args.v.batch_stride;
  params.v_seq_stride = args.v.seq_stride;
  params.o_batch_stride = args.o.batch_stride;
  params.o_seq_stride = args.o.seq_stride;
  params.q_len = static_cast<int>(args.q_len);
  params.kv_len = static_cast<int>(args.kv_len);
  params.q_heads = static_cast<int>(args.q_heads);
  params.group = static_cast<int>(args.q_heads / args.kv_heads);
  params.head_dim = static_cast<int>(args.head_dim);
  params.causal_shift = static_cast<int>(args.kv_len - args.q_len);
  params.causal = args.causal;
  params.scale_log2 = args.scale * kLog2e;
  const bool strides_aligned =
      args.head_dim % 8 == 0 && args.q.batch_stride % 8 == 0 &&
      args.q.seq_stride % 8 == 0 && args.k.batch_stride % 8 == 0 &&
      args.k.seq_stride % 8 == 0 && args.v.batch_stride % 8 == 0 &&
      args.v.seq_stride % 8 == 0 && args.o.batch_stride % 8 == 0 &&
      args.o.seq_stride % 8 == 0;
  params.aligned = strides_aligned && Aligned16(args.q.data) &&
                   Aligned16(args.k.data) && Aligned16(args.v.data) &&
                   Aligned16(args.o.data);
  const bool listed = args.work.tile_count > 0;
  params.tiles = listed ? args.work.tiles : nullptr;
  params.spans = listed ? args.work.spans : nullptr;
  params.span_count = listed ? static_cast<int>(args.work.span_count) : 0;
  const int64_t tiles = args.work.tile_count;
  const int64_t batch_heads = args.batch * args.q_heads;
  return args.dtype == DeviceDType::kBFloat16
             ? LaunchForHeadDim<__nv_bfloat16>(params, tiles, batch_heads,
                                               stream)
             : LaunchForHeadDim<__half>(params, tiles, batch_heads, stream);
}

}  // namespace ringattn
