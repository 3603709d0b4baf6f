#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <tuple>

#include "kernels/cuda/hopper_attention.h"
#include "kernels/cuda/lse_fold.cuh"
#include "kernels/cuda/mma_util.cuh"
#include "kernels/cuda/tma.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace ringattn {
namespace {

using device::Arrive;
using device::ArriveExpectingBytes;
using device::ArriveNamedBarrier;
using device::CopyBox4d;
using device::Element;
using device::Exp2;
using device::FenceBarrierInit;
using device::FenceSharedForAsyncProxy;
using device::InitBarrier;
using device::LowerRegisters;
using device::MmaRegisters;
using device::MmaShared;
using device::PinRegisters;
using device::RaiseRegisters;
using device::SwizzledDescriptor;
using device::SyncNamedBarrier;
using device::WaitBarrier;
using device::WarpgroupCommit;
using device::WarpgroupFence;
using device::WarpgroupWait;

// A thread block is one producer warpgroup, whose first thread issues the TMA
// copies, and kConsumers warpgroups that compute 64 query rows each: two (a
// work list's tiles are two warpgroups' rows), three for a whole block of more
// than kMostPackedRows rows at head dims up to 64, or one where the whole
// query fits 64 rows (a few rows against many keys), so that no warpgroup
// idles beside the others. At D=64 a step's exponentials take about as long
// as its products, and a third warpgroup's products keep the tensor cores
// busy while two run their softmax (FlashAttention-3 runs 192-row tiles at
// D=64 too). One H200, TFLOP/s dense / causal, three consumers against two:
// 16K 511 / 472 against 436 / 428, 256K 491 / 492 against 422 / 438.
constexpr int kListConsumers = 2;
constexpr int kWideConsumers = 3;
constexpr int kConsumerRows = 64;
// Packed rows up to which the heads sharing a K/V head are packed into one
// tile. On one H100 at 1M keys, Hq=32, Hkv=8 (split keys): packed, 1 and 16
// rows read K/V at 3.1 TB/s and 64 rows took 2.5 ms; at 128 rows packed and
// unpacked tiles ran level (4.4 / 4.3 ms), at 256 unpacked ones were faster
// (8.2 against 9.2 ms).
constexpr int64_t kMostPackedRows = 256;
// Keys per step: 176 rather than 128 spreads each step's fixed costs (the
// turn, the waits, the row maxima) over more products; measured on one H100,
// 3-7% faster at D=128 and 9-11% at D=64 (FlashAttention-3 uses 176 at
// D=128 too).
constexpr int kBlockN = 176;
// A single consumer warpgroup at D=128 (a query of at most 64 packed rows: a
// few rows against many keys, read at the memory's rate) takes 64 keys a step
// in two stages instead, so that two thread blocks share an SM and each SM
// keeps two streams of K/V loads in flight.
constexpr int kSoloBlockN = 64;
// Three consumers take 128 keys a step: the S tile of 176 and its P would not
// fit the 160 registers each of their threads has.
constexpr int kWideBlockN = 128;
// The head dim of the kernel compiled for `head_dim` (smaller dims are padded
// with zeros to 64, 80, 96 or 128). At D=80 and 96 shared memory holds two
// 64-column blocks, the second part-filled with zeros, which the products
// skip: S = Q K^T takes 5 or 6 of 8 column slices and P V writes 80 or 96
// columns. One H200, 64K, dense / causal TFLOP/s: D=80 463-465 / 462-463
// against 424-430 / 420-424 padded to 128, D=96 554 / 546 against 506-507 /
// 485-490 (cuDNN 399-409 / 383 and 469-474 / 448-454).
constexpr int CompiledHeadDim(int64_t head_dim) {
  if (head_dim <= 64) return 64;
  if (head_dim <= 80) return 80;
  return head_dim <= 96 ? 96 : 128;
}
// The 64-column shared-memory blocks of a row of the kernel compiled for
// head dim `compiled_head_dim`.
constexpr int ColumnBlocks(int compiled_head_dim) {
  return (compiled_head_dim + 63) / 64;
}
// Consumers of a thread block of a whole block taller than kMostPackedRows.
constexpr int WholeBlockConsumers(int compiled_head_dim) {
  return compiled_head_dim <= 64 ? kWideConsumers : kListConsumers;
}
// Keys per step of the kernel compiled for head dim kHeadDim.
constexpr int KeysPerStep(int compiled_head_dim, int consumers) {
  if (consumers == kWideConsumers) return kWideBlockN;
  return consumers == 1 && compiled_head_dim > 64 ? kSoloBlockN : kBlockN;
}
// Thread blocks an SM holds at once for that kernel.
constexpr int BlocksPerSm(int compiled_head_dim, int consumers) {
  return consumers == 1 && compiled_head_dim > 64 ? 2 : 1;
}
// Registers per thread after the split. The sum over a block stays within
// what it starts with: 65536 / 384 = 170 a thread with two consumers (128 *
// 40 + 256 * 232), 65536 / 512 = 128 with three (128 * 32 + 384 * 160) and
// with one and two blocks an SM (128 * 24 + 128 * 232).
constexpr int ProducerRegisters(int consumers, int blocks_per_sm) {
  if (consumers == kWideConsumers) return 32;
  return blocks_per_sm > 1 ? 24 : 40;
}
constexpr int ConsumerRegisters(int consumers) {
  return consumers == kWideConsumers ? 160 : 232;
}
constexpr int kMaxBatchHeads = 65535;
// Key splits: at least this many keys each; at most kWaveKeySplits where
// that many fill a wave, else one thread block per slot (BlocksPerSm an SM);
// never more than kMostKeySplits.
constexpr int64_t kMinKeysPerSplit = 4096;
constexpr int kWaveKeySplits = 32;
constexpr int kMostKeySplits = 256;
constexpr int64_t kMaxLength = int64_t{1} << 30;
constexpr int kMostHeadsTogether = 8;

// A row keeps its running maximum (log2 units) until a tile's exceeds it by
// more than this, so most steps leave O unscaled and skip its 64 products
// (FlashAttention-4's rule): P then reaches at most 2^8, which bf16, fp16 and
// the fp32 sums hold as well as values up to 1. One H200, D=128, 64K: dense
// 646 against 619 TFLOP/s, causal 623 against 608.
constexpr float kStaleMaxSlack = 8.0f;

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

static_assert(kListConsumers * kConsumerRows == kWorkListTileRows,
              "a work list's query tile is one thread block's rows");

// Dynamic shared memory starts 16-byte aligned (the kernel asks for it), so
// the tiles, aligned to 1024 bytes for the 128-byte swizzle, start at most
// this far in. (With this two single-consumer blocks of three stages at
// D=128 share an SM; with the barriers and a whole 1024 bytes beyond the
// tiles, 88 bytes more, one H200 held one.)
constexpr int kMostAlignmentGap = 1024 - 16;

// Shared memory for one head dim: the Q tile, kStages K tiles, kStages V
// tiles, each a run of ColumnBlocks swizzled [rows x 64] blocks (wgmma.cuh),
// and the barriers, in the alignment gap before the tiles where they fit and
// after the tiles where it is too small: so kMostAlignmentGap bytes beyond
// the tiles always hold both. A V tile is released two steps after it
// arrives (its P V runs during the next step), so three stages where they
// fit: D=64 (two there were 3% slower on one H100) and a single consumer at
// D=128, whose blocks share an SM two at a time (one H200, 4M keys, Hq=32,
// Hkv=8, 1-16 rows: 3.79-3.81 ms against 3.86-3.90 with two; level at 1M).
// Two for two consumers above D=64, where three of 176 keys do not fit, and
// for a single consumer at D=80 and D=96, where three were slower (4M keys,
// one row: 4.21-4.25 against 2.96 ms at D=80, 3.62-3.66 against 3.24-3.27 at
// D=96).
template <int kHeadDim, int kConsumers>
struct Layout {
  static constexpr int kKeys = KeysPerStep(kHeadDim, kConsumers);
  static constexpr int kRowElements = ColumnBlocks(kHeadDim) * 64;
  static constexpr int kQElements = kConsumers * kConsumerRows * kRowElements;
  static constexpr int kKvElements = kKeys * kRowElements;
  static constexpr int kStages =
      kHeadDim <= 64 || (kConsumers == 1 && kHeadDim == 128) ? 3 : 2;
  static constexpr int kBlocksPerSm = BlocksPerSm(kHeadDim, kConsumers);
  static constexpr int kBarrierBytes = (1 + 4 * kStages) * 8;
  static constexpr int kTileBytes =
      (kQElements + 2 * kStages * kKvElements) * 2;
  static constexpr int kSharedBytes = kTileBytes + kMostAlignmentGap;
  static_assert(2 * kBarrierBytes - 16 <= kMostAlignmentGap,
                "barriers after the tiles fit a gap too small for them");
};
static_assert(2 * (Layout<128, 1>::kSharedBytes + 1024) <= 228 * 1024 &&
                  Layout<128, 2>::kSharedBytes <= 227 * 1024 &&
                  Layout<64, kWideConsumers>::kSharedBytes <= 227 * 1024,
              "a thread block's shared memory fits an SM (two single-consumer "
              "blocks at D=128)");

// What the kernel reads besides the tensor maps of Q, K and V.
struct Params {
  void* o;
  float* lse;
  int64_t o_batch_stride, o_seq_stride;
  int q_len;
  int kv_len;
  int q_heads;
  int group;  // q_heads / kv_heads
  // Query heads per thread block: 1, or heads that share a K/V head (the
  // group, or a power of two dividing it) packed into one tile of tile rows /
  // pack query rows x pack heads, so that each K/V tile is loaded once for
  // all of them. Tile row r is query row r / pack of head r % pack; where
  // pack does not divide the tile rows, the last tile rows % pack rows hold
  // nothing.
  int pack;
  int head_dim;
  float scale_log2;  // scale * log2(e)
  // The whole block: one span [0, kv_len), causal with shift kv_len - q_len
  // if `causal`. Or, with tiles != nullptr, the list.
  bool causal;
  const QueryTile* tiles;
  const KeySpan* spans;
  // Key splits (whole block only): thread blocks of grid z take keys [z *
  // key_chunk, (z + 1) * key_chunk) and write O and LSE o_split_stride and
  // lse_split_stride elements further per z. key_chunk 0: no split.
  int key_chunk;
  int64_t o_split_stride;
  int64_t lse_split_stride;
  // Head tiles of the whole block whose query tiles start together, longest
  // first (WholeBlockTileOf); 1: head by head. A work list's tiles start in
  // the list's order.
  int heads_together;
  // With fold.o set (whole block, no split), each row is folded into these
  // fp32 accumulators by log-sum-exp (stored, where fold.fresh) instead of
  // stored at o and lse.
  AccumulatorRows fold;
};

// Where a thread block is in its walk over keys: the span and the first key
// of the step.
struct KeyCursor {
  int span;
  int key;
};

// The spans of one query tile, and the walk over their steps of kKeys keys.
template <int kKeys>
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
      whole_.begin = p.key_chunk > 0 ? blockIdx.z * p.key_chunk : 0;
      whole_.end = p.key_chunk > 0 ? min(p.kv_len, whole_.begin + p.key_chunk)
                                   : p.kv_len;
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
    if (cursor.key + kKeys < VisibleEnd(span)) {
      return {cursor.span, cursor.key + kKeys};
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

// A whole block's thread block: its query tile, ranked from the last (0
// sees the most keys under causal masking), and its (batch, head) tile.
struct WholeBlockTile {
  int rank;
  int heads_tile;
};

// Thread blocks start in the order of their index (x fastest). In runs of
// p.heads_together head tiles, rank major: so with causal masking the last
// wave holds the shortest tiles of those heads rather than a mix of one
// head's long and short ones (Params::heads_together).
__device__ __forceinline__ WholeBlockTile WholeBlockTileOf(const Params& p) {
  const int64_t tiles = gridDim.x;
  const int64_t index = blockIdx.y * tiles + blockIdx.x;
  const int first =
      static_cast<int>(index / (tiles * p.heads_together)) * p.heads_together;
  const int heads = min(p.heads_together, static_cast<int>(gridDim.y) - first);
  const int64_t within = index - first * tiles;
  return {static_cast<int>(within / heads),
          first + static_cast<int>(within % heads)};
}

// Issues the copies of one step's K or V tile (all column blocks) into
// `tile`, announced to `full`.
template <int kHeadDim, int kKeys>
__device__ __forceinline__ void LoadKeyTile(const CUtensorMap& map, void* tile,
                                            uint64_t* full, int kv_h, int key,
                                            int b) {
  constexpr int kBlockBytes = kKeys * 64 * 2;
  ArriveExpectingBytes(full, ColumnBlocks(kHeadDim) * kBlockBytes);
  for (int c = 0; c < ColumnBlocks(kHeadDim); ++c) {
    CopyBox4d(static_cast<char*>(tile) + c * kBlockBytes, map, c * 64, kv_h,
              key, b, full);
  }
}

struct MaxOf {
  __device__ __forceinline__ float operator()(float a, float b) const {
    return fmaxf(a, b);
  }
};
struct SumOf {
  __device__ __forceinline__ float operator()(float a, float b) const {
    return a + b;
  }
};

// Folds values [0, kCount) of `v` pairwise, as a tree: log2(kCount) dependent
// operations instead of a chain of kCount - 1.
template <int kCount, typename Op>
__device__ __forceinline__ float TreeReduce(const float* v, Op op) {
  if constexpr (kCount == 1) {
    return v[0];
  } else {
    return op(TreeReduce<kCount / 2>(v, op),
              TreeReduce<kCount - kCount / 2>(v + kCount / 2, op));
  }
}

// Max or sum over this thread's elements of accumulator row r (0 or 1) of a
// kKeys-column S tile: elements 4j + 2r and 4j + 2r + 1 of each 8-column
// chunk j. The exponentials wait on the max, so at D=128 a tree keeps the
// chain of 43 dependent maxima off the softmax's path (one H200, dense 64K:
// 619 against 606-609 TFLOP/s), and so it does for three consumers at D=64
// (dense 16K 515 against 507, causal 473 against 456); for two at D=64 the
// chain was faster (446 against 438), so it stays there.
template <int kHeadDim, int kKeys, typename Op>
__device__ __forceinline__ float RowReduce(const float (&s)[kKeys / 2], int r) {
  float row[kKeys / 4];
#pragma unroll
  for (int j = 0; j < kKeys / 8; ++j) {
    row[2 * j] = s[4 * j + 2 * r];
    row[2 * j + 1] = s[4 * j + 2 * r + 1];
  }
  if constexpr (kHeadDim > 64 || kKeys == kWideBlockN) {
    return TreeReduce<kKeys / 4>(row, Op());
  } else {
    float folded = row[0];
#pragma unroll
    for (int i = 1; i < kKeys / 4; ++i) folded = Op()(folded, row[i]);
    return folded;
  }
}

// kFresh (with p.fold.o set): the accumulator rows hold nothing yet, and
// are stored without being read. A template argument, so that the folding
// kernel's code stays as it was without it.
template <typename T, int kHeadDim, int kConsumers, bool kFresh>
__global__ void __launch_bounds__((kConsumers + 1) * 128,
                                  BlocksPerSm(kHeadDim, kConsumers))
    HopperAttentionKernel(const __grid_constant__ Params p,
                          const __grid_constant__ CUtensorMap q_map,
                          const __grid_constant__ CUtensorMap k_map,
                          const __grid_constant__ CUtensorMap v_map) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using E = Element<T>;
  using L = Layout<kHeadDim, kConsumers>;
  constexpr int kBlockM = kConsumers * kConsumerRows;  // tile rows
  constexpr int kKeys = L::kKeys;
  constexpr int kScoreRegs = kKeys / 2;   // S accumulator per thread
  constexpr int kOutRegs = kHeadDim / 2;  // O accumulator per thread

  extern __shared__ __align__(16) unsigned char shared_bytes[];
  const uintptr_t start = reinterpret_cast<uintptr_t>(shared_bytes);
  const uintptr_t tiles = (start + 1023) & ~uintptr_t{1023};
  T* const q_tile = reinterpret_cast<T*>(tiles);
  // Stage s of K at k_tiles + s * kKvElements, of V likewise.
  T* const k_tiles = q_tile + L::kQElements;
  T* const v_tiles = k_tiles + L::kStages * L::kKvElements;
  uint64_t* const q_full = reinterpret_cast<uint64_t*>(
      tiles - start >= L::kBarrierBytes ? tiles - L::kBarrierBytes
                                        : tiles + L::kTileBytes);
  uint64_t* const k_full = q_full + 1;                   // [L::kStages]
  uint64_t* const v_full = k_full + L::kStages;          // [L::kStages]
  uint64_t* const k_released = v_full + L::kStages;      // [L::kStages]
  uint64_t* const v_released = k_released + L::kStages;  // [L::kStages]

  // Query rows [m0, m_end) of heads [h, h + p.pack).
  int m0;
  int m_end;
  int heads_tile = blockIdx.y;
  if (p.tiles != nullptr) {
    const QueryTile tile = p.tiles[blockIdx.x];
    m0 = tile.begin;
    m_end = min(tile.end, p.q_len);
  } else {
    // Later query tiles see more keys under causal masking: start them first.
    const WholeBlockTile whole = WholeBlockTileOf(p);
    const int tile_rows = kBlockM / p.pack;
    m0 = (gridDim.x - 1 - whole.rank) * tile_rows;
    m_end = min(m0 + tile_rows, p.q_len);
    heads_tile = whole.heads_tile;
  }
  const int head_tiles = p.q_heads / p.pack;
  const int b = heads_tile / head_tiles;
  const int h = heads_tile % head_tiles * p.pack;
  const int kv_h = h / p.group;
  const TileSpans<kKeys> spans(p, m_end);
  const KeyCursor first = spans.FirstStepFrom(0);
  const bool any_keys = first.span < spans.count();

  if (threadIdx.x == 0) {
    InitBarrier(q_full, 1);
    for (int s = 0; s < L::kStages; ++s) {
      InitBarrier(&k_full[s], 1);
      InitBarrier(&v_full[s], 1);
      InitBarrier(&k_released[s], kConsumers * 4);  // one per consumer warp
      InitBarrier(&v_released[s], kConsumers * 4);
    }
    FenceBarrierInit();
  }
  __syncthreads();

  if (threadIdx.x < 128) {
    // The producer warpgroup: one thread issues every copy, each step's K
    // (V) tile into the stage whose K (V) the consumers released L::kStages
    // steps before.
    LowerRegisters<ProducerRegisters(kConsumers, L::kBlocksPerSm)>();
    if (threadIdx.x >= 32 || !any_keys) return;
    // Where pack does not divide the tile's rows, the rows past the last
    // whole query row hold zeros instead of what shared memory held before:
    // finite scores, which are never stored and never make a warp rescale O.
    const int filled_rows = kBlockM / p.pack * p.pack;
    if (filled_rows < kBlockM) {
      constexpr int kChunksPerRow = 8;  // 16 bytes each
      const int chunks = (kBlockM - filled_rows) * kChunksPerRow;
      for (int i = threadIdx.x; i < ColumnBlocks(kHeadDim) * chunks; i += 32) {
        const int row = filled_rows + i % chunks / kChunksPerRow;
        reinterpret_cast<uint4*>(
            q_tile)[(i / chunks * kBlockM + row) * kChunksPerRow +
                    i % kChunksPerRow] = make_uint4(0, 0, 0, 0);
      }
      FenceSharedForAsyncProxy();
      __syncwarp();
    }
    if (threadIdx.x != 0) return;
    // Each column block of the tile takes kBlockM rows of shared memory;
    // the copy fills filled_rows of them.
    constexpr int kQBlockBytes = kBlockM * 64 * 2;
    const int q_copy_bytes = filled_rows * 64 * 2;
    ArriveExpectingBytes(q_full, ColumnBlocks(kHeadDim) * q_copy_bytes);
    for (int c = 0; c < ColumnBlocks(kHeadDim); ++c) {
      CopyBox4d(reinterpret_cast<char*>(q_tile) + c * kQBlockBytes, q_map,
                c * 64, h, m0, b, q_full);
    }
    int step = 0;
    for (KeyCursor cursor = first; cursor.span < spans.count();
         cursor = spans.Next(cursor), ++step) {
      const int stage = step % L::kStages;
      const uint32_t released_parity = ((step / L::kStages) & 1) ^ 1;
      if (step >= L::kStages) WaitBarrier(&k_released[stage], released_parity);
      LoadKeyTile<kHeadDim, kKeys>(k_map, k_tiles + stage * L::kKvElements,
                                   &k_full[stage], kv_h, cursor.key, b);
      if (step >= L::kStages) WaitBarrier(&v_released[stage], released_parity);
      LoadKeyTile<kHeadDim, kKeys>(v_map, v_tiles + stage * L::kKvElements,
                                   &v_full[stage], kv_h, cursor.key, b);
    }
    return;
  }
  RaiseRegisters<ConsumerRegisters(kConsumers)>();

  const int consumer = threadIdx.x / 128 - 1;
  const int warp = threadIdx.x % 128 / 32;
  const int lane = threadIdx.x % 32;
  // This thread's two tile rows, consumer * 64 + warp * 16 + lane / 4 and 8
  // further (accumulator elements e < 2 and e >= 2 of each 8-column chunk):
  // their query rows and heads.
  const int tile_row0 = consumer * 64 + warp * 16 + lane / 4;
  // (A tile row past the last whole query row maps to row m0 + tile rows /
  // pack, past m_end: computed, never stored.)
  const int rows[2] = {m0 + tile_row0 / p.pack, m0 + (tile_row0 + 8) / p.pack};
  const int heads[2] = {h + tile_row0 % p.pack, h + (tile_row0 + 8) % p.pack};
  const int warp_row0 = m0 + (consumer * 64 + warp * 16) / p.pack;

  float o_acc[kOutRegs];
#pragma unroll
  for (int i = 0; i < kOutRegs; ++i) o_acc[i] = 0.0f;
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.0f, 0.0f};
  // P of the previous step, as A fragments of O += P V.
  uint32_t pa[kKeys / 16][4];
  // Issues O += P V against the V tile of `stage`.
  const auto add_values = [&](int stage) {
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      MmaRegisters<T, kHeadDim>(
          o_acc, pa[kk],
          SwizzledDescriptor(v_tiles + stage * L::kKvElements + kk * 16 * 64,
                             kKeys * 64 * 2));
    }
  };

  // Issues S = Q K^T of the keys in `stage` for this warpgroup's 64 rows.
  const auto add_scores = [&](float(&s)[kScoreRegs], int stage) {
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      const int column_block = kk / 4;
      const int column = (kk % 4) * 16;
      const uint64_t a = SwizzledDescriptor(
          q_tile + column_block * kBlockM * 64 + consumer * 64 * 64 + column,
          0);
      const uint64_t bk = SwizzledDescriptor(
          k_tiles + stage * L::kKvElements + column_block * kKeys * 64 + column,
          0);
      MmaShared<T, kKeys>(s, a, bk, kk > 0 ? 1 : 0);
    }
  };
  // Hides the keys of `s` past the span and, under its causal mask, above the
  // diagonal; then the online softmax: new running maxima, P = 2^(S - max)
  // in place of S, the factors that rescale O in `rescale`.
  const auto take_softmax = [&](float(&s)[kScoreRegs], KeyCursor cursor,
                                float(&rescale)[2]) {
    const KeySpan span = spans.Span(cursor.span);
    const int span_end = min(span.end, p.kv_len);
    const int n0 = cursor.key;
    const bool past_end = n0 + kKeys > span_end;
    const bool crosses_diagonal =
        span.causal && n0 + kKeys - 1 > warp_row0 + span.shift;
    if (past_end || crosses_diagonal) {
#pragma unroll
      for (int i = 0; i < kScoreRegs; ++i) {
        const int key = n0 + (i / 4) * 8 + (lane % 4) * 2 + (i % 2);
        const int row = rows[i % 4 >= 2 ? 1 : 0];
        if (key >= span_end || (span.causal && key > row + span.shift)) {
          s[i] = -INFINITY;
        }
      }
    }
    float tile_max[2];
#pragma unroll
    for (int r = 0; r < 2; ++r)
      tile_max[r] = RowReduce<kHeadDim, kKeys, MaxOf>(s, r);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      tile_max[r] =
          fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      tile_max[r] =
          fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
    }
    float offset[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float tile = tile_max[r] * p.scale_log2;
      const float new_max =
          tile > row_max[r] + kStaleMaxSlack ? tile : row_max[r];
      offset[r] = new_max == -INFINITY ? 0.0f : new_max;
      rescale[r] = Exp2(row_max[r] - offset[r]);
      row_max[r] = new_max;
    }
#pragma unroll
    for (int i = 0; i < kScoreRegs; ++i) {
      s[i] = Exp2(fmaf(s[i], p.scale_log2, -offset[i % 4 >= 2 ? 1 : 0]));
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      row_sum[r] =
          row_sum[r] * rescale[r] + RowReduce<kHeadDim, kKeys, SumOf>(s, r);
    }
  };
  // P as the A fragments of O += P V (the S accumulator layout is the A
  // fragment layout).
  const auto keep_probabilities = [&](const float(&s)[kScoreRegs]) {
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      pa[kk][0] = E::Pack(s[8 * kk + 0], s[8 * kk + 1]);
      pa[kk][1] = E::Pack(s[8 * kk + 2], s[8 * kk + 3]);
      pa[kk][2] = E::Pack(s[8 * kk + 4], s[8 * kk + 5]);
      pa[kk][3] = E::Pack(s[8 * kk + 6], s[8 * kk + 7]);
    }
  };

  // Tells the producer that this warp is done with a K or V tile.
  const auto release = [&](uint64_t* barrier) {
    __syncwarp();
    if (lane == 0) Arrive(barrier);
  };
  // Scales O by `rescale` once the P V in flight has landed, and takes the
  // probabilities of `s` for the next one.
  const auto fold_in = [&](const float(&s)[kScoreRegs],
                           const float(&rescale)[2]) {
    WarpgroupWait<0>();
    PinRegisters(o_acc);
    if (__any_sync(0xffffffffu, rescale[0] != 1.0f || rescale[1] != 1.0f)) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
#pragma unroll
        for (int j = 0; j < kHeadDim / 8; ++j) {
          o_acc[4 * j + 2 * r] *= rescale[r];
          o_acc[4 * j + 2 * r + 1] *= rescale[r];
        }
      }
    }
    keep_probabilities(s);
  };

  // The consumers take turns at the tensor cores: each issues its products
  // (S of this step, P V of the one before) while the others run their
  // softmax. Named barrier 1 + c opens consumer c's turn, which consumer c - 1
  // hands over (the last one to consumer 0; of two, each to the other);
  // consumer 0 goes first. A single consumer has every turn.
  const int own_turn = 1 + consumer;
  const int next_turn =
      kConsumers == 2 ? 2 - consumer : 1 + (consumer + 1) % kConsumers;
  const auto wait_for_turn = [&] {
    if constexpr (kConsumers > 1) SyncNamedBarrier(own_turn, 256);
  };
  const auto hand_over_turn = [&] {
    if constexpr (kConsumers > 1) ArriveNamedBarrier(next_turn, 256);
  };
  if (any_keys) {
    WaitBarrier(q_full, 0);
    if (consumer == kConsumers - 1) hand_over_turn();
  }
  // Each step issues S = Q K^T of its keys and, as a second group, O += P V
  // of the step before, then runs the softmax of S while that P V is still
  // on the tensor cores; O is rescaled at the start of the next step, once
  // it has landed. (Rescaling in the same step lets the compiler hoist the
  // wait above the softmax, and the first step is peeled so that no wgmma
  // sits in a branch: either one serializes the products.)
  int step = 0;
  int last_stage = 0;
  float s[kScoreRegs];
  float rescale[2];
  if (any_keys) {
    WaitBarrier(&k_full[0], 0);
    wait_for_turn();
    WarpgroupFence();
    add_scores(s, 0);
    WarpgroupCommit();
    hand_over_turn();
    WarpgroupWait<0>();
    PinRegisters(s);
    release(&k_released[0]);
    take_softmax(s, first, rescale);
    step = 1;
  }
  for (KeyCursor cursor = any_keys ? spans.Next(first) : first;
       cursor.span < spans.count(); cursor = spans.Next(cursor), ++step) {
    const int stage = step % L::kStages;
    WaitBarrier(&k_full[stage], (step / L::kStages) & 1);
    WaitBarrier(&v_full[last_stage], ((step - 1) / L::kStages) & 1);
    fold_in(s, rescale);
    if (step > 1) release(&v_released[(step - 2) % L::kStages]);
    wait_for_turn();
    PinRegisters(o_acc);
    WarpgroupFence();
    add_scores(s, stage);
    WarpgroupCommit();
    add_values(last_stage);
    WarpgroupCommit();
    hand_over_turn();
    WarpgroupWait<1>();
    PinRegisters(s);
    release(&k_released[stage]);
    take_softmax(s, cursor, rescale);
    last_stage = stage;
  }
  // The accumulator row this thread's row r folds into (with p.fold.o set).
  const auto acc_row = [&](int r) {
    return p.fold.o + b * p.fold.o_batch_stride +
           static_cast<int64_t>(rows[r]) * p.fold.o_seq_stride +
           static_cast<int64_t>(heads[r]) * p.head_dim;
  };
  if (p.fold.o != nullptr && !kFresh) {
    // Ask L2 for the accumulator rows this thread folds into while the last
    // P V runs: the fold reads them right after, and an SM that holds one
    // thread block sits idle while it waits (measured on one H200, a 32K x 32K
    // tile's fold cost 0.19-0.37 ms over the kernel alone with this and
    // 0.25-0.75 ms without; the merge kernel after it, 0.45-0.6 ms).
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if (rows[r] < m_end && (lane % 4) * 32 < p.head_dim) {
        const float* acc = acc_row(r) + (lane % 4) * 32;
        asm volatile("prefetch.global.L2 [%0];" ::"l"(acc));
      }
    }
  }
  if (step > 0) {
    // O += P V of the last step, in a last turn (the last consumer opens no
    // further one: nobody would take it).
    WaitBarrier(&v_full[last_stage], ((step - 1) / L::kStages) & 1);
    fold_in(s, rescale);
    wait_for_turn();
    PinRegisters(o_acc);
    WarpgroupFence();
    add_values(last_stage);
    WarpgroupCommit();
    if (consumer < kConsumers - 1) hand_over_turn();
    WarpgroupWait<0>();
    PinRegisters(o_acc);
  }

  // Normalize and store (or fold into the accumulators). A row that saw no key
  // has sum 0: O = 0, LSE = -inf (and a fold leaves its row as it was, or
  // stores that where the rows are fresh).
  T* o = static_cast<T*>(p.o) + blockIdx.z * p.o_split_stride +
         b * p.o_batch_stride;
  float* const lse =
      p.lse == nullptr ? nullptr : p.lse + blockIdx.z * p.lse_split_stride;
  const bool fold = p.fold.o != nullptr;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = row_sum[r];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const int row = rows[r];
    const bool live = row < m_end;
    float kept_lse = -INFINITY;
    float* acc_lse = nullptr;
    if (fold) {
      acc_lse = p.fold.lse + b * p.fold.lse_batch_stride +
                static_cast<int64_t>(row) * p.fold.lse_seq_stride + heads[r];
      // The four lanes of a row all read its accumulated LSE before the first
      // of them may write the new one. Fresh rows hold nothing to read.
      if (live && !kFresh) kept_lse = *acc_lse;
      __syncwarp();
    }
    if (!live) continue;
    const float inverse = sum > 0.0f ? 1.0f / sum : 0.0f;
    if (fold) {
      // A row that saw no key changes nothing, or stores the empty result.
      if (sum == 0.0f && !kFresh) continue;
      const device::LseFold weights =
          kFresh && sum == 0.0f
              ? device::LseFold{0.0f, 0.0f, -INFINITY}
              : device::FoldLse(kept_lse, (row_max[r] + __log2f(sum)) * kLn2);
      const float keep_weight = weights.keep_weight;
      const float add_weight = weights.add_weight * inverse;
      float* const acc = acc_row(r);
#pragma unroll
      for (int j = 0; j < kHeadDim / 8; ++j) {
        const int d = j * 8 + (lane % 4) * 2;
        if (d < p.head_dim) {
          float2* const pair = reinterpret_cast<float2*>(acc + d);
          float2 value = kFresh ? make_float2(0.0f, 0.0f) : *pair;
          value.x = value.x * keep_weight + o_acc[4 * j + 2 * r] * add_weight;
          value.y =
              value.y * keep_weight + o_acc[4 * j + 2 * r + 1] * add_weight;
          *pair = value;
        }
      }
      if (lane % 4 == 0) *acc_lse = weights.merged;
      continue;
    }
    T* out = o + static_cast<int64_t>(row) * p.o_seq_stride +
             static_cast<int64_t>(heads[r]) * p.head_dim;
#pragma unroll
    for (int j = 0; j < kHeadDim / 8; ++j) {
      const int d = j * 8 + (lane % 4) * 2;
      if (d < p.head_dim) {
        *reinterpret_cast<uint32_t*>(out + d) = E::Pack(
            o_acc[4 * j + 2 * r] * inverse, o_acc[4 * j + 2 * r + 1] * inverse);
      }
    }
    if (lse != nullptr && lane % 4 == 0) {
      lse[(static_cast<int64_t>(b) * p.q_len + row) * p.q_heads + heads[r]] =
          sum > 0.0f ? (row_max[r] + __log2f(sum)) * kLn2 : -INFINITY;
    }
  }
#else
  __trap();  // built for sm_90a only; HopperAttentionTakes keeps others away
#endif
}

__device__ __forceinline__ float ToFloat(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
__device__ __forceinline__ float ToFloat(__half x) { return __half2float(x); }

// Folds the key splits' partial results into the block's O and LSE, one warp
// per (batch, row, head): weights exp(lse_z - max), O = sum w_z O_z / sum w_z.
//   part_o:   [splits][batch * q_len * heads][head_dim] contiguous
//   part_lse: [splits][batch * q_len * heads]
template <typename T>
__global__ void MergeKeySplitsKernel(const T* part_o, const float* part_lse,
                                     int splits, int64_t rows, int q_len,
                                     int heads, int head_dim, T* o,
                                     int64_t o_batch_stride,
                                     int64_t o_seq_stride, float* lse) {
  const int64_t r =
      static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (r >= rows) return;
  const int lane = threadIdx.x % 32;
  float top = -INFINITY;
  for (int z = 0; z < splits; ++z) top = fmaxf(top, part_lse[z * rows + r]);
  constexpr int kPerLane = 128 / 32;
  float acc[kPerLane] = {};
  float total = 0.0f;
  if (top != -INFINITY) {
    for (int z = 0; z < splits; ++z) {
      const float weight = __expf(part_lse[z * rows + r] - top);
      total += weight;
      const T* row = part_o + (z * rows + r) * head_dim;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        const int d = lane + 32 * i;
        if (d < head_dim) acc[i] += weight * ToFloat(row[d]);
      }
    }
  }
  const int h = static_cast<int>(r % heads);
  const int64_t t = r / heads % q_len;
  const int64_t b = r / heads / q_len;
  T* out = o + b * o_batch_stride + t * o_seq_stride +
           static_cast<int64_t>(h) * head_dim;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int d = lane + 32 * i;
    if (d < head_dim) {
      out[d] = Element<T>::From(total > 0.0f ? acc[i] / total : 0.0f);
    }
  }
  if (lse != nullptr && lane == 0) {
    lse[r] = total > 0.0f ? top + __logf(total) : -INFINITY;
  }
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

// The driver's cuTensorMapEncodeTiled, looked up once; null where the driver
// lacks it.
PFN_cuTensorMapEncodeTiled_v12000 EncodeTiled() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* function = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &function,
                                         12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      return PFN_cuTensorMapEncodeTiled_v12000{nullptr};
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(function);
  }();
  return encode;
}

// Encodes `map` for one [batch, seq, heads, head_dim] operand: a box is
// `rows` rows of `box_heads` heads of 64 columns, row-major, which lands in
// shared memory as rows * box_heads rows of 64 columns, 128-byte swizzled;
// columns past head_dim and rows past seq read as zero. A zero map for an
// operand with no rows (the kernel never reads it). Each box row is 128 bytes
// and the L2 fetches just that: with 256-byte promotion (the other half of a
// D=128 row, which the next box reads) one query row against 1M keys took
// 1.03-1.05 ms on one H200, with 128-byte promotion 0.95-0.99 ms, level with
// cuDNN.
cudaError_t EncodeOperand(CUtensorMap& map, DeviceDType dtype,
                          const DeviceTensor<const void>& tensor, int64_t batch,
                          int64_t seq, int64_t heads, int64_t head_dim,
                          int box_heads, int rows) {
  map = CUtensorMap{};
  if (seq == 0) return cudaSuccess;
  const PFN_cuTensorMapEncodeTiled_v12000 encode = EncodeTiled();
  if (encode == nullptr) return cudaErrorNotSupported;
  const auto bytes = [](int64_t elements) {
    return static_cast<cuuint64_t>(elements) * 2;
  };
  const cuuint64_t dims[4] = {
      static_cast<cuuint64_t>(head_dim), static_cast<cuuint64_t>(heads),
      static_cast<cuuint64_t>(seq), static_cast<cuuint64_t>(batch)};
  // The batch stride of a batch of one is never used; any multiple of 16
  // bytes serves.
  const cuuint64_t strides[3] = {
      bytes(head_dim), bytes(tensor.seq_stride),
      batch > 1 ? bytes(tensor.batch_stride) : bytes(tensor.seq_stride * seq)};
  const cuuint32_t box[4] = {64, static_cast<cuuint32_t>(box_heads),
                             static_cast<cuuint32_t>(rows), 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  const CUresult result = encode(
      &map,
      dtype == DeviceDType::kBFloat16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                      : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
      4, const_cast<void*>(tensor.data), dims, strides, box, element_strides,
      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return result == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

template <typename T, int kHeadDim, int kConsumers>
cudaError_t Launch(const Params& params, const CUtensorMap& q_map,
                   const CUtensorMap& k_map, const CUtensorMap& v_map,
                   dim3 grid, cudaStream_t stream) {
  constexpr int kBytes = Layout<kHeadDim, kConsumers>::kSharedBytes;
  const auto kernel =
      params.fold.o != nullptr && params.fold.fresh
          ? HopperAttentionKernel<T, kHeadDim, kConsumers, true>
          : HopperAttentionKernel<T, kHeadDim, kConsumers, false>;
  const cudaError_t error = cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes);
  if (error != cudaSuccess) return error;
  kernel<<<grid, (kConsumers + 1) * 128, kBytes, stream>>>(params, q_map, k_map,
                                                           v_map);
  return cudaGetLastError();
}

template <typename T, int kConsumers>
cudaError_t LaunchForHeadDim(const Params& params, const CUtensorMap& q_map,
                             const CUtensorMap& k_map, const CUtensorMap& v_map,
                             dim3 grid, cudaStream_t stream) {
  switch (CompiledHeadDim(params.head_dim)) {
    case 64:
      return Launch<T, 64, kConsumers>(params, q_map, k_map, v_map, grid,
                                       stream);
    case 80:
      return Launch<T, 80, kConsumers>(params, q_map, k_map, v_map, grid,
                                       stream);
    case 96:
      return Launch<T, 96, kConsumers>(params, q_map, k_map, v_map, grid,
                                       stream);
    default:
      return Launch<T, 128, kConsumers>(params, q_map, k_map, v_map, grid,
                                        stream);
  }
}

template <typename T>
cudaError_t LaunchForConsumers(int consumers, const Params& params,
                               const CUtensorMap& q_map,
                               const CUtensorMap& k_map,
                               const CUtensorMap& v_map, dim3 grid,
                               cudaStream_t stream) {
  switch (consumers) {
    case 1:
      return LaunchForHeadDim<T, 1>(params, q_map, k_map, v_map, grid, stream);
    case kWideConsumers:
      return Launch<T, 64, kWideConsumers>(params, q_map, k_map, v_map, grid,
                                           stream);
    default:
      return LaunchForHeadDim<T, kListConsumers>(params, q_map, k_map, v_map,
                                                 grid, stream);
  }
}

// How a launch cuts the query rows into thread blocks.
struct TileShape {
  // Query heads per tile (Params::pack), all reading one K/V head: for a
  // whole block, the group of heads sharing a K/V head where the packed rows
  // (q_len * group) are at most kMostPackedRows and the group at most one
  // warpgroup's rows (a group of 7 fills 126 of a tile's 128 rows: 18 query
  // rows of 7 heads); otherwise the most heads of the group, a power of two
  // that divides it, whose rows fill at most one tile of two consumers (a
  // query of 16 rows of 32 heads on one K/V head, MQA, reads K/V 4 times in
  // 8-head tiles instead of 32 times in tiles of one head). 1 for work lists
  // (their tiles are rows of one head).
  int pack;
  // Consumer warpgroups per thread block: one where the whole query fits one
  // warpgroup's rows, packed or not; two for work lists and up to
  // kMostPackedRows rows (packed heads among them; few-row blocks were
  // measured on two); otherwise WholeBlockConsumers (three at head dims up to
  // 64, so never packed).
  int consumers;
  int64_t rows;   // query rows per tile, of each of its `pack` heads
  int64_t tiles;  // tiles along the query rows (a work list's own count)
};

TileShape TileShapeFor(const DeviceAttentionArgs& args) {
  const bool listed = args.work.tile_count > 0;
  const int64_t group = args.q_heads / args.kv_heads;
  TileShape shape;
  shape.pack = 1;
  if (!listed && group <= kConsumerRows &&
      args.q_len * group <= kMostPackedRows) {
    shape.pack = static_cast<int>(group);
  } else if (!listed) {
    while (shape.pack * 2 <= kConsumerRows && group % (shape.pack * 2) == 0 &&
           args.q_len * shape.pack * 2 <= kListConsumers * kConsumerRows) {
      shape.pack *= 2;
    }
  }
  const int64_t packed_rows = args.q_len * shape.pack;
  if (listed || packed_rows <= kMostPackedRows) {
    shape.consumers =
        !listed && packed_rows <= kConsumerRows ? 1 : kListConsumers;
  } else {
    shape.consumers = WholeBlockConsumers(CompiledHeadDim(args.head_dim));
  }
  shape.rows = shape.consumers * kConsumerRows / shape.pack;
  shape.tiles = listed ? args.work.tile_count
                       : (args.q_len + shape.rows - 1) / shape.rows;
  return shape;
}

// An attribute of the current device; 0 where it cannot be read.
int CurrentDeviceAttribute(cudaDeviceAttr attribute) {
  int device = 0;
  int value = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&value, attribute, device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return value;
}

int CurrentSmCount() {
  return CurrentDeviceAttribute(cudaDevAttrMultiProcessorCount);
}

// Params::heads_together for a whole causal block: as many head tiles as
// their K/V (16-bit K and V rows) fills half the L2 cache, at most
// kMostHeadsTogether. One H200, 32 heads, D=128, causal TFLOP/s against head
// by head: 4K (eight together) 515-523 against 485-488, 8K (six) 622-626
// against 607-610, level at 16K. Eight together at 64K (256 MiB of K/V) lost
// 3% causal and 6% dense to L2 misses; so large blocks, and dense ones, whose
// tiles are all alike, go head by head.
int HeadsTogether(const DeviceAttentionArgs& args, const TileShape& shape) {
  if (!args.causal) return 1;
  const int64_t head_tiles_per_kv_head =
      std::max<int64_t>(1, args.q_heads / args.kv_heads / shape.pack);
  const int64_t kv_bytes_per_head_tile = std::max<int64_t>(
      1, 2 * args.kv_len * args.head_dim * 2 / head_tiles_per_kv_head);
  const int64_t fit = CurrentDeviceAttribute(cudaDevAttrL2CacheSize) / 2 /
                      kv_bytes_per_head_tile;
  return static_cast<int>(std::clamp<int64_t>(fit, 1, kMostHeadsTogether));
}

// The kernel's launch for `args`, writing O and LSE where the args say; the
// caller may redirect them (key splits).
struct Prepared {
  int consumers;
  Params params;
  CUtensorMap q_map;
  CUtensorMap k_map;
  CUtensorMap v_map;
  dim3 grid;
};

cudaError_t Prepare(const DeviceAttentionArgs& args, Prepared& prepared) {
  if (FindAttentionArgsProblem(args) != nullptr) return cudaErrorInvalidValue;
  if (!HopperAttentionTakes(args)) return cudaErrorInvalidValue;
  const bool listed = args.work.tile_count > 0;
  const TileShape shape = TileShapeFor(args);
  const int keys = KeysPerStep(CompiledHeadDim(args.head_dim), shape.consumers);
  for (const auto& [map, tensor, seq, heads, box_heads, rows] :
       {std::tuple{&prepared.q_map, &args.q, args.q_len, args.q_heads,
                   shape.pack, static_cast<int>(shape.rows)},
        std::tuple{&prepared.k_map, &args.k, args.kv_len, args.kv_heads, 1,
                   keys},
        std::tuple{&prepared.v_map, &args.v, args.kv_len, args.kv_heads, 1,
                   keys}}) {
    const cudaError_t error =
        EncodeOperand(*map, args.dtype, *tensor, args.batch, seq, heads,
                      args.head_dim, box_heads, rows);
    if (error != cudaSuccess) return error;
  }
  prepared.consumers = shape.consumers;
  Params& params = prepared.params;
  params.o = args.o.data;
  params.lse = args.lse;
  params.o_batch_stride = args.o.batch_stride;
  params.o_seq_stride = args.o.seq_stride;
  params.q_len = static_cast<int>(args.q_len);
  params.kv_len = static_cast<int>(args.kv_len);
  params.q_heads = static_cast<int>(args.q_heads);
  params.group = static_cast<int>(args.q_heads / args.kv_heads);
  params.pack = shape.pack;
  params.head_dim = static_cast<int>(args.head_dim);
  params.scale_log2 = args.scale * kLog2e;
  params.causal = args.causal;
  params.tiles = listed ? args.work.tiles : nullptr;
  params.spans = listed ? args.work.spans : nullptr;
  params.key_chunk = 0;
  params.o_split_stride = 0;
  params.lse_split_stride = 0;
  params.fold = AccumulatorRows{};
  params.heads_together = HeadsTogether(args, shape);
  prepared.grid =
      dim3(static_cast<unsigned>(shape.tiles),
           static_cast<unsigned>(args.batch * args.q_heads / shape.pack), 1);
  return cudaSuccess;
}

cudaError_t LaunchPrepared(const DeviceAttentionArgs& args,
                           const Prepared& prepared, cudaStream_t stream) {
  return args.dtype == DeviceDType::kBFloat16
             ? LaunchForConsumers<__nv_bfloat16>(
                   prepared.consumers, prepared.params, prepared.q_map,
                   prepared.k_map, prepared.v_map, prepared.grid, stream)
             : LaunchForConsumers<__half>(
                   prepared.consumers, prepared.params, prepared.q_map,
                   prepared.k_map, prepared.v_map, prepared.grid, stream);
}

// Rows of the key splits' partial results: (batch, query row, head).
int64_t SplitRows(const DeviceAttentionArgs& args) {
  return args.batch * args.q_len * args.q_heads;
}

// The launch of well-formed `args` (the block or its work list, unsplit),
// folding each row into `fold` where fold.o is set.
cudaError_t LaunchUnsplit(const DeviceAttentionArgs& args,
                          const AccumulatorRows& fold, cudaStream_t stream) {
  if (args.batch == 0 || args.q_len == 0) return cudaSuccess;
  Prepared prepared;
  const cudaError_t error = Prepare(args, prepared);
  if (error != cudaSuccess) return error;
  prepared.params.fold = fold;
  return LaunchPrepared(args, prepared, stream);
}

}  // namespace

bool HopperAttentionAvailable(int64_t head_dim) {
  return head_dim > 0 && head_dim % 8 == 0 && head_dim <= 128 && OnHopper() &&
         EncodeTiled() != nullptr;
}

bool HopperCompiledForHeadDim(int64_t head_dim) {
  return head_dim > 0 && head_dim <= 128 &&
         CompiledHeadDim(head_dim) == head_dim;
}

bool HopperAttentionTakes(const DeviceAttentionArgs& args) {
  const bool strides_aligned =
      args.q.batch_stride % 8 == 0 && args.q.seq_stride % 8 == 0 &&
      args.k.batch_stride % 8 == 0 && args.k.seq_stride % 8 == 0 &&
      args.v.batch_stride % 8 == 0 && args.v.seq_stride % 8 == 0 &&
      args.o.batch_stride % 8 == 0 && args.o.seq_stride % 8 == 0;
  return strides_aligned && Aligned16(args.q.data) && Aligned16(args.k.data) &&
         Aligned16(args.v.data) && Aligned16(args.o.data) &&
         args.batch * args.q_heads <= kMaxBatchHeads &&
         args.q_len < kMaxLength && args.kv_len < kMaxLength &&
         args.work.tile_count <= kMaxLength &&
         HopperAttentionAvailable(args.head_dim);
}

cudaError_t LaunchHopperAttention(const DeviceAttentionArgs& args,
                                  cudaStream_t stream) {
  if (FindAttentionArgsProblem(args) != nullptr) return cudaErrorInvalidValue;
  return LaunchUnsplit(args, AccumulatorRows{}, stream);
}

bool HopperAttentionFoldsInto(const DeviceAttentionArgs& args,
                              const AccumulatorRows& into) {
  const auto even = [](int64_t stride) { return stride % 2 == 0; };
  return HopperAttentionTakes(args) && args.work.tile_count == 0 &&
         into.o != nullptr && into.lse != nullptr &&
         reinterpret_cast<uintptr_t>(into.o) % sizeof(float2) == 0 &&
         even(into.o_batch_stride) && even(into.o_seq_stride) &&
         into.o_batch_stride >= 0 && into.lse_batch_stride >= 0 &&
         into.o_seq_stride >= args.q_heads * args.head_dim &&
         into.lse_seq_stride >= args.q_heads;
}

cudaError_t LaunchHopperAttentionInto(const DeviceAttentionArgs& args,
                                      const AccumulatorRows& into,
                                      cudaStream_t stream) {
  if (FindAttentionArgsProblem(args) != nullptr ||
      !HopperAttentionFoldsInto(args, into)) {
    return cudaErrorInvalidValue;
  }
  return LaunchUnsplit(args, into, stream);
}

int HopperKeySplits(const DeviceAttentionArgs& args) {
  const int sms = CurrentSmCount();
  if (sms == 0) return 1;
  if (args.work.tile_count > 0 || args.kv_heads <= 0) return 1;
  const TileShape shape = TileShapeFor(args);
  const int64_t blocks = shape.tiles * args.batch * args.q_heads / shape.pack;
  if (blocks == 0 || 2 * blocks > sms) return 1;
  // An SM holds one thread block at a time (two of a single consumer at
  // D=128), so the time is that of the waves: take the count whose waves are
  // fullest, the fewest splits among equals. A block of one or a few thread
  // blocks (one query row of a K/V head or two: MQA) may split as far as one
  // thread block per slot.
  const int64_t slots =
      static_cast<int64_t>(sms) *
      BlocksPerSm(CompiledHeadDim(args.head_dim), shape.consumers);
  const int64_t cap = std::min<int64_t>(
      kMostKeySplits, std::max<int64_t>(kWaveKeySplits, slots / blocks));
  const int64_t most = std::max<int64_t>(
      1, std::min<int64_t>(args.kv_len / kMinKeysPerSplit, cap));
  int best = 1;
  double best_fill = 0.0;
  for (int splits = 1; splits <= most; ++splits) {
    const int64_t launched = blocks * splits;
    const int64_t waves = (launched + slots - 1) / slots;
    const double fill = static_cast<double>(launched) / (waves * slots);
    if (fill > best_fill + 1e-9) {
      best = splits;
      best_fill = fill;
    }
  }
  return best;
}

int64_t HopperWaveRows(int64_t batch, int64_t q_heads, int64_t head_dim) {
  const int sms = CurrentSmCount();
  if (sms == 0 || batch * q_heads <= 0 || !HopperAttentionAvailable(head_dim)) {
    return 0;
  }
  // One thread block per (batch, head) for each block_rows query rows.
  const int consumers = WholeBlockConsumers(CompiledHeadDim(head_dim));
  const int64_t block_rows = consumers * kConsumerRows;
  const int64_t slots = static_cast<int64_t>(sms) *
                        BlocksPerSm(CompiledHeadDim(head_dim), consumers);
  return slots / std::gcd(slots, batch * q_heads) * block_rows;
}

size_t HopperSplitWorkspaceBytes(const DeviceAttentionArgs& args, int splits) {
  return static_cast<size_t>(splits) * SplitRows(args) *
         (args.head_dim * 2 + sizeof(float));
}

cudaError_t LaunchHopperAttentionSplit(const DeviceAttentionArgs& args,
                                       int splits, void* workspace,
                                       size_t workspace_bytes,
                                       cudaStream_t stream) {
  if (FindAttentionArgsProblem(args) != nullptr) return cudaErrorInvalidValue;
  if (splits < 1 || splits > kMostKeySplits || args.work.tile_count > 0) {
    return cudaErrorInvalidValue;
  }
  if (args.batch == 0 || args.q_len == 0) return cudaSuccess;
  if (splits == 1) return LaunchHopperAttention(args, stream);
  if (workspace == nullptr ||
      workspace_bytes < HopperSplitWorkspaceBytes(args, splits)) {
    return cudaErrorInvalidValue;
  }
  Prepared prepared;
  cudaError_t error = Prepare(args, prepared);
  if (error != cudaSuccess) return error;
  const int64_t rows = SplitRows(args);
  char* const part_o = static_cast<char*>(workspace);
  float* const part_lse =
      reinterpret_cast<float*>(part_o + splits * rows * args.head_dim * 2);
  Params& params = prepared.params;
  params.o = part_o;
  params.o_batch_stride = args.q_len * args.q_heads * args.head_dim;
  params.o_seq_stride = args.q_heads * args.head_dim;
  params.lse = part_lse;
  params.o_split_stride = rows * args.head_dim;
  params.lse_split_stride = rows;
  // Whole key steps per split.
  const int64_t chunk = (args.kv_len + splits - 1) / splits;
  const int64_t keys =
      KeysPerStep(CompiledHeadDim(args.head_dim), prepared.consumers);
  params.key_chunk = static_cast<int>((chunk + keys - 1) / keys * keys);
  prepared.grid.z = static_cast<unsigned>((args.kv_len + params.key_chunk - 1) /
                                          params.key_chunk);
  error = LaunchPrepared(args, prepared, stream);
  if (error != cudaSuccess) return error;
  constexpr int kWarpsPerBlock = 8;
  const unsigned blocks =
      static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
  const int used_splits = static_cast<int>(prepared.grid.z);
  if (args.dtype == DeviceDType::kBFloat16) {
    MergeKeySplitsKernel<__nv_bfloat16>
        <<<blocks, kWarpsPerBlock * 32, 0, stream>>>(
            reinterpret_cast<const __nv_bfloat16*>(part_o), part_lse,
            used_splits, rows, static_cast<int>(args.q_len),
            static_cast<int>(args.q_heads), static_cast<int>(args.head_dim),
            static_cast<__nv_bfloat16*>(args.o.data), args.o.batch_stride,
            args.o.seq_stride, args.lse);
  } else {
    MergeKeySplitsKernel<__half><<<blocks, kWarpsPerBlock * 32, 0, stream>>>(
        reinterpret_cast<const __half*>(part_o), part_lse, used_splits, rows,
        static_cast<int>(args.q_len), static_cast<int>(args.q_heads),
        static_cast<int>(args.head_dim), static_cast<__half*>(args.o.data),
        args.o.batch_stride, args.o.seq_stride, args.lse);
  }
  return cudaGetLastError();
}

}  // namespace ringattn
