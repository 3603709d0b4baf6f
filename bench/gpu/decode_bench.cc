// Times few query rows against a long K/V block on the GPU paths: our decode
// kernel (kernels/cuda/decode_attention), cuDNN's fused SDPA as ringattn calls
// it, our flash kernel, our Hopper kernel with split keys, and whichever of
// them the dispatcher picks (what ringattn runs, named in the table); bf16,
// Hq=32 and Hkv=8 unless --q_heads and --kv_heads say otherwise, D=128 unless
// --head_dim does, batch 1, dense. Prints a markdown table (median milliseconds
// after warm-up, K/V read rate and TFLOP/s) and, with --csv, one line per case
// for bench/gpu/peer_decode.py. K/V bytes are 2 * Nk * Hkv * D * 2 (each byte
// read once); FLOPs are 4 * Nq * Nk * Hq * D.
//
//   gpu_decode_bench [--kv_lengths=1048576,4194304] [--q_lengths=1,16,256,4096]
//                    [--paths=dispatch,decode,cudnn,flash,hopper]
//                    [--hopper_splits=2,4,8] [--q_heads=32 --kv_heads=8]
//                    [--head_dim=128]
//                    [--seconds=1] [--csv=FILE]

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
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "bench/gpu/gpu_timer.h"
#include "bench/gpu/random_inputs.h"
#include "core/dtype.h"
#include "kernels/cuda/attention_args.h"
#include "kernels/cuda/attention_dispatch.h"
#include "kernels/cuda/cudnn_attention.h"
#include "kernels/cuda/decode_attention.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/hopper_attention.h"
#include "worker/device.h"

ABSL_FLAG(std::vector<std::string>, kv_lengths,
          (std::vector<std::string>{"1048576", "4194304"}), "key counts Nk");
ABSL_FLAG(std::vector<std::string>, q_lengths,
          (std::vector<std::string>{"1", "16", "256", "4096"}),
          "query row counts Nq");
ABSL_FLAG(std::vector<std::string>, paths,
          (std::vector<std::string>{"dispatch", "decode", "cudnn", "flash",
                                    "hopper"}),
          "which of dispatch (AttentionDispatcher's pick), decode, cudnn, "
          "flash, hopper (our Hopper kernel, keys split as HopperKeySplits "
          "says) to time");
ABSL_FLAG(std::vector<std::string>, hopper_splits, {},
          "also time our Hopper kernel with each of these key split counts "
          "(1-256; path hopper/N), to see where HopperKeySplits's pick lies");
ABSL_FLAG(int64_t, q_heads, 32, "query heads Hq");
ABSL_FLAG(int64_t, kv_heads, 8,
          "K/V heads Hkv (divides Hq; 1 lays one head's keys side by side)");
ABSL_FLAG(int64_t, head_dim, 128, "head dimension D");
ABSL_FLAG(double, seconds, 1.0,
          "timed calls per case: about this many seconds' worth, 3 to 20");
ABSL_FLAG(std::string, csv, "",
          "also write 'path,nk,nq,ms' lines to this file");

namespace ringattn {
namespace {

constexpr int kWarmupCalls = 1;
// Random values are drawn on the host for this many elements and repeated
// over larger buffers (RepeatedRandomBFloat16).
constexpr int64_t kRandomElements = int64_t{1} << 24;

struct Result {
  std::string path;
  int64_t nk = 0;
  int64_t nq = 0;
  double ms = NAN;  // NaN where the path refused the shape
};

int Main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  std::vector<int64_t> kv_lengths, q_lengths;
  for (const std::string& text : absl::GetFlag(FLAGS_kv_lengths)) {
    kv_lengths.push_back(std::stoll(text));
  }
  for (const std::string& text : absl::GetFlag(FLAGS_q_lengths)) {
    q_lengths.push_back(std::stoll(text));
  }
  const std::vector<std::string> paths = absl::GetFlag(FLAGS_paths);
  const auto wants = [&](const char* path) {
    return std::find(paths.begin(), paths.end(), path) != paths.end();
  };
  const double seconds = absl::GetFlag(FLAGS_seconds);
  cudaDeviceProp properties;
  const auto fail = [](const absl::Status& s) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    return 1;
  };
  const int64_t q_heads = absl::GetFlag(FLAGS_q_heads);
  const int64_t kv_heads = absl::GetFlag(FLAGS_kv_heads);
  if (q_heads < 1 || kv_heads < 1 || q_heads % kv_heads != 0) {
    return fail(absl::InvalidArgumentError(
        absl::StrCat("--q_heads ", q_heads, " must be a positive multiple of ",
                     "--kv_heads ", kv_heads)));
  }
  const int64_t head_dim = absl::GetFlag(FLAGS_head_dim);
  if (head_dim < 1 || head_dim > 256 || head_dim % 8 != 0) {
    return fail(absl::InvalidArgumentError(absl::StrCat(
        "--head_dim ", head_dim, " must be a multiple of 8 from 8 to 256")));
  }
  std::vector<int> split_counts;
  for (const std::string& text : absl::GetFlag(FLAGS_hopper_splits)) {
    int splits = 0;
    if (!absl::SimpleAtoi(text, &splits) || splits < 1 || splits > 256) {
      return fail(absl::InvalidArgumentError(absl::StrCat(
          "--hopper_splits: '", text, "' is not a split count from 1 to 256")));
    }
    split_counts.push_back(splits);
  }
  if (absl::Status s =
          CudaStatus(cudaGetDeviceProperties(&properties, 0), "no GPU");
      !s.ok()) {
    return fail(s);
  }
  absl::StatusOr<CudaStream> stream = CudaStream::Create();
  if (!stream.ok()) return fail(stream.status());
  absl::StatusOr<std::unique_ptr<CudnnAttention>> cudnn =
      CudnnAttention::Create();
  AttentionDispatcher dispatcher;
  if (!cudnn.ok())
    std::fprintf(stderr, "%s\n", cudnn.status().ToString().c_str());

  const int64_t max_q = *std::max_element(q_lengths.begin(), q_lengths.end());
  const int64_t q_row = q_heads * head_dim;
  const int64_t kv_row = kv_heads * head_dim;
  absl::StatusOr<DeviceBuffer> q =
      RepeatedRandomBFloat16(max_q * q_row, kRandomElements, 1);
  absl::StatusOr<DeviceBuffer> o = DeviceBuffer::Allocate(max_q * q_row * 2);
  absl::StatusOr<DeviceBuffer> lse =
      DeviceBuffer::Allocate(max_q * q_heads * sizeof(float));
  for (const auto* buffer : {&q, &o, &lse}) {
    if (!buffer->ok()) return fail(buffer->status());
  }
  std::vector<Result> results;
  for (int64_t nk : kv_lengths) {
    absl::StatusOr<DeviceBuffer> k =
        RepeatedRandomBFloat16(nk * kv_row, kRandomElements, 2);
    if (!k.ok()) return fail(k.status());
    absl::StatusOr<DeviceBuffer> v =
        RepeatedRandomBFloat16(nk * kv_row, kRandomElements, 3);
    if (!v.ok()) return fail(v.status());
    for (int64_t nq : q_lengths) {
      DeviceAttentionArgs args;
      args.dtype = DeviceDType::kBFloat16;
      args.q_len = nq;
      args.kv_len = nk;
      args.q_heads = q_heads;
      args.kv_heads = kv_heads;
      args.head_dim = head_dim;
      args.q = {q->as<const void>(), nq * q_row, q_row};
      args.k = {k->as<const void>(), nk * kv_row, kv_row};
      args.v = {v->as<const void>(), nk * kv_row, kv_row};
      args.o = {o->as<void>(), nq * q_row, q_row};
      args.lse = lse->as<float>();
      args.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));

      std::vector<std::pair<std::string, std::function<absl::Status()>>> runs;
      if (wants("dispatch")) {
        // One untimed call names the path; the timed ones take the same.
        absl::StatusOr<AttentionPath> picked =
            dispatcher.Forward(args, stream->get());
        if (!picked.ok()) return fail(picked.status());
        runs.push_back(
            {absl::StrCat("dispatch:", AttentionPathName(*picked)),
             [&] { return dispatcher.Forward(args, stream->get()).status(); }});
      }
      DeviceBuffer workspace;
      if (wants("decode")) {
        const size_t bytes = DecodeAttentionWorkspaceBytes(args);
        if (bytes > 0) {
          absl::StatusOr<DeviceBuffer> buffer = DeviceBuffer::Allocate(bytes);
          if (!buffer.ok()) return fail(buffer.status());
          workspace = *std::move(buffer);
        }
        runs.push_back({"decode", [&] {
                          return CudaStatus(
                              LaunchDecodeAttention(args, workspace.as<void>(),
                                                    workspace.bytes(),
                                                    stream->get()),
                              "decode kernel");
                        }});
      }
      if (wants("cudnn") && cudnn.ok()) {
        runs.push_back(
            {"cudnn", [&] { return (*cudnn)->Forward(args, stream->get()); }});
      }
      if (wants("flash")) {
        runs.push_back(
            {"flash", [&] { return RunFlashAttention(args, stream->get()); }});
      }
      // The Hopper kernel with HopperKeySplits's pick ("hopper") and with
      // each count of --hopper_splits; one workspace fits the largest.
      std::vector<std::pair<std::string, int>> split_runs;
      if (HopperAttentionTakes(args)) {
        if (wants("hopper")) {
          split_runs.push_back({"hopper", HopperKeySplits(args)});
        }
        for (const int splits : split_counts) {
          split_runs.push_back({absl::StrCat("hopper/", splits), splits});
        }
      }
      size_t split_bytes = 1;
      for (const auto& [name, splits] : split_runs) {
        split_bytes =
            std::max(split_bytes, HopperSplitWorkspaceBytes(args, splits));
      }
      DeviceBuffer split_workspace;
      if (!split_runs.empty()) {
        absl::StatusOr<DeviceBuffer> buffer =
            DeviceBuffer::Allocate(split_bytes);
        if (!buffer.ok()) return fail(buffer.status());
        split_workspace = *std::move(buffer);
      }
      for (const auto& [name, splits] : split_runs) {
        runs.push_back({name, [&, splits = splits] {
                          return CudaStatus(
                              LaunchHopperAttentionSplit(
                                  args, splits, split_workspace.as<void>(),
                                  split_workspace.bytes(), stream->get()),
                              "Hopper kernel");
                        }});
      }
      for (const auto& [path, run] : runs) {
        absl::StatusOr<double> ms =
            MedianMilliseconds(run, stream->get(), seconds, kWarmupCalls);
        if (!ms.ok() && !absl::IsUnimplemented(ms.status())) {
          return fail(ms.status());
        }
        results.push_back({path, nk, nq, ms.ok() ? *ms : NAN});
        std::fprintf(stderr, "%s Nk=%lld Nq=%lld: %.3f ms\n", path.c_str(),
                     static_cast<long long>(nk), static_cast<long long>(nq),
                     results.back().ms);
      }
    }
  }

  std::printf(
      "\nringattn decode bench, %s, bf16, Hq=%lld, Hkv=%lld, D=%lld, B=1, "
      "dense (median ms; GB/s = K/V bytes / time; TFLOP/s = 4 Nq Nk Hq D / "
      "time)\n\n",
      properties.name, static_cast<long long>(q_heads),
      static_cast<long long>(kv_heads), static_cast<long long>(head_dim));
  std::printf("| Nk | Nq | path | ms | K/V GB/s | TFLOP/s |\n");
  std::printf("| --- | --- | --- | --- | --- | --- |\n");
  for (const Result& r : results) {
    const double bytes = 2.0 * r.nk * kv_row * 2;
    const double flops = 4.0 * r.nq * r.nk * q_heads * head_dim;
    std::printf("| %lld | %lld | %s | %.3f | %.0f | %.1f |\n",
                static_cast<long long>(r.nk), static_cast<long long>(r.nq),
                r.path.c_str(), r.ms, bytes / (r.ms * 1e-3) / 1e9,
                flops / (r.ms * 1e-3) / 1e12);
  }
  if (const std::string csv = absl::GetFlag(FLAGS_csv); !csv.empty()) {
    std::FILE* file = std::fopen(csv.c_str(), "w");
    if (file == nullptr) return fail(absl::InternalError("cannot write csv"));
    for (const Result& r : results) {
      std::fprintf(file, "%s,%lld,%lld,%.4f\n", r.path.c_str(),
                   static_cast<long long>(r.nk), static_cast<long long>(r.nq),
                   r.ms);
    }
    std::fclose(file);
  }
  return 0;
}

}  // namespace
}  // namespace ringattn

int main(int argc, char** argv) { return ringattn::Main(argc, argv); }
