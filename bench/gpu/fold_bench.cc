// Times one ring step's tile on our Hopper kernel two ways: the kernel folding
// its rows into the fp32 accumulators as it stores them
// (LaunchHopperAttentionInto), against the kernel writing a 16-bit partial
// result and a merge kernel folding it in after (LaunchHopperAttention, then
// LaunchMergePartial), with the kernel alone (no fold) as the floor. The
// shapes are the tiles a ring runs (TunedRingConfig: 32768 query rows against
// up to 131072 keys), bf16, 32 heads, D=128; the three ways alternate, and
// each time is the median of many calls timed with CUDA events.
//
//   gpu_fold_bench [--rounds=5] [--calls=9]

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bench/gpu/gpu_timer.h"
#include "bench/gpu/random_inputs.h"
#include "kernels/cuda/attention_args.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/hopper_attention.h"
#include "kernels/cuda/partial_merge.h"
#include "worker/device.h"

ABSL_FLAG(int32_t, rounds, 5, "rounds of the three ways, alternating");
ABSL_FLAG(int32_t, calls, 9, "timed calls of each way per round");

namespace ringattn {
namespace {

constexpr int64_t kHeads = 32;
constexpr int64_t kHeadDim = 128;
constexpr int64_t kRowValues = kHeads * kHeadDim;

struct Shape {
  int64_t q_len;
  int64_t kv_len;
  bool causal;
};

absl::Status Measure(const Shape& shape, cudaStream_t stream) {
  const int64_t q_elements = shape.q_len * kRowValues;
  const int64_t kv_elements = shape.kv_len * kRowValues;
  absl::StatusOr<DeviceBuffer> q = RandomBFloat16(q_elements, 1);
  absl::StatusOr<DeviceBuffer> k = RandomBFloat16(kv_elements, 2);
  absl::StatusOr<DeviceBuffer> v = RandomBFloat16(kv_elements, 3);
  absl::StatusOr<DeviceBuffer> part_o = DeviceBuffer::Allocate(q_elements * 2);
  absl::StatusOr<DeviceBuffer> part_lse =
      DeviceBuffer::Allocate(shape.q_len * kHeads * sizeof(float));
  absl::StatusOr<DeviceBuffer> acc_o =
      DeviceBuffer::Allocate(q_elements * sizeof(float));
  absl::StatusOr<DeviceBuffer> acc_lse =
      DeviceBuffer::Allocate(shape.q_len * kHeads * sizeof(float));
  for (const auto* b : {&q, &k, &v, &part_o, &part_lse, &acc_o, &acc_lse}) {
    if (!b->ok()) return b->status();
  }
  if (absl::Status s =
          CudaStatus(LaunchClearAccumulators(acc_o->as<float>(), q_elements,
                                             acc_lse->as<float>(),
                                             shape.q_len * kHeads, stream),
                     "clearing");
      !s.ok()) {
    return s;
  }
  DeviceAttentionArgs args;
  args.dtype = DeviceDType::kBFloat16;
  args.q_len = shape.q_len;
  args.kv_len = shape.kv_len;
  args.q_heads = args.kv_heads = kHeads;
  args.head_dim = kHeadDim;
  args.q = {q->as<const void>(), q_elements, kRowValues};
  args.k = {k->as<const void>(), kv_elements, kRowValues};
  args.v = {v->as<const void>(), kv_elements, kRowValues};
  args.o = {part_o->as<void>(), q_elements, kRowValues};
  args.lse = part_lse->as<float>();
  args.scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
  args.causal = shape.causal;
  AccumulatorRows into;
  into.o = acc_o->as<float>();
  into.o_batch_stride = q_elements;
  into.o_seq_stride = kRowValues;
  into.lse = acc_lse->as<float>();
  into.lse_batch_stride = shape.q_len * kHeads;
  into.lse_seq_stride = kHeads;

  const std::vector<std::pair<const char*, std::function<cudaError_t()>>> ways =
      {{"kernel alone", [&] { return LaunchHopperAttention(args, stream); }},
       {"kernel + merge kernel",
        [&] {
          const cudaError_t e = LaunchHopperAttention(args, stream);
          if (e != cudaSuccess) return e;
          return LaunchMergePartial(
              args.dtype, part_o->as<void>(), part_lse->as<float>(), 1,
              shape.q_len * kHeads, kHeadDim, acc_o->as<float>(),
              acc_lse->as<float>(), shape.q_len * kHeads, stream);
        }},
       {"kernel folding as it stores",
        [&] { return LaunchHopperAttentionInto(args, into, stream); }}};
  absl::StatusOr<GpuTimer> timer = GpuTimer::Create();
  if (!timer.ok()) return timer.status();
  std::vector<std::vector<double>> times(ways.size());
  for (int round = -1; round < absl::GetFlag(FLAGS_rounds); ++round) {
    for (size_t w = 0; w < ways.size(); ++w) {
      for (int call = 0; call < absl::GetFlag(FLAGS_calls); ++call) {
        absl::StatusOr<double> ms = timer->Time(
            [&] { return CudaStatus(ways[w].second(), "launching"); }, stream);
        if (!ms.ok()) return ms.status();
        if (round >= 0) times[w].push_back(*ms);  // round -1 warms up
      }
    }
  }
  const double flops = 4.0 * shape.q_len * shape.kv_len * kRowValues *
                       (shape.causal ? 0.5 : 1.0);
  for (size_t w = 0; w < ways.size(); ++w) {
    std::sort(times[w].begin(), times[w].end());
    const double median = times[w][times[w].size() / 2];
    std::printf("| %lld | %lld | %s | %s | %.3f | %.3f | %.0f |\n",
                static_cast<long long>(shape.q_len),
                static_cast<long long>(shape.kv_len),
                shape.causal ? "causal" : "dense", ways[w].first, median,
                times[w].front(), flops / (median * 1e-3) / 1e12);
  }
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_rounds) < 1 || absl::GetFlag(FLAGS_calls) < 1) {
    std::fprintf(stderr, "gpu_fold_bench: --rounds and --calls must be >= 1\n");
    return 2;
  }
  absl::StatusOr<CudaStream> stream = CudaStream::Create();
  if (!stream.ok()) {
    std::fprintf(stderr, "%s\n",
                 std::string(stream.status().message()).c_str());
    return 1;
  }
  std::printf(
      "\n| query rows | keys | mask | way | median ms | best ms | TFLOP/s "
      "(median) |\n| --- | --- | --- | --- | --- | --- | --- |\n");
  for (const Shape& shape :
       {Shape{32768, 32768, true}, Shape{32768, 32768, false},
        Shape{32768, 131072, false}, Shape{16384, 16384, true}}) {
    if (absl::Status s = Measure(shape, stream->get()); !s.ok()) {
      std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace
}  // namespace ringattn

int main(int argc, char** argv) { return ringattn::Main(argc, argv); }
