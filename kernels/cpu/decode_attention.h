#ifndef RINGATTN_KERNELS_CPU_DECODE_ATTENTION_H_
#define RINGATTN_KERNELS_CPU_DECODE_ATTENTION_H_

// The CPU kernel for few query rows against a long key block (decoding): the
// query rows of all heads that share a key/value head are packed together, so
// each K/V row is read once for all of them, and the keys are split over the
// OpenMP threads; the splits merge by log-sum-exp. Same arguments and results
// as BlockAttention (block_attention.h), which stays faster for long query
// blocks. Thread-safe: calls share nothing but their arguments.

#include "core/tensor.h"
#include "kernels/cpu/block_attention.h"

namespace ringattn {

// Writes o ([B, nq, Hq, D]) and lse ([B, nq, Hq, 1], natural log) over the
// visible keys of the task, exactly as BlockAttention does: a query row that
// sees no key gets o = 0 and lse = -inf; query head h reads key/value head
// h / (Hq / Hkv). Allocates its scratch per call.
void DecodeAttention(const BlockAttentionArgs& args, View<float> o,
                     View<float> lse);

}  // namespace ringattn

#endif  // RINGATTN_KERNELS_CPU_DECODE_ATTENTION_H_
