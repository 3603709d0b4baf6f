#ifndef RINGATTN_BENCH_SERVICE_QUANTILE_H_
#define RINGATTN_BENCH_SERVICE_QUANTILE_H_

// Quantile: one quantile of a benchmark's timings, as the service benchmarks
// report them (p50, p99, max).

#include <algorithm>
#include <cstddef>
#include <vector>

namespace ringattn {

// The `quantile` (0 to 1) of `values`, which must not be empty: the value at
// index quantile * size, at most the last, once sorted (in place).
inline double Quantile(std::vector<double>& values, double quantile) {
  std::sort(values.begin(), values.end());
  return values[std::min(values.size() - 1,
                         static_cast<size_t>(quantile * values.size()))];
}

}  // namespace ringattn

#endif  // RINGATTN_BENCH_SERVICE_QUANTILE_H_
