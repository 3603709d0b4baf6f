#ifndef RINGATTN_KERNELS_CPU_RUN_TASK_H_
#define RINGATTN_KERNELS_CPU_RUN_TASK_H_

// Runs one task of a ring plan on the CPU and folds its result into a worker's
// accumulated output. Dilated tasks run one (head, segment) at a time over
// strided views of the kept positions, so no compacted copy is made.

#include <vector>

#include "core/attention_spec.h"
#include "core/block_mask.h"
#include "core/ring_plan.h"
#include "core/tensor.h"

namespace ringattn {

// What one worker computes against: its query shard, the K/V block it holds
// now, and its accumulated output (o: [B, n, Hq, D], lse: [B, n, Hq, 1],
// started at 0 / -inf).
struct WorkerBuffers {
  View<const float> q;
  View<const float> k;
  View<const float> v;
  View<float> o;
  View<float> lse;
  // One task's partial result before it is merged; grown when a task needs
  // more, so a worker that keeps it across tasks allocates it once.
  std::vector<float>* scratch;
};

// Computes `task` and merges it into buffers.o / buffers.lse. `blocks` must be
// set for block-sparse tasks.
void RunAttentionTask(const AttentionSpec& spec, const BlockMask* blocks,
                      const AttentionTask& task, const WorkerBuffers& buffers);

// Applies what comes after the last task: the 1/G of the HEAD_GROUPS combine.
void FinishAttention(const AttentionSpec& spec, View<float> o);

}  // namespace ringattn

#endif  // RINGATTN_KERNELS_CPU_RUN_TASK_H_
