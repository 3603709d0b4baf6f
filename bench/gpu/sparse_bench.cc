// Times block-sparse attention on one GPU three ways and prints a markdown
// table: our own kernel over a work list (one launch for the whole pattern,
// worker/work_list.h; the Hopper kernel where the GPU is one, and the
// mma.sync kernel beside it), cuDNN over the same pattern cut into rectangles,
// one call and one LSE merge into fp32 accumulators per rectangle tile (what
// the GPU ring's rectangle route issues, TileTask with its default 16K tiles),
// and dense attention at the same N and mask (cuDNN and our own kernel). bf16,
// 32 heads, batch 1; masks of local bands plus strided blocks, or random
// blocks, at several densities, causal or not. Each time is the median of
// three calls after one warm-up, by CUDA events. The table gives the fraction
// of dense's (query, key) pairs each mask computes next to the speedups over
// dense, and the largest difference between the two sparse routes' outputs
// over sampled rows as a sanity check. Each row prints as soon as it is
// measured, so a run cut short keeps what it measured.
//
//   gpu_sparse_bench [--lengths=65536,262144] [--block_size=1024]
//                    [--densities=0.05,0.12,0.25,0.5] [--head_dim=128]

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
#include "core/attention_spec.h"
#include "core/block_mask.h"
#include "core/dtype.h"
#include "core/ring_plan.h"
#include "core/status_macros.h"
#include "kernels/cuda/attention_args.h"
#include "kernels/cuda/attention_dispatch.h"
#include "kernels/cuda/cudnn_attention.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/partial_merge.h"
#include "worker/device.h"
#include "worker/gpu_ring_executor.h"
#include "worker/work_list.h"

ABSL_FLAG(std::vector<std::string>, lengths,
          (std::vector<std::string>{"65536", "262144"}),
          "sequence lengths N (queries = keys = N)");
ABSL_FLAG(int64_t, block_size, 1024, "block size of the masks");
ABSL_FLAG(std::vector<std::string>, densities,
          (std::vector<std::string>{"0.05", "0.12", "0.25", "0.5"}),
          "target fractions of allowed block pairs");
ABSL_FLAG(int32_t, head_dim, 128, "head dimension D (1 to 256)");

namespace ringattn {
namespace {

constexpr int64_t kHeads = 32;
// Each timing: one warm-up call, then three (MedianMilliseconds' fewest).
constexpr double kSeconds = 0;
constexpr int kWarmupCalls = 1;
constexpr int64_t kSampleRows = 64;  // compared at each end of the sequence
// The rectangle route's tiles (GpuRingConfig's defaults).
constexpr int64_t kTileRows = 16384;

// Allowed block pairs of about `density` of nb x nb: a local band plus every
// stride-th diagonal ("local+strided"), or the diagonal plus random blocks
// ("random").
BlockSparseRules RulesFor(const std::string& pattern, double density,
                          int64_t blocks, int64_t block_size) {
  BlockSparseRules rules;
  rules.block_size = block_size;
  const int64_t per_row =
      std::max<int64_t>(1, std::llround(density * static_cast<double>(blocks)));
  if (pattern == "random") {
    rules.local = 0;
    rules.random = per_row - 1;
    rules.seed = 17;
    return rules;
  }
  rules.local = per_row / 4;
  const int64_t strided = per_row - (2 * rules.local + 1);
  if (strided > 0) rules.dilated = std::max<int64_t>(2, blocks / strided);
  return rules;
}

struct Row {
  int64_t n = 0;
  bool causal = false;
  std::string pattern;
  double pairs = 0;           // fraction of dense's visible pairs
  double dense_cudnn_ms = 0;  // NaN where cuDNN refuses the shape
  double dense_ours_ms = 0;
  double list_ms = 0;        // on our own kernel (RunOwnAttention)
  std::string list_path;     // which one that is
  double list_flash_ms = 0;  // on the mma.sync kernel
  double rect_ms = 0;
  std::string rect_path;  // "cudnn", or our kernel where cuDNN refuses
  int64_t rect_calls = 0;
  int64_t list_tiles = 0;
  double difference = 0;
};

// Everything one length needs on the device.
struct Buffers {
  DeviceBuffer q, k, v, o, lse, part_o, part_lse, acc_o, acc_lse;
};

absl::StatusOr<Buffers> AllocateBuffers(int64_t n) {
  const int64_t elements = n * kHeads * absl::GetFlag(FLAGS_head_dim);
  const int64_t tile_elements =
      std::min(n, kTileRows) * kHeads * absl::GetFlag(FLAGS_head_dim);
  Buffers b;
  absl::StatusOr<DeviceBuffer> q = RandomBFloat16(elements, 1);
  absl::StatusOr<DeviceBuffer> k = RandomBFloat16(elements, 2);
  absl::StatusOr<DeviceBuffer> v = RandomBFloat16(elements, 3);
  absl::StatusOr<DeviceBuffer> o = DeviceBuffer::Allocate(elements * 2);
  absl::StatusOr<DeviceBuffer> lse = DeviceBuffer::Allocate(n * kHeads * 4);
  absl::StatusOr<DeviceBuffer> part_o =
      DeviceBuffer::Allocate(tile_elements * 2);
  absl::StatusOr<DeviceBuffer> part_lse =
      DeviceBuffer::Allocate(std::min(n, kTileRows) * kHeads * 4);
  absl::StatusOr<DeviceBuffer> acc_o = DeviceBuffer::Allocate(elements * 4);
  absl::StatusOr<DeviceBuffer> acc_lse = DeviceBuffer::Allocate(n * kHeads * 4);
  for (auto [from, to] :
       {std::pair{&q, &b.q}, std::pair{&k, &b.k}, std::pair{&v, &b.v},
        std::pair{&o, &b.o}, std::pair{&lse, &b.lse},
        std::pair{&part_o, &b.part_o}, std::pair{&part_lse, &b.part_lse},
        std::pair{&acc_o, &b.acc_o}, std::pair{&acc_lse, &b.acc_lse}}) {
    if (!from->ok()) return from->status();
    *to = *std::move(*from);
  }
  return b;
}

// The largest |list O - rectangle O| over the first and last kSampleRows rows
// (list O in bf16, the rectangles' in the fp32 accumulators).
absl::StatusOr<double> SampleDifference(const Buffers& b, int64_t n) {
  const int64_t width = kHeads * absl::GetFlag(FLAGS_head_dim);
  const int64_t count = std::min(kSampleRows, n);
  double worst = 0;
  for (int64_t first : {int64_t{0}, n - count}) {
    std::vector<uint16_t> list(static_cast<size_t>(count * width));
    std::vector<float> rect(list.size());
    RINGATTN_RETURN_IF_ERROR(
        CudaStatus(cudaMemcpy(list.data(), b.o.as<uint16_t>() + first * width,
                              list.size() * 2, cudaMemcpyDeviceToHost),
                   "downloading rows"));
    RINGATTN_RETURN_IF_ERROR(
        CudaStatus(cudaMemcpy(rect.data(), b.acc_o.as<float>() + first * width,
                              rect.size() * 4, cudaMemcpyDeviceToHost),
                   "downloading rows"));
    for (size_t i = 0; i < list.size(); ++i) {
      worst = std::max(
          worst,
          static_cast<double>(std::fabs(BFloat16ToFloat(list[i]) - rect[i])));
    }
  }
  return worst;
}

// One line of the table, flushed.
void PrintRow(const Row& r) {
  const bool cudnn_runs = !std::isnan(r.dense_cudnn_ms);
  const std::string dense_cudnn =
      cudnn_runs ? absl::StrFormat("%.1f", r.dense_cudnn_ms) : "-";
  const std::string over_dense =
      cudnn_runs
          ? absl::StrFormat("%.2fx | %.2fx", r.dense_cudnn_ms / r.list_ms,
                            r.dense_cudnn_ms / r.rect_ms)
          : "- | -";
  std::printf(
      "| %lld | %s | %s | %.3f | %s | %.1f | %.1f (%s) | %.1f | %.1f "
      "(%lld, %s) | %s | %.2fx | %.3g |\n",
      static_cast<long long>(r.n), r.causal ? "causal" : "dense",
      r.pattern.c_str(), r.pairs, dense_cudnn.c_str(), r.dense_ours_ms,
      r.list_ms, r.list_path.c_str(), r.list_flash_ms, r.rect_ms,
      static_cast<long long>(r.rect_calls), r.rect_path.c_str(),
      over_dense.c_str(), r.rect_ms / r.list_ms, r.difference);
  std::fflush(stdout);
}

absl::Status Measure(int64_t n, CudnnAttention& cudnn, cudaStream_t stream) {
  const int64_t d = absl::GetFlag(FLAGS_head_dim);
  const int64_t block_size = absl::GetFlag(FLAGS_block_size);
  const int64_t blocks = (n + block_size - 1) / block_size;
  absl::StatusOr<Buffers> buffers = AllocateBuffers(n);
  if (!buffers.ok()) return buffers.status();
  Buffers& b = *buffers;
  const int64_t width = kHeads * d;
  DeviceAttentionArgs args;
  args.batch = 1;
  args.q_len = args.kv_len = n;
  args.q_heads = args.kv_heads = kHeads;
  args.head_dim = d;
  args.q = {b.q.as<const void>(), n * width, width};
  args.k = {b.k.as<const void>(), n * width, width};
  args.v = {b.v.as<const void>(), n * width, width};
  args.o = {b.o.as<void>(), n * width, width};
  args.lse = b.lse.as<float>();
  args.scale = 1.0f / std::sqrt(static_cast<float>(d));

  for (const bool causal : {false, true}) {
    args.causal = causal;
    absl::StatusOr<double> dense_cudnn =
        MedianMilliseconds([&] { return cudnn.Forward(args, stream); }, stream,
                           kSeconds, kWarmupCalls);
    if (absl::IsUnimplemented(dense_cudnn.status())) {
      std::fprintf(stderr, "cuDNN refuses D=%lld: %s\n",
                   static_cast<long long>(d),
                   std::string(dense_cudnn.status().message()).c_str());
      dense_cudnn = std::nan("");
    }
    if (!dense_cudnn.ok()) return dense_cudnn.status();
    const bool cudnn_runs = !std::isnan(*dense_cudnn);
    absl::StatusOr<double> dense_ours = MedianMilliseconds(
        [&] { return RunOwnAttention(args, stream).status(); }, stream,
        kSeconds, kWarmupCalls);
    if (!dense_ours.ok()) return dense_ours.status();
    const double dense_pairs = causal ? 0.5 * n * (n + 1.0) : 1.0 * n * n;

    for (const std::string pattern : {"local+strided", "random"}) {
      for (const std::string& text : absl::GetFlag(FLAGS_densities)) {
        AttentionSpec spec;
        spec.q_len = spec.kv_len = n;
        spec.q_heads = spec.kv_heads = kHeads;
        spec.head_dim = d;
        spec.causal = causal;
        spec.block_sparse =
            RulesFor(pattern, std::stod(text), blocks, block_size);
        RINGATTN_RETURN_IF_ERROR(spec.Validate());
        const BlockMask mask = BlockMask::FromRules(*spec.block_sparse, n);
        AttentionTask task;
        task.q = Range{0, n};
        task.k = Range{0, n};
        task.kind = TaskKind::kBlockSparse;

        Row row;
        row.n = n;
        row.causal = causal;
        row.pattern = pattern;
        row.dense_cudnn_ms = *dense_cudnn;
        row.dense_ours_ms = *dense_ours;

        // One launch over the whole pattern.
        WorkList list;
        AddBlockSparseLaunches(spec, mask, task, n, list);
        row.list_tiles = static_cast<int64_t>(list.tiles.size());
        double visible = 0;
        for (const QueryTile& tile : list.tiles) {
          for (int32_t s = 0; s < tile.span_count; ++s) {
            const KeySpan& span = list.spans[tile.first_span + s];
            for (int64_t i = tile.begin; i < tile.end; ++i) {
              const int64_t last =
                  span.causal ? std::min<int64_t>(span.end - 1, i + span.shift)
                              : span.end - 1;
              visible += std::max<int64_t>(0, last - span.begin + 1);
            }
          }
        }
        row.pairs = visible / dense_pairs;
        const size_t tile_bytes = list.tiles.size() * sizeof(QueryTile);
        const size_t span_bytes = list.spans.size() * sizeof(KeySpan);
        absl::StatusOr<DeviceBuffer> work =
            DeviceBuffer::Allocate(tile_bytes + span_bytes);
        if (!work.ok()) return work.status();
        RINGATTN_RETURN_IF_ERROR(
            CudaStatus(cudaMemcpy(work->as<char>(), list.tiles.data(),
                                  tile_bytes, cudaMemcpyHostToDevice),
                       "uploading tiles"));
        RINGATTN_RETURN_IF_ERROR(CudaStatus(
            cudaMemcpy(work->as<char>() + tile_bytes, list.spans.data(),
                       span_bytes, cudaMemcpyHostToDevice),
            "uploading spans"));
        DeviceAttentionArgs list_args = args;
        list_args.causal = false;
        list_args.work.tiles = work->as<QueryTile>();
        list_args.work.tile_count = row.list_tiles;
        list_args.work.spans =
            reinterpret_cast<const KeySpan*>(work->as<char>() + tile_bytes);
        list_args.work.span_count = static_cast<int64_t>(list.spans.size());
        absl::StatusOr<double> list_flash_ms = MedianMilliseconds(
            [&] { return RunFlashAttention(list_args, stream); }, stream,
            kSeconds, kWarmupCalls);
        if (!list_flash_ms.ok()) return list_flash_ms.status();
        row.list_flash_ms = *list_flash_ms;
        absl::StatusOr<AttentionPath> path = RunOwnAttention(list_args, stream);
        if (!path.ok()) return path.status();
        row.list_path = AttentionPathName(*path);
        absl::StatusOr<double> list_ms = MedianMilliseconds(
            [&] { return RunOwnAttention(list_args, stream).status(); }, stream,
            kSeconds, kWarmupCalls);
        if (!list_ms.ok()) return list_ms.status();
        row.list_ms = *list_ms;

        // One cuDNN call and one merge per rectangle tile.
        const std::vector<AttentionTile> tiles =
            TileTask(spec, &mask, task, kTileRows, kTileRows);
        row.rect_calls = static_cast<int64_t>(tiles.size());
        row.rect_path = cudnn_runs ? "cudnn" : "";
        auto rectangles = [&]() -> absl::Status {
          RINGATTN_RETURN_IF_ERROR(
              CudaStatus(LaunchClearAccumulators(b.acc_o.as<float>(), n * width,
                                                 b.acc_lse.as<float>(),
                                                 n * kHeads, stream),
                         "clearing the accumulators"));
          for (const AttentionTile& tile : tiles) {
            DeviceAttentionArgs t = args;
            t.q_len = tile.q_len;
            t.kv_len = tile.kv_len;
            t.causal = tile.causal;
            t.q.data = b.q.as<const char>() + tile.q_row * width * 2;
            t.k.data = b.k.as<const char>() + tile.k_row * width * 2;
            t.v.data = b.v.as<const char>() + tile.k_row * width * 2;
            t.o = {b.part_o.as<void>(), tile.q_len * width, width};
            t.lse = b.part_lse.as<float>();
            if (cudnn_runs) {
              RINGATTN_RETURN_IF_ERROR(cudnn.Forward(t, stream));
            } else {
              absl::StatusOr<AttentionPath> own = RunOwnAttention(t, stream);
              if (!own.ok()) return own.status();
              row.rect_path = AttentionPathName(*own);
            }
            RINGATTN_RETURN_IF_ERROR(CudaStatus(
                LaunchMergePartial(DeviceDType::kBFloat16, b.part_o.as<void>(),
                                   b.part_lse.as<float>(), 1,
                                   tile.q_len * kHeads, d,
                                   b.acc_o.as<float>() + tile.q_row * width,
                                   b.acc_lse.as<float>() + tile.q_row * kHeads,
                                   n * kHeads, stream),
                "merging a tile"));
          }
          return absl::OkStatus();
        };
        absl::StatusOr<double> rect_ms =
            MedianMilliseconds(rectangles, stream, kSeconds, kWarmupCalls);
        if (!rect_ms.ok()) return rect_ms.status();
        row.rect_ms = *rect_ms;
        absl::StatusOr<double> difference = SampleDifference(b, n);
        if (!difference.ok()) return difference.status();
        row.difference = *difference;
        PrintRow(row);
        std::fprintf(stderr,
                     "N=%lld %s %s: %.3f of pairs, list %.2f ms, "
                     "rectangles %.2f ms (%lld calls)\n",
                     static_cast<long long>(n), causal ? "causal" : "dense",
                     pattern.c_str(), row.pairs, row.list_ms, row.rect_ms,
                     static_cast<long long>(row.rect_calls));
      }
    }
  }
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  cudaDeviceProp properties;
  if (absl::Status s =
          CudaStatus(cudaGetDeviceProperties(&properties, 0), "no GPU");
      !s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    return 1;
  }
  absl::StatusOr<CudaStream> stream = CudaStream::Create();
  absl::StatusOr<std::unique_ptr<CudnnAttention>> cudnn =
      CudnnAttention::Create();
  if (!stream.ok() || !cudnn.ok()) {
    std::fprintf(stderr, "%s\n",
                 std::string(!stream.ok() ? stream.status().message()
                                          : cudnn.status().message())
                     .c_str());
    return 1;
  }
  std::printf(
      "\nringattn block-sparse attention, %s, cuDNN %s, bf16, D=%d, "
      "Hq=Hkv=%lld, B=1, blocks of %lld (ms, median of 3)\n\n",
      properties.name, absl::StrCat(CudnnAttention::LibraryVersion()).c_str(),
      absl::GetFlag(FLAGS_head_dim), static_cast<long long>(kHeads),
      static_cast<long long>(absl::GetFlag(FLAGS_block_size)));
  std::printf(
      "| N | mask | pattern | pairs of dense | dense cuDNN | dense ours | "
      "list (1 launch, kernel) | list on the mma.sync kernel | per rectangle "
      "(calls, kernel) | list speedup vs dense cuDNN | rectangles speedup "
      "vs dense cuDNN | list vs rectangles | max diff "
      "|\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::fflush(stdout);
  for (const std::string& text : absl::GetFlag(FLAGS_lengths)) {
    const int64_t n = std::stoll(text);
    if (absl::Status s = Measure(n, **cudnn, stream->get()); !s.ok()) {
      std::fprintf(stderr, "N=%lld: %s\n", static_cast<long long>(n),
                   std::string(s.message()).c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace
}  // namespace ringattn

int main(int argc, char** argv) { return ringattn::Main(argc, argv); }
