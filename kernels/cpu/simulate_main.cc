// ringattn-simulate: runs one attention request through the ring algorithm with
// p workers simulated in this process, checks it against the float64 reference
// and reports what the ring did. Until the service lands it is what `./dev
// demo` shows.

#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "kernels/cpu/reference_attention.h"
#include "kernels/cpu/ring_simulation.h"

ABSL_FLAG(int64_t, n, 4099, "sequence length (queries and keys)");
ABSL_FLAG(int64_t, workers, 4, "simulated workers");
ABSL_FLAG(int64_t, heads, 8, "query heads");
ABSL_FLAG(int64_t, kv_heads, 2, "key/value heads");
ABSL_FLAG(int64_t, dim, 64, "head dimension");
ABSL_FLAG(bool, causal, true, "causal attention");
ABSL_FLAG(bool, check, true, "compare with the float64 reference");

namespace ringattn {
namespace {

int Main() {
  AttentionSpec spec;
  spec.q_len = spec.kv_len = absl::GetFlag(FLAGS_n);
  spec.q_heads = absl::GetFlag(FLAGS_heads);
  spec.kv_heads = absl::GetFlag(FLAGS_kv_heads);
  spec.head_dim = absl::GetFlag(FLAGS_dim);
  spec.causal = absl::GetFlag(FLAGS_causal);
  if (absl::Status s = spec.Validate(); !s.ok()) {
    std::fprintf(stderr, "bad request: %s\n", s.ToString().c_str());
    return 2;
  }
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> uniform(-1, 1);
  auto random = [&](Shape shape) {
    Tensor<float> t(shape);
    for (float& x : t.values()) x = uniform(rng);
    return t;
  };
  const Tensor<float> q = random({1, spec.q_len, spec.q_heads, spec.head_dim});
  const Tensor<float> k =
      random({1, spec.kv_len, spec.kv_heads, spec.head_dim});
  const Tensor<float> v =
      random({1, spec.kv_len, spec.kv_heads, spec.head_dim});
  const int64_t workers = absl::GetFlag(FLAGS_workers);
  std::printf("attention: N=%ld, Hq=%ld, Hkv=%ld, D=%ld, %s, %ld workers\n",
              spec.q_len, spec.q_heads, spec.kv_heads, spec.head_dim,
              spec.causal ? "causal" : "dense", workers);
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<AttentionOutput> out =
      SimulateRing(spec, q.view(), k.view(), v.view(), workers);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  if (!out.ok()) {
    std::fprintf(stderr, "failed: %s\n", out.status().ToString().c_str());
    return 1;
  }
  const double flops = 4.0 * spec.q_len * spec.kv_len * spec.q_heads *
                       spec.head_dim * (spec.causal ? 0.5 : 1.0);
  std::printf("ring: %ld steps, %ld block transfers, %ld tasks\n",
              out->stats.num_steps, out->stats.num_transfers,
              out->stats.num_tasks);
  std::printf("memory: %ld rows per worker at peak (%ld for one worker)\n",
              out->stats.peak_rows_per_worker,
              2 * spec.q_len + 4 * spec.kv_len);
  std::printf("time: %.3f s (%.1f GFLOP/s)\n", seconds, flops / seconds / 1e9);
  if (absl::GetFlag(FLAGS_check)) {
    Tensor<double> o_ref(q.shape()), lse_ref({1, spec.q_len, spec.q_heads, 1});
    ReferenceAttention(spec, q.view(), k.view(), v.view(), o_ref.view(),
                       lse_ref.view());
    double worst = 0;
    for (size_t i = 0; i < o_ref.values().size(); ++i) {
      worst =
          std::max(worst, std::fabs(out->o.values()[i] - o_ref.values()[i]));
    }
    std::printf("max |O - O_float64_reference| = %.2e (%s)\n", worst,
                worst <= 2e-5 ? "ok" : "TOO LARGE");
    if (worst > 2e-5) return 1;
  }
  return 0;
}

}  // namespace
}  // namespace ringattn

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return ringattn::Main();
}
