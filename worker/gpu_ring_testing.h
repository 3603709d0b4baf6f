#ifndef RINGATTN_WORKER_GPU_RING_TESTING_H_
#define RINGATTN_WORKER_GPU_RING_TESTING_H_

// For GpuRingExecutor tests: inputs the float64 reference and the GPU see
// alike, shards cut from and put back into whole tensors, and outputs
// poisoned on the device before a run, so that a row no kernel writes shows
// as NaN.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/range.h"
#include "core/tensor.h"
#include "kernels/cuda/attention_args.h"
#include "worker/gpu_ring_executor.h"

namespace ringattn {

// Normal random values of `shape` from `seed`, each rounded to `dtype`.
Tensor<float> RoundedRandomTensor(Shape shape, DeviceDType dtype,
                                  uint32_t seed);

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
