#ifndef RINGATTN_WORKER_GPU_RING_TESTING_H_
#define RINGATTN_WORKER_GPU_RING_TESTING_H_

// For GpuRingExecutor tests: random inputs rounded to the compute dtype with
// their float64 reference, shards cut from and put back into whole tensors,
// outputs poisoned on the device before a run (so that a row no kernel
// writes shows as NaN), and the comparison with the reference.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/attention_spec.h"
#include "core/range.h"
#include "core/tensor.h"
#include "kernels/cuda/attention_args.h"
#include "worker/gpu_ring_executor.h"

namespace ringattn {

// Normal random values of `shape` from `seed`, each rounded to `dtype`.
Tensor<float> RoundedRandomTensor(Shape shape, DeviceDType dtype,
                                  uint32_t seed);

// Random inputs of a spec's shapes, rounded to a 16-bit dtype, and the
// float64 reference of some of the query rows.
struct ReferenceProblem {
  AttentionSpec spec;
  Tensor<float> q, k, v;
  std::vector<int64_t> rows;  // the query rows o_ref and lse_ref hold
  Tensor<double> o_ref, lse_ref;
};

// Q, K and V of `spec` (RoundedRandomTensor, seeds 1, 2, 3) and the reference
// of every query row, or with 0 < `sampled_rows` < q_len of that many: the
// first, the last and random ones.
ReferenceProblem MakeReferenceProblem(const AttentionSpec& spec,
                                      DeviceDType dtype, int64_t sampled_rows);

// The worst |O - O_ref| / (1 + |O_ref|) over the reference's rows, and where.
struct ReferenceError {
  double worst = 0;
  std::string where;
};

// Compares `o` and `lse` (of the whole query) with `p`'s reference on its
// rows, through gtest assertions that stop it at the first failure (call it
// under ASSERT_NO_FATAL_FAILURE): the LSE within 1e-2 * (1 + |LSE_ref|), no O
// value NaN, and rows that see no key exactly O = 0, LSE = -inf. Sets `error`
// to the worst O error, for the caller to hold to its dtype's tolerance.
void CompareWithReference(const ReferenceProblem& p, const Tensor<float>& o,
                          const Tensor<float>& lse, ReferenceError* error);

// The rows of `full` at the positions `chunks` cover, in chunk order.
Tensor<float> GatherChunks(const Tensor<float>& full,
                           const std::vector<Range>& chunks);

// Copies the rows of `shard` (GatherChunks' order) back to their positions
// in `full`.
void ScatterChunks(const Tensor<float>& shard, const std::vector<Range>& chunks,
                   Tensor<float>& full);

// Fills the executor's fp32 O and LSE on the device with NaN, on its stream:
// call it after the shard is loaded and before Run. INTERNAL for a failing
// CUDA call.
absl::Status PoisonOutput(const GpuRingExecutor& executor);

// The first NaN in `o` or `lse` ([B, N, H, D] and [B, N, H, 1]) as "O of
// batch b row i head h" (or "LSE of ..."); empty when there is none.
std::string FirstNaN(const Tensor<float>& o, const Tensor<float>& lse);

}  // namespace ringattn

#endif  // RINGATTN_WORKER_GPU_RING_TESTING_H_
