#ifndef RINGATTN_WORKER_TASK_FLOPS_H_
#define RINGATTN_WORKER_TASK_FLOPS_H_

// The floating-point work of one ring-plan task, counted the way attention
// throughput is usually quoted: 4 * D operations per visible (query, key) pair
// and query head (2 * D for Q K^T, 2 * D for P V); masked pairs count nothing.
// Pure functions; thread-safe.

#include <cstdint>

#include "core/attention_spec.h"
#include "core/block_mask.h"
#include "core/range.h"
#include "core/ring_plan.h"

namespace ringattn {

// The pairs (qp, kp) with qp in `q`, kp in `k` and kp <= qp + shift. O(1).
int64_t CausalPairs(const Range& q, const Range& k, int64_t shift);

// The FLOPs of `task` under `spec`; `blocks` must be set for block-sparse
// tasks.
double TaskFlops(const AttentionSpec& spec, const BlockMask* blocks,
                 const AttentionTask& task);

}  // namespace ringattn

#endif  // RINGATTN_WORKER_TASK_FLOPS_H_
