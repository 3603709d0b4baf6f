#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/cuda/hopper_attention.h"
#include "kernels/cuda/mma_util.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace ringattn {
namespace {

using device::CommitCopies;
using device::CopyAsync16;
using device::Element;
using device::Exp2;
using device::FenceSharedForAsyncProxy;
using device::MmaRegisters;
using device::MmaShared;
using device::PinRegisters;
using device::SwizzledChunk;
using device::SwizzledDescriptor;
using device::WaitCopies;
using device::WarpgroupCommit;
using device::WarpgroupFence;
using device::WarpgroupWait;

constexpr int kWarpgroups = 2;
constexpr int kThreads = kWarpgroups * 128;
constexpr int kBlockM = kWarpgroups * 64;  // query rows per thread block
constexpr int kBlockN = 128;               // keys per step
constexpr int kMaxBatchHeads = 65535;
constexpr int64_t kMaxLength = int64_t{1} << 30;

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

static_assert(kBlockM == kWorkListTileRows,
              "a work list's query tile is one thread block's rows");

// Shared memory for one head dim: the Q tile, then two stages of K and V
// tiles, each a run of swizzled [rows x 64] blocks (wgmma.cuh), plus room to
// align the start to 1024 bytes.
template <int kHeadDim>
struct Layout {
  static constexpr int kQElements = kBlockM * kHeadDim;
  static constexpr int kKvElements = kBlockN * kHeadDim;
  static constexpr int kSharedBytes = (kQElements + 4 * kKvElements) * 2 + 1024;
};

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
  float scale_log2;  // scale * log2(e)
  // The whole block: one span [0, kv_len), causal with shift kv_len - q_len
  // if `causal`. Or, with tiles != nullptr, the list.
  bool causal;
  const QueryTile* tiles;
  const KeySpan* spans;
};

// Where a thread block is in its walk over keys: the span and the first key
// of the step.
struct KeyCursor {
  int span;
  int key;
};

// The spans of one query tile, and the walk over their steps.
class TileSpans {
 public:
  // The spans of this thread block's tile, whose last row is end_row - 1.
  __device__ TileSpans(const Params& p, int end_row)
      : p_(p), end_row_(end_row) {
    if (p.tiles != nullptr) {
      const QueryTile tile = p.tiles[blockIdx.x];
      first_ = tile.first_span;
      count_ = tile.span_count;
    } else {
      first_ = 0;
      count_ = 1;
      whole_.begin = 0;
      whole_.end = p.kv_len;
      whole_.causal = p.causal;
      whole_.shift = p.kv_len - p.q_len;
    }
  }

  __device__ KeySpan Span(int i) const {
    return p_.tiles != nullptr ? p_.spans[first_ + i] : whole_;
  }

  // One past the last key of span i that any row of the tile sees.
  __device__ int VisibleEnd(const KeySpan& span) const {
    int end = min(span.end, p_.kv_len);
    if (span.causal) end = min(end, max(span.begin, end_row_ + span.shift));
    return end;
  }

  // The first step at or after span `i`, or span == count() at the end.
  __device__ KeyCursor FirstStepFrom(int i) const {
    for (; i < count_; ++i) {
      const KeySpan span = Span(i);
      if (span.begin < VisibleEnd(span)) return {i, span.begin};
    }
    return {count_, 0};
  }

  __device__ KeyCursor Next(KeyCursor cursor) const {
    const KeySpan span = Span(cursor.span);
    if (cursor.key + kBlockN < VisibleEnd(span)) {
      return {cursor.span, cursor.key + kBlockN};
    }
    return FirstStepFrom(cursor.span + 1);
  }

  __device__ int count() const { return count_; }

 private:
  const Params& p_;
  int end_row_;
  int first_ = 0;
  int count_ = 0;
  KeySpan whole_;
};

// Copies rows [first, first + kRows) of one head into a swizzled tile of
// kHeadDim columns by cp.async (the caller commits and waits). Rows at or past
// `rows` and columns at or past `head_dim` become zero.
template <typename T, int kHeadDim, int kRows>
__device__ __forceinline__ void LoadTile(T* tile, const T* head,
                                         int64_t seq_stride, int first,
                                         int rows, int head_dim) {
  constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per row
  for (int i = threadIdx.x; i < kRows * kChunks; i += kThreads) {
    const int r = i / kChunks;
    const int c = i % kChunks;
    const int row = first + r;
    const bool in = row < rows && c * 8 < head_dim;
    T* to =
        tile + (c / 8) * (kRows * 64) + r * 64 + SwizzledChunk(r, c % 8) * 8;
    const T* from =
        in ? head + static_cast<int64_t>(row) * seq_stride + c * 8 : head;
    CopyAsync16(to, from, in ? 16 : 0);
  }
}

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(kThreads, 1)
    HopperAttentionKernel(const Params p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using E = Element<T>;
  using L = Layout<kHeadDim>;
  constexpr int kScoreRegs = kBlockN / 2;  // S accumulator per thread
  constexpr int kOutRegs = kHeadDim / 2;   // O accumulator per thread

  extern __shared__ unsigned char shared_bytes[];
  T* const q_tile = reinterpret_cast<T*>(
      (reinterpret_cast<uintptr_t>(shared_bytes) + 1023) & ~uintptr_t{1023});
  // Stage s of K at k_tiles + s * kKvElements, of V likewise.
  T* const k_tiles = q_tile + L::kQElements;
  T* const v_tiles = k_tiles + 2 * L::kKvElements;

  int m0;
  int m_end;
  if (p.tiles != nullptr) {
    const QueryTile tile = p.tiles[blockIdx.x];
    m0 = tile.begin;
    m_end = min(tile.end, p.q_len);
  } else {
    // Later query tiles see more keys under causal masking: start them first.
    m0 = (gridDim.x - 1 - blockIdx.x) * kBlockM;
    m_end = min(m0 + kBlockM, p.q_len);
  }
  const int b = blockIdx.y / p.q_heads;
  const int h = blockIdx.y % p.q_heads;
  const int kv_h = h / p.group;
  const int warpgroup = threadIdx.x / 128;
  const int warp = threadIdx.x % 128 / 32;
  const int lane = threadIdx.x % 32;
  // This thread's rows: row0 and row0 + 8 (accumulator elements e < 2 and
  // e >= 2 of each 8-column chunk).
  const int group_row0 = m0 + warpgroup * 64;
  const int row0 = group_row0 + warp * 16 + lane / 4;

  const T* q = static_cast<const T*>(p.q) + b * p.q_batch_stride +
               static_cast<int64_t>(h) * p.head_dim;
  const T* k = static_cast<const T*>(p.k) + b * p.k_batch_stride +
               static_cast<int64_t>(kv_h) * p.head_dim;
  const T* v = static_cast<const T*>(p.v) + b * p.v_batch_stride +
               static_cast<int64_t>(kv_h) * p.head_dim;
  T* o = static_cast<T*>(p.o) + b * p.o_batch_stride +
         static_cast<int64_t>(h) * p.head_dim;

  const TileSpans spans(p, m_end);

  float o_acc[kOutRegs];
#pragma unroll
  for (int i = 0; i < kOutRegs; ++i) o_acc[i] = 0.0f;
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.0f, 0.0f};

  KeyCursor cursor = spans.FirstStepFrom(0);
  if (cursor.span < spans.count()) {
    LoadTile<T, kHeadDim, kBlockM>(q_tile, q, p.q_seq_stride, m0, m_end,
                                   p.head_dim);
    LoadTile<T, kHeadDim, kBlockN>(k_tiles, k, p.k_seq_stride, cursor.key,
                                   p.kv_len, p.head_dim);
    LoadTile<T, kHeadDim, kBlockN>(v_tiles, v, p.v_seq_stride, cursor.key,
                                   p.kv_len, p.head_dim);
  }
  CommitCopies();

  for (int step = 0; cursor.span < spans.count(); ++step) {
    const int stage = step % 2;
    const KeyCursor next = spans.Next(cursor);
    if (next.span < spans.count()) {
      LoadTile<T, kHeadDim, kBlockN>(k_tiles + (1 - stage) * L::kKvElements, k,
                                     p.k_seq_stride, next.key, p.kv_len,
                                     p.head_dim);
      LoadTile<T, kHeadDim, kBlockN>(v_tiles + (1 - stage) * L::kKvElements, v,
                                     p.v_seq_stride, next.key, p.kv_len,
                                     p.head_dim);
    }
    CommitCopies();
    WaitCopies<1>();  // everything but the next step's tiles has landed
    FenceSharedForAsyncProxy();
    __syncthreads();

    // S = Q K^T for this warpgroup's 64 rows.
    float s[kScoreRegs];
    WarpgroupFence();
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      const int column_block = kk / 4;
      const int column = (kk % 4) * 16;
      const uint64_t a = SwizzledDescriptor(
          q_tile + column_block * kBlockM * 64 + warpgroup * 64 * 64 + column,
          0);
      const uint64_t bk =
          SwizzledDescriptor(k_tiles + stage * L::kKvElements +
                                 column_block * kBlockN * 64 + column,
                             0);
      MmaShared<T, kBlockN>(s, a, bk, kk > 0 ? 1 : 0);
    }
    WarpgroupCommit();
    WarpgroupWait<0>();
    PinRegisters(s);

    // Hide keys past the span and, under its causal mask, above the diagonal.
    const KeySpan span = spans.Span(cursor.span);
    const int span_end = min(span.end, p.kv_len);
    const int n0 = cursor.key;
    const int warp_row0 = group_row0 + warp * 16;
    const bool past_end = n0 + kBlockN > span_end;
    const bool crosses_diagonal =
        span.causal && n0 + kBlockN - 1 > warp_row0 + span.shift;
    if (past_end || crosses_diagonal) {
#pragma unroll
      for (int i = 0; i < kScoreRegs; ++i) {
        const int key = n0 + (i / 4) * 8 + (lane % 4) * 2 + (i % 2);
        const int row = row0 + (i % 4 >= 2 ? 8 : 0);
        if (key >= span_end || (span.causal && key > row + span.shift)) {
          s[i] = -INFINITY;
        }
      }
    }

    // Online softmax: new running max, rescale what came before, P = 2^(S -
    // max) in place of S.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float tile_max = -INFINITY;
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j) {
        tile_max =
            fmaxf(tile_max, fmaxf(s[4 * j + 2 * r], s[4 * j + 2 * r + 1]));
      }
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
      const float new_max = fmaxf(row_max[r], tile_max * p.scale_log2);
      // A row that has seen only hidden keys keeps max -inf; subtracting 0
      // then leaves every exp2 at 0 instead of NaN.
      const float offset = new_max == -INFINITY ? 0.0f : new_max;
      const float rescale = Exp2(row_max[r] - offset);
      row_max[r] = new_max;
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j) {
#pragma unroll
        for (int c = 2 * r; c < 2 * r + 2; ++c) {
          s[4 * j + c] = Exp2(fmaf(s[4 * j + c], p.scale_log2, -offset));
          sum += s[4 * j + c];
        }
      }
      row_sum[r] = row_sum[r] * rescale + sum;
#pragma unroll
      for (int j = 0; j < kHeadDim / 8; ++j) {
        o_acc[4 * j + 2 * r] *= rescale;
        o_acc[4 * j + 2 * r + 1] *= rescale;
      }
    }

    // O += P V; the S accumulator layout is the A fragment layout.
    uint32_t pa[kBlockN / 16][4];
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      pa[kk][0] = E::Pack(s[8 * kk + 0], s[8 * kk + 1]);
      pa[kk][1] = E::Pack(s[8 * kk + 2], s[8 * kk + 3]);
      pa[kk][2] = E::Pack(s[8 * kk + 4], s[8 * kk + 5]);
      pa[kk][3] = E::Pack(s[8 * kk + 6], s[8 * kk + 7]);
    }
    PinRegisters(o_acc);
    WarpgroupFence();
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      const uint64_t bv = SwizzledDescriptor(
          v_tiles + stage * L::kKvElements + kk * 16 * 64, kBlockN * 64 * 2);
      MmaRegisters<T, kHeadDim>(o_acc, pa[kk], bv);
    }
    WarpgroupCommit();
    WarpgroupWait<0>();
    PinRegisters(o_acc);
    __syncthreads();  // every warpgroup is done with this stage's tiles
    cursor = next;
  }
  WaitCopies<0>();

  // Normalize and store. A row that saw no key has sum 0: O = 0, LSE = -inf.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = row_sum[r];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const int row = row0 + r * 8;
    if (row >= m_end) continue;
    const float inverse = sum > 0.0f ? 1.0f / sum : 0.0f;
    T* out = o + static_cast<int64_t>(row) * p.o_seq_stride;
#pragma unroll
    for (int j = 0; j < kHeadDim / 8; ++j) {
      const int d = j * 8 + (lane % 4) * 2;
      if (d < p.head_dim) {
        *reinterpret_cast<uint32_t*>(out + d) = E::Pack(
            o_acc[4 * j + 2 * r] * inverse, o_acc[4 * j + 2 * r + 1] * inverse);
      }
    }
    if (p.lse != nullptr && lane % 4 == 0) {
      p.lse[(static_cast<int64_t>(b) * p.q_len + row) * p.q_heads + h] =
          sum > 0.0f ? (row_max[r] + __log2f(sum)) * kLn2 : -INFINITY;
    }
  }
#else
  __trap();  // built for sm_90a only; HopperAttentionTakes keeps others away
#endif
}

bool Aligned16(const void* pointer) {
  return reinterpret_cast<uintptr_t>(pointer) % 16 == 0;
}

// Whether the current device is a Hopper GPU (compute capability 9.0).
bool OnHopper() {
  int device = 0;
  int major = 0;
  int minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor,
                             device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor,
                             device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return major == 9 && minor == 0;
}

template <typename T, int kHeadDim>
cudaError_t Launch(const Params& params, unsigned tiles, unsigned batch_heads,
                   cudaStream_t stream) {
  constexpr int kBytes = Layout<kHeadDim>::kSharedBytes;
  const cudaError_t error =
      cudaFuncSetAttribute(HopperAttentionKernel<T, kHeadDim>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes);
  if (error != cudaSuccess) return error;
  HopperAttentionKernel<T, kHeadDim>
      <<<dim3(tiles, batch_heads), kThreads, kBytes, stream>>>(params);
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchForHeadDim(const Params& params, unsigned tiles,
                             unsigned batch_heads, cudaStream_t stream) {
  return params.head_dim <= 64
             ? Launch<T, 64>(params, tiles, batch_heads, stream)
             : Launch<T, 128>(params, tiles, batch_heads, stream);
}

}  // namespace

bool HopperAttentionTakes(const DeviceAttentionArgs& args) {
  const bool strides_aligned =
      args.q.batch_stride % 8 == 0 && args.q.seq_stride % 8 == 0 &&
      args.k.batch_stride % 8 == 0 && args.k.seq_stride % 8 == 0 &&
      args.v.batch_stride % 8 == 0 && args.v.seq_stride % 8 == 0 &&
      args.o.batch_stride % 8 == 0 && args.o.seq_stride % 8 == 0;
  return args.head_dim % 8 == 0 && args.head_dim <= 128 && strides_aligned &&
         Aligned16(args.q.data) && Aligned16(args.k.data) &&
         Aligned16(args.v.data) && Aligned16(args.o.data) &&
         args.batch * args.q_heads <= kMaxBatchHeads &&
         args.q_len < kMaxLength && args.kv_len < kMaxLength &&
         args.work.tile_count <= kMaxLength && OnHopper();
}

cudaError_t LaunchHopperAttention(const DeviceAttentionArgs& args,
                                  cudaStream_t stream) {
  if (FindAttentionArgsProblem(args) != nullptr) return cudaErrorInvalidValue;
  if (args.batch == 0 || args.q_len == 0) return cudaSuccess;
  if (!HopperAttentionTakes(args)) return cudaErrorInvalidValue;
  const bool listed = args.work.tile_count > 0;
  if (listed && (args.work.tiles == nullptr || args.work.spans == nullptr)) {
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
  params.scale_log2 = args.scale * kLog2e;
  params.causal = args.causal;
  params.tiles = listed ? args.work.tiles : nullptr;
  params.spans = listed ? args.work.spans : nullptr;
  const unsigned tiles = static_cast<unsigned>(
      listed ? args.work.tile_count : (args.q_len + kBlockM - 1) / kBlockM);
  const unsigned batch_heads = static_cast<unsigned>(args.batch * args.q_heads);
  return args.dtype == DeviceDType::kBFloat16
             ? LaunchForHeadDim<__nv_bfloat16>(params, tiles, batch_heads,
                                               stream)
             : LaunchForHeadDim<__half>(params, tiles, batch_heads, stream);
}

}  // namespace ringattn
