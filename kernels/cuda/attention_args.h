#ifndef RINGATTN_KERNELS_CUDA_ATTENTION_ARGS_H_
#define RINGATTN_KERNELS_CUDA_ATTENTION_ARGS_H_

// What every GPU attention path takes: one dense block of attention (a query
// block against a key/value block) described by device pointers, shapes and
// strides. Plain values with no ownership; safe to copy and to share between
// threads. Kept free of abseil so that .cu files can include it.

#include <cstdint>

#include "kernels/cuda/attention_work_list.h"

namespace ringattn {

// The 16-bit element types the GPU attention paths read and write.
enum class DeviceDType { kFloat16, kBFloat16 };

// "fp16" or "bf16".
inline const char* DeviceDTypeName(DeviceDType dtype) {
  return dtype == DeviceDType::kFloat16 ? "fp16" : "bf16";
}

// A [batch, seq, heads, dim] tensor in device memory. Heads and dim are
// contiguous (head h of a row starts h * dim elements in); batch and seq are
// strided, in elements, so a slice of a longer sequence or one part of a packed
// QKV buffer can be passed without a copy.
template <typename T>
struct DeviceTensor {
  T* data = nullptr;
  int64_t batch_stride = 0;
  int64_t seq_stride = 0;
};

// One dense attention block. Query head h reads key/value head
// h / (q_heads / kv_heads). With `causal`, query i sees key j iff
// j <= i + kv_len - q_len (bottom-right aligned), so for q_len > kv_len the
// first q_len - kv_len query rows see no key; such rows get o = 0 and
// lse = -inf.
struct DeviceAttentionArgs {
  DeviceDType dtype = DeviceDType::kBFloat16;
  int64_t batch = 1;
  int64_t q_len = 0;
  int64_t kv_len = 0;
  int64_t q_heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;

  DeviceTensor<const void> q;  // [batch, q_len, q_heads, head_dim]
  DeviceTensor<const void> k;  // [batch, kv_len, kv_heads, head_dim]
  DeviceTensor<const void> v;  // [batch, kv_len, kv_heads, head_dim]
  DeviceTensor<void> o;        // [batch, q_len, q_heads, head_dim], dtype
  // [batch, q_len, q_heads] contiguous fp32, natural log of each row's softmax
  // denominator (scores scaled); may be null when the caller needs no LSE.
  float* lse = nullptr;

  float scale = 1.0f;
  bool causal = false;  // ignored with a work list: its spans say

  // Empty: the whole block. Otherwise only the listed query tiles against
  // their key spans, which only our flash kernel takes.
  DeviceWorkList work;
};

// Where the rows of a partial attention result lie in fp32 accumulators
// (partial_merge.h), strides in floats: row (b, t, h) (batch b, position t,
// head h) of the partial is folded into the `dim` values at o + b *
// o_batch_stride + t * o_seq_stride + h * dim and the LSE at lse + b *
// lse_batch_stride + t * lse_seq_stride + h.
struct AccumulatorRows {
  float* o = nullptr;
  int64_t o_batch_stride = 0;
  int64_t o_seq_stride = 0;
  float* lse = nullptr;
  int64_t lse_batch_stride = 0;
  int64_t lse_seq_stride = 0;
  // The rows hold nothing yet (they were never cleared): each partial row is
  // stored as it is, the empty result (O = 0, LSE = -inf) where it saw no
  // key, instead of folded into what the rows hold.
  bool fresh = false;
};

// The largest head dimension any GPU path accepts.
inline constexpr int64_t kMaxDeviceHeadDim = 256;

// nullptr if `args` is well formed; otherwise a static sentence saying what is
// wrong. Checks shapes, pointers, strides and the work list's counts, not
// whether memory is valid nor what the list's tiles say.
inline const char* FindAttentionArgsProblem(const DeviceAttentionArgs& args) {
  if (args.batch < 0 || args.q_len < 0 || args.kv_len < 0) {
    return "batch, q_len and kv_len must not be negative";
  }
  if (args.q_heads <= 0 || args.kv_heads <= 0) {
    return "q_heads and kv_heads must be positive";
  }
  if (args.q_heads % args.kv_heads != 0) {
    return "q_heads must be a multiple of kv_heads";
  }
  if (args.head_dim <= 0 || args.head_dim > kMaxDeviceHeadDim) {
    return "head_dim must be in [1, 256]";
  }
  if (!(args.scale > 0.0f && args.scale <= 3.402823466e+38f)) {
    return "scale must be finite and positive";
  }
  if (args.work.tile_count < 0 || args.work.span_count < 0) {
    return "the work list's counts must not be negative";
  }
  if ((args.work.tile_count > 0 && args.work.tiles == nullptr) ||
      (args.work.span_count > 0 && args.work.spans == nullptr)) {
    return "the work list's tiles and spans must point to device memory";
  }
  if (args.batch == 0 || args.q_len == 0) return nullptr;
  if (args.q.data == nullptr || args.o.data == nullptr) {
    return "q and o must point to device memory";
  }
  if (args.kv_len > 0 && (args.k.data == nullptr || args.v.data == nullptr)) {
    return "k and v must point to device memory";
  }
  if (args.q.seq_stride < args.q_heads * args.head_dim ||
      args.o.seq_stride < args.q_heads * args.head_dim ||
      args.k.seq_stride < args.kv_heads * args.head_dim ||
      args.v.seq_stride < args.kv_heads * args.head_dim) {
    return "a seq stride is shorter than heads * head_dim";
  }
  if (args.q.batch_stride < 0 || args.k.batch_stride < 0 ||
      args.v.batch_stride < 0 || args.o.batch_stride < 0) {
    return "batch strides must not be negative";
  }
  return nullptr;
}

}  // namespace ringattn

#endif  // RINGATTN_KERNELS_CUDA_ATTENTION_ARGS_H_
