// Benchmark of the fast CPU attention kernel (kernels/cpu/block_attention).
// Measures, in one process: the machine's fp32 FMA peak (independent FMAs on
// the widest vectors the CPU has, on all OpenMP threads), the kernel's GFLOP/s
// on dense and causal attention, and a naive float64 triple loop for scale.
// Prints a markdown table: case | GFLOP/s | % of peak.
//
//   bazel run -c opt //bench:cpu_kernel -- --seq=4096 --heads=8

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "core/random_tensor.h"
#include "core/tensor.h"
#include "kernels/cpu/block_attention.h"

ABSL_FLAG(int64_t, seq, 4096,
          "sequence length N (queries = keys) of the kernel cases");
ABSL_FLAG(int64_t, heads, 8, "query heads (= key/value heads)");
ABSL_FLAG(int64_t, batch, 1, "batch size");
ABSL_FLAG(
    int, repetitions, 3,
    "timed runs of each case after one warm-up run; the best is reported");
ABSL_FLAG(int64_t, reference_seq, 1024,
          "sequence length of the float64 reference case (it is slow)");

namespace ringattn {
namespace {

// Wall-clock seconds of one call of `fn`.
double SecondsOf(const std::function<void()>& fn) {
  const auto start = std::chrono::steady_clock::now();
  fn();
  const std::chrono::duration<double> elapsed =
      std::chrono::steady_clock::now() - start;
  return elapsed.count();
}

// The best wall-clock seconds of `repetitions` calls after one warm-up call.
double BestSecondsOf(int repetitions, const std::function<void()>& fn) {
  fn();
  double best = INFINITY;
  for (int i = 0; i < repetitions; ++i) best = std::min(best, SecondsOf(fn));
  return best;
}

// Independent multiply-add chains, enough to hide the FMA latency on two FMA
// ports while all accumulators stay in registers (also on AVX2's 16).
constexpr int kChains = 12;

// Runs kChains chains of kLanes floats for `iterations` steps of
// acc = acc * mul + add. Returns a value that depends on every chain, so
// nothing is optimized away.
template <int kLanes>
[[gnu::always_inline]] inline float MultiplyAddChains(int64_t iterations,
                                                      float mul, float add) {
  float acc[kChains][kLanes];
  for (int i = 0; i < kChains; ++i) {
    for (int j = 0; j < kLanes; ++j) acc[i][j] = static_cast<float>(i + j);
  }
  for (int64_t it = 0; it < iterations; ++it) {
    for (int i = 0; i < kChains; ++i) {
      for (int j = 0; j < kLanes; ++j) acc[i][j] = acc[i][j] * mul + add;
    }
  }
  float sum = 0;
  for (int i = 0; i < kChains; ++i) {
    for (int j = 0; j < kLanes; ++j) sum += acc[i][j];
  }
  return sum;
}

__attribute__((target("avx512f,fma"))) float MultiplyAddChainsAvx512(
    int64_t iterations, float mul, float add) {
  return MultiplyAddChains<16>(iterations, mul, add);
}

__attribute__((target("avx2,fma"))) float MultiplyAddChainsAvx2(
    int64_t iterations, float mul, float add) {
  return MultiplyAddChains<8>(iterations, mul, add);
}

float MultiplyAddChainsBaseline(int64_t iterations, float mul, float add) {
  return MultiplyAddChains<4>(iterations, mul, add);
}

// The fp32 peak: the widest multiply-add loop this CPU runs, on every thread.
struct Peak {
  std::string label;
  double gflops;
};

Peak MeasurePeak() {
  float (*chains)(int64_t, float, float) = &MultiplyAddChainsBaseline;
  int lanes = 4;
  std::string isa = "SSE2 mul+add";
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma")) {
    chains = &MultiplyAddChainsAvx512;
    lanes = 16;
    isa = "AVX-512 FMA";
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    chains = &MultiplyAddChainsAvx2;
    lanes = 8;
    isa = "AVX2 FMA";
  }
  constexpr int64_t kIterations = 20'000'000;
  const int threads = omp_get_max_threads();
  // Volatile operands keep the compiler from folding the chains.
  volatile float mul = 0.999999f;
  volatile float add = 1e-7f;
  const double seconds = BestSecondsOf(5, [&] {
#pragma omp parallel num_threads(threads)
    {
      volatile float sink = chains(kIterations, mul, add);
      (void)sink;
    }
  });
  const double flops = 2.0 * kChains * lanes * kIterations * threads;
  char label[128];
  std::snprintf(label, sizeof(label), "fp32 FMA peak (%s, %d threads)",
                isa.c_str(), threads);
  return {label, flops / seconds * 1e-9};
}

// A tensor of the given shape with values uniform in [-1, 1].
// GFLOP/s of BlockAttention on N x N attention (4 N^2 H D flops, half that
// when causal).
double KernelGflops(int64_t batch, int64_t seq, int64_t heads, int64_t dim,
                    bool causal, int repetitions) {
  std::mt19937 rng(1234);
  const Shape shape{batch, seq, heads, dim};
  const Tensor<float> q = RandomTensor(shape, rng);
  const Tensor<float> k = RandomTensor(shape, rng);
  const Tensor<float> v = RandomTensor(shape, rng);
  Tensor<float> o(shape);
  Tensor<float> lse({batch, seq, heads, 1});
  BlockAttentionArgs args;
  args.q = q.view();
  args.k = k.view();
  args.v = v.view();
  args.scale = 1.0f / std::sqrt(static_cast<float>(dim));
  args.mask.causal = causal;
  const double seconds = BestSecondsOf(
      repetitions, [&] { BlockAttention(args, o.view(), lse.view()); });
  const double flops =
      4.0 * seq * seq * heads * dim * batch * (causal ? 0.5 : 1.0);
  return flops / seconds * 1e-9;
}

// GFLOP/s of a naive float64 triple loop (scores, softmax, P V per query row),
// dense, parallel over (head, query row). Its time grows as N^2, so the GFLOP/s
// measured at a small N carries over to larger ones.
double ReferenceGflops(int64_t seq, int64_t heads, int64_t dim) {
  std::mt19937 rng(1234);
  const Shape shape{1, seq, heads, dim};
  const Tensor<float> q = RandomTensor(shape, rng);
  const Tensor<float> k = RandomTensor(shape, rng);
  const Tensor<float> v = RandomTensor(shape, rng);
  std::vector<double> o(shape.NumElements());
  const double scale = 1.0 / std::sqrt(static_cast<double>(dim));
  const double seconds = SecondsOf([&] {
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < seq; ++i) {
        std::vector<double> scores(seq);
        double max_score = -INFINITY;
        for (int64_t j = 0; j < seq; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < dim; ++d) {
            dot += static_cast<double>(q.view().At(0, i, h, d)) *
                   k.view().At(0, j, h, d);
          }
          scores[j] = dot * scale;
          max_score = std::max(max_score, scores[j]);
        }
        double sum = 0;
        for (int64_t j = 0; j < seq; ++j) {
          scores[j] = std::exp(scores[j] - max_score);
          sum += scores[j];
        }
        double* out = o.data() + (i * heads + h) * dim;
        for (int64_t j = 0; j < seq; ++j) {
          for (int64_t d = 0; d < dim; ++d) {
            out[d] += scores[j] / sum * v.view().At(0, j, h, d);
          }
        }
      }
    }
  });
  volatile double checksum = 0;  // keeps the loop's results alive
  for (double x : o) checksum = checksum + x;
  return 4.0 * seq * seq * heads * dim / seconds * 1e-9;
}

void Run() {
  const int64_t batch = absl::GetFlag(FLAGS_batch);
  const int64_t seq = absl::GetFlag(FLAGS_seq);
  const int64_t heads = absl::GetFlag(FLAGS_heads);
  const int repetitions = absl::GetFlag(FLAGS_repetitions);
  const int64_t reference_seq = absl::GetFlag(FLAGS_reference_seq);

  const Peak peak = MeasurePeak();
  std::printf("| case | GFLOP/s | %% of peak |\n|---|---:|---:|\n");
  auto print_row = [&](const std::string& label, double gflops) {
    std::printf("| %s | %.1f | %.1f%% |\n", label.c_str(), gflops,
                100.0 * gflops / peak.gflops);
    std::fflush(stdout);
  };
  print_row(peak.label, peak.gflops);
  for (int64_t dim : {64, 128}) {
    for (bool causal : {false, true}) {
      char label[128];
      std::snprintf(label, sizeof(label),
                    "BlockAttention fp32 %s, B=%lld N=%lld H=%lld D=%lld",
                    causal ? "causal" : "dense", static_cast<long long>(batch),
                    static_cast<long long>(seq), static_cast<long long>(heads),
                    static_cast<long long>(dim));
      print_row(label,
                KernelGflops(batch, seq, heads, dim, causal, repetitions));
    }
  }
  char label[160];
  std::snprintf(label, sizeof(label),
                "naive float64 triple loop (reference), dense, B=1 N=%lld "
                "H=%lld D=128; its GFLOP/s extrapolates to larger N",
                static_cast<long long>(reference_seq),
                static_cast<long long>(heads));
  print_row(label, ReferenceGflops(reference_seq, heads, 128));
}

}  // namespace
}  // namespace ringattn

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  ringattn::Run();
  return 0;
}
