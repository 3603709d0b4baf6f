// Times one dense attention block on the GPU paths, cuDNN's fused SDPA, our
// mma.sync kernel and, on Hopper GPUs, our wgmma kernel, on the shapes of
// DESIGN.md's yardsticks (bf16, head_dim 128, 32 heads, batch 1 unless
// --batch says otherwise, dense and causal) and prints a markdown table of
// TFLOP/s (4 * N^2 * H * D per dense block and batch, half of it causal), each
// the median of several calls timed with CUDA events after warm-up. Both paths
// read the same random inputs; the table also gives the largest difference
// between cuDNN's outputs and each of ours over a sample of rows, as a sanity
// check.
//
//   gpu_attention_bench [--lengths=4096,16384,65536] [--batch=1] [--seconds=2]

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/gpu/gpu_timer.h"
#include "bench/gpu/random_inputs.h"
#include "core/dtype.h"
#include "kernels/cuda/attention_args.h"
#include "kernels/cuda/attention_dispatch.h"
#include "kernels/cuda/cudnn_attention.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/hopper_attention.h"
#include "worker/device.h"

ABSL_FLAG(std::vector<std::string>, lengths,
          (std::vector<std::string>{"4096", "16384", "65536"}),
          "sequence lengths N (queries = keys = N)");
ABSL_FLAG(int32_t, head_dim, 128, "head dimension D (1 to 256)");
ABSL_FLAG(int32_t, batch, 1,
          "batch B (a dilated request's segments are such a batch)");
ABSL_FLAG(double, seconds, 2.0,
          "timed calls per case: about this many seconds' worth, 3 to 20");

namespace ringattn {
namespace {

constexpr int64_t kHeads = 32;

// The head dimension of every block (--head_dim).
int64_t HeadDim() { return absl::GetFlag(FLAGS_head_dim); }
// The batch of every block (--batch).
int64_t Batch() { return absl::GetFlag(FLAGS_batch); }
constexpr int kWarmupCalls = 2;
constexpr int64_t kSampleRows = 64;  // compared at each end of the sequence

// Rows [first, first + count) of a [1, N, H, D] bf16 tensor, as floats.
absl::StatusOr<std::vector<float>> DownloadRows(const DeviceBuffer& buffer,
                                                int64_t first, int64_t count) {
  const int64_t width = kHeads * HeadDim();
  std::vector<uint16_t> bits(static_cast<size_t>(count * width));
  if (absl::Status s = CudaStatus(
          cudaMemcpy(bits.data(), buffer.as<uint16_t>() + first * width,
                     bits.size() * sizeof(uint16_t), cudaMemcpyDeviceToHost),
          "downloading output rows");
      !s.ok()) {
    return s;
  }
  std::vector<float> values(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) values[i] = BFloat16ToFloat(bits[i]);
  return values;
}

// The largest |a - b| over the first and last kSampleRows rows of batch 0.
absl::StatusOr<double> SampleDifference(const DeviceBuffer& a,
                                        const DeviceBuffer& b, int64_t n) {
  double worst = 0;
  for (int64_t first : {int64_t{0}, std::max<int64_t>(0, n - kSampleRows)}) {
    const int64_t count = std::min(kSampleRows, n);
    absl::StatusOr<std::vector<float>> x = DownloadRows(a, first, count);
    if (!x.ok()) return x.status();
    absl::StatusOr<std::vector<float>> y = DownloadRows(b, first, count);
    if (!y.ok()) return y.status();
    for (size_t i = 0; i < x->size(); ++i) {
      worst =
          std::max(worst, std::fabs(static_cast<double>((*x)[i]) - (*y)[i]));
    }
  }
  return worst;
}

struct Row {
  int64_t n = 0;
  bool causal = false;
  double cudnn_tflops = 0;  // 0 where cuDNN refused the block
  double flash_tflops = 0;
  double hopper_tflops = 0;  // 0 where the Hopper kernel does not take it
  double difference = NAN;
  double hopper_difference = NAN;
  std::string note;
};

absl::Status Measure(int64_t n, double seconds, CudnnAttention* cudnn,
                     cudaStream_t stream, std::vector<Row>& rows) {
  const int64_t elements = Batch() * n * kHeads * HeadDim();
  absl::StatusOr<DeviceBuffer> q = RandomBFloat16(elements, 1);
  absl::StatusOr<DeviceBuffer> k = RandomBFloat16(elements, 2);
  absl::StatusOr<DeviceBuffer> v = RandomBFloat16(elements, 3);
  absl::StatusOr<DeviceBuffer> o_cudnn = DeviceBuffer::Allocate(elements * 2);
  absl::StatusOr<DeviceBuffer> o_flash = DeviceBuffer::Allocate(elements * 2);
  absl::StatusOr<DeviceBuffer> o_hopper = DeviceBuffer::Allocate(elements * 2);
  absl::StatusOr<DeviceBuffer> lse =
      DeviceBuffer::Allocate(Batch() * n * kHeads * sizeof(float));
  for (const auto* buffer : {&q, &k, &v, &o_cudnn, &o_flash, &o_hopper, &lse}) {
    if (!buffer->ok()) return buffer->status();
  }
  DeviceAttentionArgs args;
  args.dtype = DeviceDType::kBFloat16;
  args.batch = Batch();
  args.q_len = n;
  args.kv_len = n;
  args.q_heads = kHeads;
  args.kv_heads = kHeads;
  args.head_dim = HeadDim();
  const int64_t row = kHeads * HeadDim();
  args.q = {q->as<const void>(), n * row, row};
  args.k = {k->as<const void>(), n * row, row};
  args.v = {v->as<const void>(), n * row, row};
  args.lse = lse->as<float>();
  args.scale = 1.0f / std::sqrt(static_cast<float>(HeadDim()));

  for (bool causal : {false, true}) {
    args.causal = causal;
    Row result;
    result.n = n;
    result.causal = causal;
    const double flops =
        4.0 * Batch() * n * n * kHeads * HeadDim() * (causal ? 0.5 : 1);

    DeviceAttentionArgs flash_args = args;
    flash_args.o = {o_flash->as<void>(), n * row, row};
    absl::StatusOr<double> flash_ms = MedianMilliseconds(
        [&] { return RunFlashAttention(flash_args, stream); }, stream, seconds,
        kWarmupCalls);
    if (!flash_ms.ok()) return flash_ms.status();
    result.flash_tflops = flops / (*flash_ms * 1e-3) / 1e12;

    DeviceAttentionArgs hopper_args = args;
    hopper_args.o = {o_hopper->as<void>(), n * row, row};
    const bool hopper = HopperAttentionTakes(hopper_args);
    if (hopper) {
      absl::StatusOr<double> hopper_ms = MedianMilliseconds(
          [&] {
            return CudaStatus(LaunchHopperAttention(hopper_args, stream),
                              "launching the Hopper kernel");
          },
          stream, seconds, kWarmupCalls);
      if (!hopper_ms.ok()) return hopper_ms.status();
      result.hopper_tflops = flops / (*hopper_ms * 1e-3) / 1e12;
    }

    if (cudnn != nullptr) {
      DeviceAttentionArgs cudnn_args = args;
      cudnn_args.o = {o_cudnn->as<void>(), n * row, row};
      absl::StatusOr<double> cudnn_ms =
          MedianMilliseconds([&] { return cudnn->Forward(cudnn_args, stream); },
                             stream, seconds, kWarmupCalls);
      if (cudnn_ms.ok()) {
        result.cudnn_tflops = flops / (*cudnn_ms * 1e-3) / 1e12;
        absl::StatusOr<double> difference =
            SampleDifference(*o_cudnn, *o_flash, n);
        if (!difference.ok()) return difference.status();
        result.difference = *difference;
        if (hopper) {
          difference = SampleDifference(*o_cudnn, *o_hopper, n);
          if (!difference.ok()) return difference.status();
          result.hopper_difference = *difference;
        }
      } else if (absl::IsUnimplemented(cudnn_ms.status())) {
        result.note = std::string(cudnn_ms.status().message());
      } else {
        return cudnn_ms.status();
      }
    }
    rows.push_back(result);
  }
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (Batch() < 1) {
    std::fprintf(stderr, "gpu_attention_bench: --batch must be positive\n");
    return 2;
  }
  std::vector<int64_t> lengths;
  for (const std::string& text : absl::GetFlag(FLAGS_lengths)) {
    lengths.push_back(std::stoll(text));
  }
  cudaDeviceProp properties;
  if (absl::Status s =
          CudaStatus(cudaGetDeviceProperties(&properties, 0), "no GPU");
      !s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    return 1;
  }
  absl::StatusOr<CudaStream> stream = CudaStream::Create();
  if (!stream.ok()) {
    std::fprintf(stderr, "%s\n",
                 std::string(stream.status().message()).c_str());
    return 1;
  }
  absl::StatusOr<std::unique_ptr<CudnnAttention>> cudnn =
      CudnnAttention::Create();
  std::string cudnn_name = "cuDNN unavailable";
  if (cudnn.ok()) {
    cudnn_name = absl::StrCat("cuDNN ", CudnnAttention::LibraryVersion());
  } else {
    std::fprintf(stderr, "%s\n", std::string(cudnn.status().message()).c_str());
  }
  std::vector<Row> rows;
  for (int64_t n : lengths) {
    absl::Status measured =
        Measure(n, absl::GetFlag(FLAGS_seconds),
                cudnn.ok() ? cudnn->get() : nullptr, stream->get(), rows);
    if (!measured.ok()) {
      std::fprintf(stderr, "N=%lld: %s\n", static_cast<long long>(n),
                   std::string(measured.message()).c_str());
      return 1;
    }
  }
  std::printf(
      "\nringattn GPU attention, %s, %s, bf16, D=%lld, Hq=Hkv=%lld, B=%lld "
      "(TFLOP/s, median)\n\n",
      properties.name, cudnn_name.c_str(), static_cast<long long>(HeadDim()),
      static_cast<long long>(kHeads), static_cast<long long>(Batch()));
  std::printf(
      "| N | mask | cuDNN path | our kernel | ours / cuDNN | our Hopper "
      "kernel | Hopper / cuDNN | max abs diff (sampled rows), ours / "
      "Hopper |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (const Row& r : rows) {
    const std::string cudnn_cell = r.cudnn_tflops > 0
                                       ? absl::StrFormat("%.0f", r.cudnn_tflops)
                                       : absl::StrCat("refused: ", r.note);
    const std::string ratio =
        r.cudnn_tflops > 0
            ? absl::StrFormat("%.2f", r.flash_tflops / r.cudnn_tflops)
            : "-";
    const std::string hopper_cell =
        r.hopper_tflops > 0 ? absl::StrFormat("%.0f", r.hopper_tflops) : "-";
    const std::string hopper_ratio =
        r.cudnn_tflops > 0 && r.hopper_tflops > 0
            ? absl::StrFormat("%.2f", r.hopper_tflops / r.cudnn_tflops)
            : "-";
    const auto format_difference = [](double d) {
      return std::isnan(d) ? std::string("-") : absl::StrFormat("%.3g", d);
    };
    std::printf("| %lld | %s | %s | %.0f | %s | %s | %s | %s / %s |\n",
                static_cast<long long>(r.n), r.causal ? "causal" : "dense",
                cudnn_cell.c_str(), r.flash_tflops, ratio.c_str(),
                hopper_cell.c_str(), hopper_ratio.c_str(),
                format_difference(r.difference).c_str(),
                format_difference(r.hopper_difference).c_str());
  }
  return 0;
}

}  // namespace
}  // namespace ringattn

int main(int argc, char** argv) { return ringattn::Main(argc, argv); }
