#ifndef RINGATTN_KERNELS_CPU_BLOCK_ATTENTION_H_
#define RINGATTN_KERNELS_CPU_BLOCK_ATTENTION_H_

// The fast CPU kernel: attention of one query block against one key block (one
// task of the ring plan), tiled with an online softmax in fp32, multi-threaded
// over (batch, head, query tile). Thread-safe: calls share nothing but their
// arguments.

#include <cstdint>

#include "core/block_mask.h"
#include "core/tensor.h"
#include "kernels/cpu/kv_view.h"

namespace ringattn {

// Which (query, key) pairs of a task are visible. Positions are global sequence
// positions: query row a of the task sits at q_position + a, key row c at
// k_position + c.
struct TileMask {
  // Key at position kp is visible from the query at position qp iff kp <= qp +
  // causal_shift.
  bool causal = false;
  int64_t causal_shift = 0;
  // If set, the pair is visible only where blocks->Allowed(qp / bs, kp / bs).
  const BlockMask* blocks = nullptr;
};

struct BlockAttentionArgs {
  View<const float> q;  // [B, nq, Hq, D]
  KvView k;             // [B, nk, Hkv, D]; Hq % Hkv == 0; fp32 or bf16
  KvView v;             // [B, nk, Hkv, D], the same width as k
  int64_t q_position = 0;
  int64_t k_position = 0;
  float scale = 1.0f;
  TileMask mask;
};

// Writes o ([B, nq, Hq, D]) and lse ([B, nq, Hq, 1], natural log) over the
// visible keys of the task. A query row that sees no key gets o = 0 and lse =
// -inf. Query head h reads key/value head h / (Hq / Hkv).
void BlockAttention(const BlockAttentionArgs& args, View<float> o,
                    View<float> lse);

}  // namespace ringattn

#endif  // RINGATTN_KERNELS_CPU_BLOCK_ATTENTION_H_
