#include "worker/device.h"

#include <stdlib.h>

#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda/device_buffer.h"

namespace ringattn {
namespace {

constexpr absl::string_view kCudaPrefix = "cuda";

absl::Status BadDevice(absl::string_view text) {
  return absl::InvalidArgumentError(
      absl::StrCat("--device=", text,
                   ": expected cpu or cuda:N with N a device index, e.g. "
                   "cuda:0"));
}

}  // namespace

std::string DeviceChoice::Name() const {
  return is_cuda() ? absl::StrCat("cuda:", cuda_index) : "cpu";
}

absl::StatusOr<DeviceChoice> ParseDevice(absl::string_view text) {
  DeviceChoice choice;
  if (text == "cpu") return choice;
  if (text == kCudaPrefix) {
    choice.cuda_index = 0;
    return choice;
  }
  if (!absl::StartsWith(text, "cuda:")) return BadDevice(text);
  const absl::string_view digits = text.substr(kCudaPrefix.size() + 1);
  int index = -1;
  if (digits.empty() ||
      digits.find_first_not_of("0123456789") != absl::string_view::npos ||
      !absl::SimpleAtoi(digits, &index) || index < 0) {
    return BadDevice(text);
  }
  choice.cuda_index = index;
  return choice;
}

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clears the sticky "no device" error
    return 0;
  }
  return count;
}

absl::Status EnterCudaDevice(int index) {
  int count = 0;
  const cudaError_t counted = cudaGetDeviceCount(&count);
  if (counted != cudaSuccess) {
    cudaGetLastError();
    return absl::NotFoundError(absl::StrCat(
        "no CUDA device ", index, ": the CUDA runtime sees no GPU here (",
        cudaGetErrorName(counted), ": ", cudaGetErrorString(counted), ")"));
  }
  if (index < 0 || index >= count) {
    return absl::NotFoundError(absl::StrCat(
        "no CUDA device ", index, ": this machine has ", count,
        count == 1
            ? " CUDA device (cuda:0)"
            : absl::StrCat(" CUDA devices (cuda:0 to cuda:", count - 1, ")")));
  }
  if (absl::Status s = UseCudaDevice(index); !s.ok()) return s;
  // Creates the context now, so that a broken device fails here.
  return CudaStatus(cudaFree(nullptr), "creating the context");
}

void LoadKernelsEagerly() { setenv("CUDA_MODULE_LOADING", "EAGER", 0); }

absl::StatusOr<CudaDeviceInfo> OpenCudaDevice(int index) {
  if (absl::Status s = EnterCudaDevice(index); !s.ok()) return s;
  cudaDeviceProp properties;
  if (absl::Status s = CudaStatus(cudaGetDeviceProperties(&properties, index),
                                  "cudaGetDeviceProperties");
      !s.ok()) {
    return s;
  }
  size_t free_bytes = 0;
  size_t total_bytes = 0;
  if (absl::Status s = CudaStatus(cudaMemGetInfo(&free_bytes, &total_bytes),
                                  "cudaMemGetInfo");
      !s.ok()) {
    return s;
  }
  CudaDeviceInfo info;
  info.index = index;
  info.name = properties.name;
  info.total_bytes = static_cast<int64_t>(total_bytes);
  info.free_bytes = static_cast<int64_t>(free_bytes);
  info.compute_major = properties.major;
  info.compute_minor = properties.minor;
  return info;
}

absl::Status UseCudaDevice(int index) {
  return CudaStatus(cudaSetDevice(index),
                    absl::StrCat("cudaSetDevice(", index, ")").c_str());
}

CudaStream::~CudaStream() {
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

CudaStream::CudaStream(CudaStream&& other) noexcept
    : stream_(std::exchange(other.stream_, nullptr)) {}

CudaStream& CudaStream::operator=(CudaStream&& other) noexcept {
  std::swap(stream_, other.stream_);
  return *this;
}

absl::StatusOr<CudaStream> CudaStream::Create(bool high_priority) {
  int priority = 0;
  if (high_priority) {
    int least = 0;
    if (absl::Status s =
            CudaStatus(cudaDeviceGetStreamPriorityRange(&least, &priority),
                       "cudaDeviceGetStreamPriorityRange");
        !s.ok()) {
      return s;
    }
  }
  CudaStream stream;
  if (absl::Status s =
          CudaStatus(cudaStreamCreateWithPriority(
                         &stream.stream_, cudaStreamNonBlocking, priority),
                     "cudaStreamCreateWithPriority");
      !s.ok()) {
    return s;
  }
  return stream;
}

CudaEvent::~CudaEvent() {
  if (event_ != nullptr) cudaEventDestroy(event_);
}

CudaEvent::CudaEvent(CudaEvent&& other) noexcept
    : event_(std::exchange(other.event_, nullptr)) {}

CudaEvent& CudaEvent::operator=(CudaEvent&& other) noexcept {
  std::swap(event_, other.event_);
  return *this;
}

absl::StatusOr<CudaEvent> CudaEvent::Create(bool timing) {
  CudaEvent event;
  const unsigned flags = timing ? cudaEventDefault : cudaEventDisableTiming;
  if (absl::Status s =
          CudaStatus(cudaEventCreateWithFlags(&event.event_, flags),
                     "cudaEventCreateWithFlags");
      !s.ok()) {
    return s;
  }
  return event;
}

absl::Status CudaEvent::Wait(const char* what) const {
  cudaError_t state;
  while ((state = cudaEventQuery(event_)) == cudaErrorNotReady) {
    std::this_thread::yield();
  }
  return CudaStatus(state, what);
}

}  // namespace ringattn
