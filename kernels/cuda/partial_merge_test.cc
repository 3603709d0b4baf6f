// The GPU merge of 16-bit partial results against the CPU merge
// (kernels/cpu/merge_with_lse.h) fed the same, widened, partial values: both
// dtypes, even and odd head dims (the paired and the single-value paths),
// batches whose accumulator rows lie apart (a tile inside a longer shard),
// and rows with LSE = -inf on either side. Needs a CUDA device; skips with
// the reason where there is none.

#include "kernels/cuda/partial_merge.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "gtest/gtest.h"
#include "kernels/cpu/merge_with_lse.h"
#include "kernels/cuda/device_buffer.h"

namespace ringattn {
namespace {

void SkipWithoutGpu() {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess || count == 0) {
    GTEST_SKIP() << "no CUDA device here (" << cudaGetErrorName(error)
                 << "); runs on the GPU machine";
  }
}

template <typename T>
absl::StatusOr<DeviceBuffer> Upload(const std::vector<T>& host) {
  absl::StatusOr<DeviceBuffer> buffer =
      DeviceBuffer::Allocate(host.size() * sizeof(T));
  if (!buffer.ok()) return buffer.status();
  absl::Status copied =
      CudaStatus(cudaMemcpy(buffer->as<void>(), host.data(),
                            host.size() * sizeof(T), cudaMemcpyHostToDevice),
                 "upload");
  if (!copied.ok()) return copied;
  return buffer;
}

template <typename T>
std::vector<T> Download(const DeviceBuffer& buffer, size_t count) {
  std::vector<T> host(count);
  EXPECT_EQ(cudaMemcpy(host.data(), buffer.as<void>(), count * sizeof(T),
                       cudaMemcpyDeviceToHost),
            cudaSuccess);
  return host;
}

// Merges a [batch, rows, dim] partial into rows [first, first + rows) of
// accumulators [batch, total, dim], on the GPU and on the CPU.
void CheckMerge(DeviceDType dtype, int64_t batch, int64_t total, int64_t first,
                int64_t rows, int64_t dim) {
  SCOPED_TRACE(::testing::Message() << DeviceDTypeName(dtype) << " batch "
                                    << batch << " dim " << dim);
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> uniform(-3, 3);
  std::vector<float> o(batch * total * dim), lse(batch * total);
  for (float& x : o) x = uniform(rng);
  for (size_t r = 0; r < lse.size(); ++r) {
    lse[r] = r % 7 == 0 ? -INFINITY : uniform(rng);
  }
  std::vector<uint16_t> part_bits(batch * rows * dim);
  std::vector<float> part_o(part_bits.size()), part_lse(batch * rows);
  for (size_t i = 0; i < part_bits.size(); ++i) {
    const float x = uniform(rng);
    part_bits[i] =
        dtype == DeviceDType::kBFloat16 ? FloatToBFloat16(x) : FloatToHalf(x);
    part_o[i] = dtype == DeviceDType::kBFloat16 ? BFloat16ToFloat(part_bits[i])
                                                : HalfToFloat(part_bits[i]);
  }
  for (size_t r = 0; r < part_lse.size(); ++r) {
    part_lse[r] = r % 5 == 0 ? -INFINITY : uniform(rng);
  }
  auto d_o = Upload(o), d_lse = Upload(lse), d_part = Upload(part_bits),
       d_part_lse = Upload(part_lse);
  ASSERT_TRUE(d_o.ok() && d_lse.ok() && d_part.ok() && d_part_lse.ok());
  ASSERT_EQ(
      LaunchMergePartial(dtype, d_part->as<void>(), d_part_lse->as<float>(),
                         batch, rows, dim, d_o->as<float>() + first * dim,
                         d_lse->as<float>() + first, total, nullptr),
      cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> gpu_o = Download<float>(*d_o, o.size());
  const std::vector<float> gpu_lse = Download<float>(*d_lse, lse.size());

  // The CPU merge, one row (a "position" of one head) at a time.
  const Shape o_shape{batch, total, 1, dim};
  const Shape lse_shape{batch, total, 1, 1};
  View<float> cpu_o(o.data(), o_shape);
  View<float> cpu_lse(lse.data(), lse_shape);
  MergeWithLse(cpu_o.Slice(first, first + rows),
               cpu_lse.Slice(first, first + rows),
               View<const float>(part_o.data(), Shape{batch, rows, 1, dim}),
               View<const float>(part_lse.data(), Shape{batch, rows, 1, 1}));
  for (size_t i = 0; i < o.size(); ++i) {
    ASSERT_NEAR(gpu_o[i], o[i], 1e-5f * (1 + std::fabs(o[i]))) << "value " << i;
  }
  for (size_t r = 0; r < lse.size(); ++r) {
    if (std::isinf(lse[r])) {
      ASSERT_EQ(gpu_lse[r], lse[r]) << "row " << r;
    } else {
      ASSERT_NEAR(gpu_lse[r], lse[r], 1e-5f * (1 + std::fabs(lse[r])))
          << "row " << r;
    }
  }
}

TEST(PartialMergeTest, MatchesCpuMerge) {
  SkipWithoutGpu();
  if (IsSkipped()) return;
  for (const DeviceDType dtype :
       {DeviceDType::kBFloat16, DeviceDType::kFloat16}) {
    CheckMerge(dtype, 1, 1000, 0, 1000, 128);
    CheckMerge(dtype, 3, 517, 101, 300, 80);
    CheckMerge(dtype, 2, 64, 5, 33, 7);
  }
}

TEST(PartialMergeTest, ClearsAccumulatorsToTheEmptyResult) {
  SkipWithoutGpu();
  if (IsSkipped()) return;
  std::vector<float> o(1000, 5.0f), lse(77, 5.0f);
  auto d_o = Upload(o), d_lse = Upload(lse);
  ASSERT_TRUE(d_o.ok() && d_lse.ok());
  ASSERT_EQ(LaunchClearAccumulators(d_o->as<float>(), 1000, d_lse->as<float>(),
                                    77, nullptr),
            cudaSuccess);
  for (const float x : Download<float>(*d_o, 1000)) ASSERT_EQ(x, 0.0f);
  for (const float x : Download<float>(*d_lse, 77)) ASSERT_EQ(x, -INFINITY);
}

TEST(PartialMergeTest, RejectsBadSizes) {
  EXPECT_EQ(LaunchMergePartial(DeviceDType::kBFloat16, nullptr, nullptr, 1, 10,
                               8, nullptr, nullptr, 5, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(LaunchClearAccumulators(nullptr, -1, nullptr, 0, nullptr),
            cudaErrorInvalidValue);
}

}  // namespace
}  // namespace ringattn
