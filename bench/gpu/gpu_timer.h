#ifndef RINGATTN_BENCH_GPU_GPU_TIMER_H_
#define RINGATTN_BENCH_GPU_GPU_TIMER_H_

// GpuTimer: the milliseconds of work enqueued on a CUDA stream, read from a
// pair of CUDA events recorded around it; and the median of such timings,
// which the GPU benchmarks report.

#include <cuda_runtime.h>

#include <functional>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/device.h"

namespace ringattn {

class GpuTimer {
 public:
  static absl::StatusOr<GpuTimer> Create();

  // Milliseconds of the work `run` enqueues on `stream`; run's own failure
  // or the CUDA error that stopped the timing otherwise.
  absl::StatusOr<double> Time(const std::function<absl::Status()>& run,
                              cudaStream_t stream) const;

 private:
  GpuTimer(CudaEvent start, CudaEvent stop)
      : start_(std::move(start)), stop_(std::move(stop)) {}

  CudaEvent start_;
  CudaEvent stop_;
};

// Median milliseconds of `run` on `stream`: `warmup_calls` (>= 1) untimed
// calls, the last of which sets how many timed calls make about `seconds`
// (3 to 20).
absl::StatusOr<double> MedianMilliseconds(
    const std::function<absl::Status()>& run, cudaStream_t stream,
    double seconds, int warmup_calls);

}  // namespace ringattn

#endif  // RINGATTN_BENCH_GPU_GPU_TIMER_H_
