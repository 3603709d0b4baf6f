// The device conversions bit for bit against core/dtype.h: every 16-bit
// pattern widened, and narrowing of special values (NaN with payloads, inf,
// zeros, subnormals, rounding ties, overflow edges) and millions of random
// fp32 patterns. Needs a CUDA device; skips with the reason where there is
// none.

#include "kernels/cuda/convert.h"

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "gtest/gtest.h"
#include "kernels/cuda/attention_test_util.h"
#include "kernels/cuda/device_buffer.h"

namespace ringattn {
namespace {

float FromBits(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

uint32_t ToBits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

// fp32 patterns that exercise every branch of both narrowings.
std::vector<float> NarrowingInputs() {
  std::vector<uint32_t> bits = {
      0x00000000u, 0x80000000u,  // zeros
      0x7f800000u, 0xff800000u,  // infinities
      0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff812345u,
      0x7fbfffffu, 0x7fffffffu,  // NaNs, quiet and signalling, payloads
      0x00000001u, 0x807fffffu, 0x00400000u,  // fp32 subnormals
      0x477fefffu, 0x477ff000u, 0x477ff001u,  // around fp16 overflow (65520)
      0x477fe000u,                            // 65504, the largest fp16
      0x38800000u, 0x387fffffu, 0x387ff000u,  // fp16 smallest normal edge
      0x33000000u, 0x33000001u, 0x33800000u,  // fp16 subnormal rounding edge
      0x7f7fffffu, 0x7f7f8000u, 0x7f7f7fffu,  // bf16 overflow edge
      0x3f808000u, 0x3f818000u, 0x3f808001u,  // bf16 ties to even
      0x3f801000u, 0x3f803000u, 0x3f801001u,  // fp16 ties to even
  };
  // Every exponent with random mantissas, both signs.
  std::mt19937 rng(11);
  for (uint32_t exponent = 0; exponent < 256; ++exponent) {
    for (int i = 0; i < 64; ++i) {
      const uint32_t sign = (i & 1) ? 0x80000000u : 0;
      bits.push_back(sign | (exponent << 23) | (rng() & 0x007fffffu));
    }
  }
  // Exact ties at every fp16 subnormal position.
  for (uint32_t m = 0; m < 1024; ++m) {
    bits.push_back(ToBits((static_cast<float>(m) + 0.5f) * 5.9604645e-8f));
  }
  // Many random patterns.
  for (int i = 0; i < (1 << 22); ++i) bits.push_back(rng());
  std::vector<float> values;
  values.reserve(bits.size());
  for (uint32_t b : bits) values.push_back(FromBits(b));
  return values;
}

template <typename T>
absl::StatusOr<DeviceBuffer> Upload(const std::vector<T>& host) {
  absl::StatusOr<DeviceBuffer> buffer =
      DeviceBuffer::Allocate(host.size() * sizeof(T));
  if (!buffer.ok()) return buffer;
  if (absl::Status s = CudaStatus(
          cudaMemcpy(buffer->as<void>(), host.data(), host.size() * sizeof(T),
                     cudaMemcpyHostToDevice),
          "upload");
      !s.ok()) {
    return s;
  }
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

class ConvertTest : public ::testing::TestWithParam<DeviceDType> {
 protected:
  uint16_t HostNarrow(float x) const {
    return GetParam() == DeviceDType::kFloat16 ? FloatToHalf(x)
                                               : FloatToBFloat16(x);
  }
  float HostWiden(uint16_t x) const {
    return GetParam() == DeviceDType::kFloat16 ? HalfToFloat(x)
                                               : BFloat16ToFloat(x);
  }
};

TEST_P(ConvertTest, NarrowingMatchesHostBitForBit) {
  SkipWithoutGpu();
  if (IsSkipped()) return;
  const std::vector<float> input = NarrowingInputs();
  absl::StatusOr<DeviceBuffer> src = Upload(input);
  absl::StatusOr<DeviceBuffer> dst =
      DeviceBuffer::Allocate(input.size() * sizeof(uint16_t));
  ASSERT_TRUE(src.ok() && dst.ok());
  ASSERT_EQ(
      LaunchConvertFromFloat(GetParam(), src->as<float>(), dst->as<void>(),
                             static_cast<int64_t>(input.size()), nullptr),
      cudaSuccess);
  const std::vector<uint16_t> got = Download<uint16_t>(*dst, input.size());
  int failures = 0;
  for (size_t i = 0; i < input.size() && failures < 10; ++i) {
    const uint16_t want = HostNarrow(input[i]);
    if (got[i] != want) {
      ++failures;
      ADD_FAILURE() << std::hex << "input bits 0x" << ToBits(input[i])
                    << ": device 0x" << got[i] << ", host 0x" << want;
    }
  }
}

TEST_P(ConvertTest, WideningEvery16BitPatternMatchesHostBitForBit) {
  SkipWithoutGpu();
  if (IsSkipped()) return;
  std::vector<uint16_t> input(1 << 16);
  for (uint32_t i = 0; i < input.size(); ++i)
    input[i] = static_cast<uint16_t>(i);
  absl::StatusOr<DeviceBuffer> src = Upload(input);
  absl::StatusOr<DeviceBuffer> dst =
      DeviceBuffer::Allocate(input.size() * sizeof(float));
  ASSERT_TRUE(src.ok() && dst.ok());
  ASSERT_EQ(LaunchConvertToFloat(GetParam(), src->as<void>(), dst->as<float>(),
                                 static_cast<int64_t>(input.size()), nullptr),
            cudaSuccess);
  const std::vector<float> got = Download<float>(*dst, input.size());
  int failures = 0;
  for (size_t i = 0; i < input.size() && failures < 10; ++i) {
    const uint32_t want = ToBits(HostWiden(input[i]));
    if (ToBits(got[i]) != want) {
      ++failures;
      ADD_FAILURE() << std::hex << "input bits 0x" << input[i] << ": device 0x"
                    << ToBits(got[i]) << ", host 0x" << want;
    }
  }
}

TEST_P(ConvertTest, RejectsNegativeCountsAndIgnoresEmptyOnes) {
  EXPECT_EQ(LaunchConvertFromFloat(GetParam(), nullptr, nullptr, -1, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(LaunchConvertToFloat(GetParam(), nullptr, nullptr, 0, nullptr),
            cudaSuccess);
}

INSTANTIATE_TEST_SUITE_P(BothDTypes, ConvertTest,
                         ::testing::Values(DeviceDType::kBFloat16,
                                           DeviceDType::kFloat16),
                         [](const ::testing::TestParamInfo<DeviceDType>& info) {
                           return std::string(DeviceDTypeName(info.param));
                         });

}  // namespace
}  // namespace ringattn
