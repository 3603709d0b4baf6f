#ifndef RINGATTN_BENCH_GPU_RANDOM_INPUTS_H_
#define RINGATTN_BENCH_GPU_RANDOM_INPUTS_H_

// Random bf16 inputs in device memory for the GPU benchmarks: the same values
// for the same seed in every benchmark, drawn on the host by a xorshift
// generator (fast enough for billions of values, unlike <random>).

#include <cstdint>

#include "absl/status/statusor.h"
#include "kernels/cuda/device_buffer.h"

namespace ringattn {

// `count` bf16 values drawn uniformly from [-2, 2), on the current device.
absl::StatusOr<DeviceBuffer> RandomBFloat16(int64_t count, uint64_t seed);

// The same, but only the first `distinct` values are drawn and then repeated
// to fill `count` (for inputs of many gigabytes, whose drawing on the host
// would take longer than the benchmark).
absl::StatusOr<DeviceBuffer> RepeatedRandomBFloat16(int64_t count,
                                                    int64_t distinct,
                                                    uint64_t seed);

}  // namespace ringattn

#endif  // RINGATTN_BENCH_GPU_RANDOM_INPUTS_H_
