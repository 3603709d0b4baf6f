// The GPU merge against the CPU one (itself tested against exact values). Needs
// a CUDA device; skips with the reason where there is none.

#include "kernels/cuda/merge_with_lse.h"

#include <cmath>
#include <random>
#include <vector>

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

absl::StatusOr<DeviceBuffer> Upload(const std::vector<float>& host) {
  absl::StatusOr<DeviceBuffer> buffer =
      DeviceBuffer::Allocate(host.size() * sizeof(float));
  if (!buffer.ok()) return buffer.status();
  absl::Status copied = CudaStatus(
      cudaMemcpy(buffer->as<float>(), host.data(), host.size() * sizeof(float),
                 cudaMemcpyHostToDevice),
      "upload");
  if (!copied.ok()) return copied;
  return buffer;
}

TEST(MergeWithLseCuda, MatchesCpuMergeIncludingEmptyRows) {
  SkipWithoutGpu();
  if (IsSkipped()) return;
  const int64_t rows = 1001, dim = 80;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> uniform(-3, 3);
  std::vector<float> o(rows * dim), part_o(rows * dim), lse(rows),
      part_lse(rows);
  for (float& x : o) x = uniform(rng);
  for (float& x : part_o) x = uniform(rng);
  for (int64_t r = 0; r < rows; ++r) {
    lse[r] = r % 7 == 0 ? -INFINITY : uniform(rng);
    part_lse[r] = r % 5 == 0 ? -INFINITY : uniform(rng);
  }
  auto d_o = Upload(o), d_lse = Upload(lse), d_po = Upload(part_o),
       d_plse = Upload(part_lse);
  ASSERT_TRUE(d_o.ok() && d_lse.ok() && d_po.ok() && d_plse.ok());
  ASSERT_EQ(LaunchMergeWithLse(d_o->as<float>(), d_lse->as<float>(),
                               d_po->as<float>(), d_plse->as<float>(), rows,
                               dim, nullptr),
            cudaSuccess);
  std::vector<float> gpu_o(o.size()), gpu_lse(lse.size());
  ASSERT_EQ(cudaMemcpy(gpu_o.data(), d_o->as<float>(), o.size() * 4,
                       cudaMemcpyDeviceToHost),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(gpu_lse.data(), d_lse->as<float>(), lse.size() * 4,
                       cudaMemcpyDeviceToHost),
            cudaSuccess);
  const Shape shape{1, rows, 1, dim};
  MergeWithLse(View<float>(o.data(), shape),
               View<float>(lse.data(), {1, rows, 1, 1}),
               View<const float>(part_o.data(), shape),
               View<const float>(part_lse.data(), {1, rows, 1, 1}));
  for (int64_t r = 0; r < rows; ++r) {
    if (std::isinf(lse[r])) {
      EXPECT_EQ(gpu_lse[r], lse[r]) << r;
    } else {
      EXPECT_NEAR(gpu_lse[r], lse[r], 1e-5f * (1 + std::fabs(lse[r]))) << r;
    }
  }
  for (size_t i = 0; i < o.size(); ++i) {
    ASSERT_NEAR(gpu_o[i], o[i], 1e-5f * (1 + std::fabs(o[i]))) << i;
  }
}

}  // namespace
}  // namespace ringattn
