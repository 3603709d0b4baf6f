// Benchmark of the CPU decode kernel (kernels/cpu/decode_attention) beside the
// block kernel (kernels/cpu/block_attention) on few query rows against a long
// key block: Hq=32, Hkv=8 by default, causal (bottom-right), K and V in fp32
// or bf16 (--kv_dtype), the same random inputs for both kernels. Prints a
// markdown table: Nq | kernel | ms | K/V GB/s (K and V bytes over the time) |
// GFLOP/s (4 Nq Nk Hq D) | speed-up.
//
//   bazel run -c opt //bench:cpu_decode -- --kv_len=65536 --q_lens=1,4,16,64

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "core/dtype.h"
#include "core/random_tensor.h"
#include "core/tensor.h"
#include "kernels/cpu/block_attention.h"
#include "kernels/cpu/decode_attention.h"
#include "kernels/cpu/kv_view.h"

ABSL_FLAG(int64_t, kv_len, 65536, "keys Nk");
ABSL_FLAG(std::vector<std::string>, q_lens,
          (std::vector<std::string>{"1", "4", "16", "64"}), "query rows Nq");
ABSL_FLAG(int64_t, q_heads, 32, "query heads Hq");
ABSL_FLAG(int64_t, kv_heads, 8, "key/value heads Hkv");
ABSL_FLAG(int64_t, dim, 128, "head dim D");
ABSL_FLAG(std::string, kv_dtype, "fp32", "how K and V are held: fp32 or bf16");
ABSL_FLAG(int, repetitions, 5,
          "timed runs of each case after one warm-up run; the best is kept");

namespace ringattn {
namespace {

// The best wall-clock seconds of `repetitions` calls after one warm-up call.
double BestSecondsOf(int repetitions, const std::function<void()>& fn) {
  fn();
  double best = INFINITY;
  for (int i = 0; i < repetitions; ++i) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    const std::chrono::duration<double> elapsed =
        std::chrono::steady_clock::now() - start;
    best = std::min(best, elapsed.count());
  }
  return best;
}

void Run() {
  const int64_t nk = absl::GetFlag(FLAGS_kv_len);
  const int64_t hq = absl::GetFlag(FLAGS_q_heads);
  const int64_t hkv = absl::GetFlag(FLAGS_kv_heads);
  const int64_t dim = absl::GetFlag(FLAGS_dim);
  const int repetitions = absl::GetFlag(FLAGS_repetitions);
  std::mt19937 rng(1234);
  const std::string kv_dtype = absl::GetFlag(FLAGS_kv_dtype);
  if (kv_dtype != "fp32" && kv_dtype != "bf16") {
    std::fprintf(stderr, "--kv_dtype must be fp32 or bf16, got '%s'\n",
                 kv_dtype.c_str());
    std::exit(2);
  }
  const bool bf16 = kv_dtype == "bf16";
  const Tensor<float> k = RandomTensor({1, nk, hkv, dim}, rng);
  const Tensor<float> v = RandomTensor({1, nk, hkv, dim}, rng);
  Tensor<uint16_t> k_bits(k.shape());
  Tensor<uint16_t> v_bits(v.shape());
  if (bf16) {
    for (size_t i = 0; i < k.values().size(); ++i) {
      k_bits.values()[i] = FloatToBFloat16(k.values()[i]);
      v_bits.values()[i] = FloatToBFloat16(v.values()[i]);
    }
  }
  std::printf(
      "K/V %s, B=1, Nk=%lld, Hq=%lld, Hkv=%lld, D=%lld, causal; best of "
      "%d\n\n",
      kv_dtype.c_str(), static_cast<long long>(nk), static_cast<long long>(hq),
      static_cast<long long>(hkv), static_cast<long long>(dim), repetitions);
  std::printf(
      "| Nq | kernel | ms | K/V GB/s | GFLOP/s | speed-up |\n"
      "|---:|---|---:|---:|---:|---:|\n");
  for (const std::string& text : absl::GetFlag(FLAGS_q_lens)) {
    const int64_t nq = std::stoll(text);
    const Tensor<float> q = RandomTensor({1, nq, hq, dim}, rng);
    Tensor<float> o({1, nq, hq, dim});
    Tensor<float> lse({1, nq, hq, 1});
    BlockAttentionArgs args;
    args.q = q.view();
    args.k = k.view();
    args.v = v.view();
    if (bf16) {
      args.k = KvView::BFloat16(k_bits.view());
      args.v = KvView::BFloat16(v_bits.view());
    }
    args.scale = 1.0f / std::sqrt(static_cast<float>(dim));
    args.mask.causal = true;
    args.mask.causal_shift = nk - nq;
    const double block = BestSecondsOf(
        repetitions, [&] { BlockAttention(args, o.view(), lse.view()); });
    const double decode = BestSecondsOf(
        repetitions, [&] { DecodeAttention(args, o.view(), lse.view()); });
    const double bytes = 2.0 * nk * hkv * dim * (bf16 ? 2 : 4);
    const double flops = 4.0 * nq * nk * hq * dim;
    for (const auto& [name, seconds] : {std::pair{"BlockAttention", block},
                                        std::pair{"DecodeAttention", decode}}) {
      std::printf("| %lld | %s | %.2f | %.1f | %.1f | %.2fx |\n",
                  static_cast<long long>(nq), name, seconds * 1e3,
                  bytes / seconds * 1e-9, flops / seconds * 1e-9,
                  block / seconds);
    }
    std::fflush(stdout);
  }
}

}  // namespace
}  // namespace ringattn

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  ringattn::Run();
  return 0;
}
