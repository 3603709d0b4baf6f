#ifndef RINGATTN_WORKER_DEVICE_H_
#define RINGATTN_WORKER_DEVICE_H_

// The compute device of a worker: parsing --device ("cpu" or "cuda:N"),
// finding and describing CUDA devices, and owners of CUDA streams and events
// that release them when they go away. The functions are thread-safe; the
// stream and event owners are move-only and thread-compatible.

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ringattn {

// What --device names: the CPU, or CUDA device `cuda_index`.
struct DeviceChoice {
  int cuda_index = -1;  // -1: the CPU

  bool is_cuda() const { return cuda_index >= 0; }
  // "cpu" or "cuda:N".
  std::string Name() const;
};

// "cpu", or "cuda:N" with N a decimal device index ("cuda" alone means
// cuda:0). INVALID_ARGUMENT naming the accepted forms otherwise.
absl::StatusOr<DeviceChoice> ParseDevice(absl::string_view text);

// How many CUDA devices this process sees; 0 when there is no GPU or no
// driver.
int CudaDeviceCount();

// One CUDA device as the runtime describes it.
struct CudaDeviceInfo {
  int index = 0;
  std::string name;         // e.g. "NVIDIA H100 80GB HBM3"
  int64_t total_bytes = 0;  // device memory
  int64_t free_bytes = 0;   // free when it was opened
  int compute_major = 0;    // compute capability, e.g. 9.0
  int compute_minor = 0;
};

// Asks CUDA to load every kernel when the process's first context starts
// (CUDA_MODULE_LOADING=EAGER) rather than each at its first launch, unless
// the environment already chooses; call it before the first CUDA call. On one
// H200 a worker's first decode step against a 4M-token context took 4.36-4.60
// ms of GPU time with kernels loading on first use and 3.85-3.91 eagerly
// (later steps 3.77-3.87 either way), while the worker served 0.28 s after it
// started against 0.30, with 4 MiB more device memory in use.
void LoadKernelsEagerly();

// Makes CUDA device `index` current on the calling thread (creating its
// context) and describes it. NOT_FOUND "no CUDA device N: ..." if there is no
// such device (the message says how many there are, or why none can be seen);
// INTERNAL if the device cannot be used.
absl::StatusOr<CudaDeviceInfo> OpenCudaDevice(int index);

// OpenCudaDevice without the description (which takes milliseconds): makes
// the device current, with the same errors.
absl::Status EnterCudaDevice(int index);

// cudaSetDevice(index) as a Status.
absl::Status UseCudaDevice(int index);

// A CUDA stream on the device current at Create, destroyed with its owner.
class CudaStream {
 public:
  CudaStream() = default;
  ~CudaStream();
  CudaStream(CudaStream&& other) noexcept;
  CudaStream& operator=(CudaStream&& other) noexcept;
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;

  // A non-blocking stream (it does not wait for the legacy default stream);
  // with `high_priority`, at the device's highest priority, so that its
  // kernels take SMs before those of ordinary streams.
  static absl::StatusOr<CudaStream> Create(bool high_priority = false);

  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

// A CUDA event on the device current at Create, destroyed with its owner.
class CudaEvent {
 public:
  CudaEvent() = default;
  ~CudaEvent();
  CudaEvent(CudaEvent&& other) noexcept;
  CudaEvent& operator=(CudaEvent&& other) noexcept;
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;

  // With `timing`, elapsed times between two such events can be read;
  // without, it is the cheapest kind, for ordering and polling.
  static absl::StatusOr<CudaEvent> Create(bool timing);

  // Returns once the work recorded before the event is done, polling rather
  // than sleeping: a sleeping thread wakes 0.1-0.5 ms after the GPU finished,
  // which is most of a decode step's slack. `what` names the wait in errors.
  absl::Status Wait(const char* what) const;

  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

}  // namespace ringattn

#endif  // RINGATTN_WORKER_DEVICE_H_
