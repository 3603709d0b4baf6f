// The GPU merge of 16-bit partial results against the CPU merge
// (kernels/cpu/merge_with_lse.h) fed the same, widened, partial values: both
// dtypes, even and odd head dims (the paired and the single-value paths),
// batches whose accumulator rows lie apart (a tile inside a longer shard),
// and rows with LSE = -inf on either side; and the strided merge of dilated
// attention (every r-th row of segments some rows apart, some heads of many)
// against the CPU merge of the same strided views, rows outside them
// untouched. Needs a CUDA device; skips with the reason where there is none.

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

// Random 16-bit partial values of `count` elements, and the same widened.
void RandomPartial(DeviceDType dtype, size_t count, std::mt19937& rng,
                   std::vector<uint16_t>& bits, std::vector<float>& widened) {
  std::uniform_real_distribution<float> uniform(-3, 3);
  bits.resize(count);
  widened.resize(count);
  for (size_t i = 0; i < count; ++i) {
    const float x = uniform(rng);
    bits[i] =
        dtype == DeviceDType::kBFloat16 ? FloatToBFloat16(x) : FloatToHalf(x);
    widened[i] = dtype == DeviceDType::kBFloat16 ? BFloat16ToFloat(bits[i])
                                                 : HalfToFloat(bits[i]);
  }
}

// Merges a [batch, seq, heads, dim] partial into accumulators [1, total,
// all_heads, dim]: position t of batch b is row first + b * batch_rows + t *
// stride, heads [head, head + heads); on the GPU and on the CPU.
void CheckStridedMerge(DeviceDType dtype, int64_t total, int64_t all_heads,
                       int64_t dim, int64_t first, int64_t batch,
                       int64_t batch_rows, int64_t seq, int64_t stride,
                       int64_t head, int64_t heads) {
  SCOPED_TRACE(::testing::Message()
               << DeviceDTypeName(dtype) << " dim " << dim << " batch " << batch
               << " seq " << seq << " stride " << stride << " heads [" << head
               << ", " << head + heads << ") of " << all_heads);
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> uniform(-3, 3);
  std::vector<float> o(total * all_heads * dim), lse(total * all_heads);
  for (float& x : o) x = uniform(rng);
  for (size_t r = 0; r < lse.size(); ++r) {
    lse[r] = r % 7 == 0 ? -INFINITY : uniform(rng);
  }
  std::vector<uint16_t> part_bits;
  std::vector<float> part_o;
  RandomPartial(dtype, batch * seq * heads * dim, rng, part_bits, part_o);
  std::vector<float> part_lse(batch * seq * heads);
  for (size_t r = 0; r < part_lse.size(); ++r) {
    part_lse[r] = r % 5 == 0 ? -INFINITY : uniform(rng);
  }
  auto d_o = Upload(o), d_lse = Upload(lse), d_part = Upload(part_bits),
       d_part_lse = Upload(part_lse);
  ASSERT_TRUE(d_o.ok() && d_lse.ok() && d_part.ok() && d_part_lse.ok());
  const int64_t row_values = all_heads * dim;
  AccumulatorRows into;
  into.o = d_o->as<float>() + first * row_values + head * dim;
  into.o_batch_stride = batch_rows * row_values;
  into.o_seq_stride = stride * row_values;
  into.lse = d_lse->as<float>() + first * all_heads + head;
  into.lse_batch_stride = batch_rows * all_heads;
  into.lse_seq_stride = stride * all_heads;
  ASSERT_EQ(LaunchMergePartialStrided(dtype, d_part->as<void>(),
                                      d_part_lse->as<float>(), batch, seq,
                                      heads, dim, into, nullptr),
            cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> gpu_o = Download<float>(*d_o, o.size());
  const std::vector<float> gpu_lse = Download<float>(*d_lse, lse.size());

  const Shape shape{batch, seq, heads, dim};
  const Shape lse_shape{batch, seq, heads, 1};
  MergeWithLse(View<float>(o.data() + first * row_values + head * dim, shape,
                           batch_rows * row_values, stride * row_values),
               View<float>(lse.data() + first * all_heads + head, lse_shape,
                           batch_rows * all_heads, stride * all_heads),
               View<const float>(part_o.data(), shape),
               View<const float>(part_lse.data(), lse_shape));
  for (size_t i = 0; i < o.size(); ++i) {
    ASSERT_NEAR(gpu_o[i], o[i], 1e-5f * (1 + std::fabs(o[i])))
        << "position " << i / row_values << " head " << i % row_values / dim
        << " value " << i % dim;
  }
  for (size_t r = 0; r < lse.size(); ++r) {
    if (std::isinf(lse[r])) {
      ASSERT_EQ(gpu_lse[r], lse[r])
          << "position " << r / all_heads << " head " << r % all_heads;
    } else {
      ASSERT_NEAR(gpu_lse[r], lse[r], 1e-5f * (1 + std::fabs(lse[r])))
          << "position " << r / all_heads << " head " << r % all_heads;
    }
  }
}

TEST(PartialMergeTest, StridedMatchesCpuMergeOfStridedViews) {
  SkipWithoutGpu();
  if (IsSkipped()) return;
  for (const DeviceDType dtype :
       {DeviceDType::kBFloat16, DeviceDType::kFloat16}) {
    // One head of 8, every 4th row of 5 segments of 64 from row 3.
    CheckStridedMerge(dtype, 400, 8, 128, 3, 5, 64, 16, 4, 5, 1);
    // Three heads of 8 (GQA-grouped), every 2nd row, one segment.
    CheckStridedMerge(dtype, 1009, 8, 80, 1, 1, 0, 500, 2, 3, 3);
    // Every head, every row, segments back to back (the contiguous case).
    CheckStridedMerge(dtype, 256, 4, 64, 0, 4, 64, 64, 1, 0, 4);
    // Odd head dim: the single-value path; odd strides.
    CheckStridedMerge(dtype, 300, 3, 7, 2, 3, 97, 13, 7, 1, 2);
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
  // Heads of one position would overlap those of the next.
  AccumulatorRows overlapping;
  overlapping.o_seq_stride = 2 * 8;
  overlapping.lse_seq_stride = 4;
  EXPECT_EQ(LaunchMergePartialStrided(DeviceDType::kBFloat16, nullptr, nullptr,
                                      1, 10, 4, 8, overlapping, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(LaunchScaleAccumulator(nullptr, -1, 0.5f, nullptr),
            cudaErrorInvalidValue);
}

TEST(PartialMergeTest, ScalesAccumulator) {
  SkipWithoutGpu();
  if (IsSkipped()) return;
  std::vector<float> o(1001);
  for (size_t i = 0; i < o.size(); ++i) o[i] = static_cast<float>(i) - 500;
  auto d_o = Upload(o);
  ASSERT_TRUE(d_o.ok());
  ASSERT_EQ(LaunchScaleAccumulator(d_o->as<float>(), 1000, 1.0f / 3, nullptr),
            cudaSuccess);
  const std::vector<float> scaled = Download<float>(*d_o, o.size());
  for (size_t i = 0; i < 1000; ++i) {
    ASSERT_EQ(scaled[i], o[i] * (1.0f / 3)) << "value " << i;
  }
  EXPECT_EQ(scaled[1000], o[1000]) << "a value past count changed";
}

}  // namespace
}  // namespace ringattn
