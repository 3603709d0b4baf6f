#ifndef RINGATTN_WORKER_KERNEL_LAUNCHES_H_
#define RINGATTN_WORKER_KERNEL_LAUNCHES_H_

// KernelLaunches: how many times each attention kernel ran on one worker for
// one request, what ExecuteDone.kernel_launches carries to the coordinator
// under the names of Named() (see proto/ringattn/v1/worker.proto). A CPU
// worker launches one kernels/cpu kernel per task; a GPU worker one
// kernels/cuda/attention_dispatch.h path per tile, work list or dilated call.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/run_task.h"

namespace ringattn {

struct KernelLaunches {
  int64_t cpu_block = 0;   // "cpu_block": BlockAttention (CpuKernel::kBlock)
  int64_t cpu_decode = 0;  // "cpu_decode": DecodeAttention (CpuKernel::kDecode)
  int64_t cudnn = 0;       // "cudnn": AttentionPath::kCudnn
  int64_t flash = 0;       // "flash": AttentionPath::kFlash
  int64_t hopper = 0;      // "hopper": AttentionPath::kHopper
  int64_t decode = 0;      // "decode": AttentionPath::kDecode (the GPU one)

  // Counts one launch of `kernel`.
  void Add(CpuKernel kernel);
  // (name, launches) of every kernel that ran, in the order of the fields.
  std::vector<std::pair<std::string, int64_t>> Named() const;
  // "cpu_block 3, cpu_decode 1"; "none" if nothing ran.
  std::string ToString() const;
};

}  // namespace ringattn

#endif  // RINGATTN_WORKER_KERNEL_LAUNCHES_H_
