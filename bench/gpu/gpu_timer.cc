#include "bench/gpu/gpu_timer.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "core/status_macros.h"
#include "kernels/cuda/device_buffer.h"

namespace ringattn {

absl::StatusOr<GpuTimer> GpuTimer::Create() {
  absl::StatusOr<CudaEvent> start = CudaEvent::Create(/*timing=*/true);
  if (!start.ok()) return start.status();
  absl::StatusOr<CudaEvent> stop = CudaEvent::Create(/*timing=*/true);
  if (!stop.ok()) return stop.status();
  return GpuTimer(*std::move(start), *std::move(stop));
}

absl::StatusOr<double> GpuTimer::Time(const std::function<absl::Status()>& run,
                                      cudaStream_t stream) const {
  RINGATTN_RETURN_IF_ERROR(CudaStatus(cudaEventRecord(start_.get(), stream),
                                      "recording the start event"));
  RINGATTN_RETURN_IF_ERROR(run());
  RINGATTN_RETURN_IF_ERROR(CudaStatus(cudaEventRecord(stop_.get(), stream),
                                      "recording the stop event"));
  RINGATTN_RETURN_IF_ERROR(stop_.Wait("waiting for the timed work"));
  float ms = 0;
  RINGATTN_RETURN_IF_ERROR(
      CudaStatus(cudaEventElapsedTime(&ms, start_.get(), stop_.get()),
                 "reading the time"));
  return static_cast<double>(ms);
}

absl::StatusOr<double> MedianMilliseconds(
    const std::function<absl::Status()>& run, cudaStream_t stream,
    double seconds, int warmup_calls) {
  absl::StatusOr<GpuTimer> timer = GpuTimer::Create();
  if (!timer.ok()) return timer.status();
  absl::StatusOr<double> last;
  for (int i = 0; i < std::max(1, warmup_calls); ++i) {
    last = timer->Time(run, stream);
    if (!last.ok()) return last.status();
  }
  const int calls = std::clamp(static_cast<int>(seconds * 1e3 / *last), 3, 20);
  std::vector<double> times;
  for (int i = 0; i < calls; ++i) {
    absl::StatusOr<double> ms = timer->Time(run, stream);
    if (!ms.ok()) return ms.status();
    times.push_back(*ms);
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace ringattn
