#ifndef RINGATTN_KERNELS_CPU_RUN_TASK_H_
#define RINGATTN_KERNELS_CPU_RUN_TASK_H_

// Runs one task of a ring plan on the CPU and folds its result into a worker's
// accumulated output. Dilated tasks run one (head, segment) at a time over
// strided views of the kept positions, so no compacted copy is made.

#include <cstdint>
#include <vector>

#include "core/attention_spec.h"
#include "core/block_mask.h"
#include "core/ring_plan.h"
#include "core/tensor.h"
#include "kernels/cpu/kv_view.h"

namespace ringattn {

// What one worker computes against: its query shard, the K/V block it holds
// now, and its accumulated output (o: [B, n, Hq, D], lse: [B, n, Hq, 1],
// started at 0 / -inf).
struct WorkerBuffers {
  View<const float> q;
  // fp32, or bf16 for any task but a dilated one.
  KvView k;
  KvView v;
  View<float> o;
  View<float> lse;
  // One task's partial result before it is merged; grown when a task needs
  // more, so a worker that keeps it across tasks allocates it once.
  std::vector<float>* scratch;
};

// Which CPU kernel computed a task.
enum class CpuKernel { kBlock, kDecode };

// Tasks of at most this many packed query rows (query rows times Hq / Hkv: the
// rows DecodeAttention computes per K/V head) run DecodeAttention if dense or
// causal; longer tasks run BlockAttention, and so do block-sparse ones (which
// DecodeAttention masks but, unlike BlockAttention, does not skip by tile) and
// dilated ones (strided per-head views). From bench/cpu_decode (fp32, D=128,
// causal, 2 threads on the shared 2-core VM, decode speed-up over block in the
// same run; noisy): Hq/Hkv=4 at Nk 4K/16K/64K was 1.5x/1.6x/1.2x at Nq=32 (128
// packed rows), 1.2x/1.4x/0.7x at Nq=64 and 0.9x/1.3x/1.3x at Nq=128; at
// Nk=16K, Hq/Hkv=8 was 1.4x at Nq=32, 1.1x at 64, 0.5x at 128, and Hq/Hkv=1
// still 1.6x at Nq=128. The crossover lies between 256 and 1024 packed rows;
// 128 keeps a margin.
inline constexpr int64_t kDecodeMaxPackedRows = 128;

// Computes `task` and merges it into buffers.o / buffers.lse; returns the
// kernel that ran. `blocks` must be set for block-sparse tasks.
CpuKernel RunAttentionTask(const AttentionSpec& spec, const BlockMask* blocks,
                           const AttentionTask& task,
                           const WorkerBuffers& buffers);

// Applies what comes after the last task: the 1/G of the HEAD_GROUPS combine.
void FinishAttention(const AttentionSpec& spec, View<float> o);

}  // namespace ringattn

#endif  // RINGATTN_KERNELS_CPU_RUN_TASK_H_
