// Times the host's dtype conversions (core/dtype.h) that the client and the
// CPU workers run on every request: fp32 to bf16 / fp16 and back, over as many
// values as a 4096-row query of 32 heads of D=128 (16M). Prints GB/s of fp32
// values and ms per call (median of --repeats).
//
//   bazel run -c opt //bench:dtype_convert -- [--values=16777216] [--repeats=9]

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "core/dtype.h"

ABSL_FLAG(int64_t, values, int64_t{4096} * 32 * 128, "values per call");
ABSL_FLAG(int, repeats, 9, "timed calls per case");

namespace ringattn {
namespace {

template <typename Call>
double MedianMilliseconds(int repeats, Call call) {
  std::vector<double> ms;
  for (int i = 0; i < repeats; ++i) {
    const auto begin = std::chrono::steady_clock::now();
    call();
    ms.push_back(std::chrono::duration<double, std::milli>(
                     std::chrono::steady_clock::now() - begin)
                     .count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

int Run() {
  const int64_t n = absl::GetFlag(FLAGS_values);
  const int repeats = std::max(1, absl::GetFlag(FLAGS_repeats));
  std::vector<float> values(n), back(n);
  std::vector<uint16_t> narrow(n);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  for (float& v : values) v = normal(rng);
  std::printf("| conversion | values | ms (median) | GB/s of fp32 |\n");
  std::printf("| --- | --- | --- | --- |\n");
  for (const DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    const double to = MedianMilliseconds(repeats, [&] {
      ConvertFromFloat(dtype, values.data(), narrow.data(), n);
    });
    const double from = MedianMilliseconds(
        repeats, [&] { ConvertToFloat(dtype, narrow.data(), back.data(), n); });
    for (const auto& [name, ms] :
         {std::pair{"fp32 to ", to}, std::pair{"fp32 from ", from}}) {
      std::printf("| %s%s | %lld | %.2f | %.2f |\n", name, DTypeName(dtype),
                  static_cast<long long>(n), ms, 4e-6 * n / ms);
    }
  }
  return 0;
}

}  // namespace
}  // namespace ringattn

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return ringattn::Run();
}
