#include "core/dtype.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace ringattn {
namespace {

uint32_t Bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

float FromBits(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

float Below(float value) {
  return std::nextafter(value, -std::numeric_limits<float>::infinity());
}

float Above(float value) {
  return std::nextafter(value, std::numeric_limits<float>::infinity());
}

bool IsHalfNaN(uint16_t half) {
  return (half & 0x7c00) == 0x7c00 && (half & 0x03ff) != 0;
}

bool IsBFloat16NaN(uint16_t bfloat16) {
  return (bfloat16 & 0x7f80) == 0x7f80 && (bfloat16 & 0x007f) != 0;
}

constexpr float kInf = std::numeric_limits<float>::infinity();

// The value of fp16 bits, from the format's definition, in double arithmetic.
double HalfValue(uint16_t half) {
  const int exponent = (half >> 10) & 0x1f;
  const int mantissa = half & 0x3ff;
  const double magnitude = exponent == 0
                               ? std::ldexp(mantissa, -24)
                               : std::ldexp(1024 + mantissa, exponent - 25);
  return (half & 0x8000) ? -magnitude : magnitude;
}

// The value of bf16 bits, from the format's definition, in double arithmetic.
double BFloat16Value(uint16_t bfloat16) {
  const int exponent = (bfloat16 >> 7) & 0xff;
  const int mantissa = bfloat16 & 0x7f;
  const double magnitude = exponent == 0
                               ? std::ldexp(mantissa, -133)
                               : std::ldexp(128 + mantissa, exponent - 134);
  return (bfloat16 & 0x8000) ? -magnitude : magnitude;
}

// Rounds finite floats to a 16-bit format independently of the code under test:
// the non-negative finite values of the format, in increasing bit order,
// followed by the value the next bit pattern (infinity) would have with an
// unbounded exponent. IEEE overflow is rounding to that value, so a plain
// nearest search with ties to the even bit pattern is the whole rule.
class ReferenceRounder {
 public:
  // `value_of` gives the double value of finite bits; `infinity_bits` is the
  // format's +infinity pattern and `beyond_max` the value it stands for when
  // rounding.
  ReferenceRounder(double (*value_of)(uint16_t), uint16_t infinity_bits,
                   double beyond_max) {
    for (uint32_t bits = 0; bits < infinity_bits; ++bits) {
      values_.push_back(value_of(static_cast<uint16_t>(bits)));
    }
    values_.push_back(beyond_max);
  }

  uint16_t Round(float value) const {
    const uint16_t sign = std::signbit(value) ? 0x8000 : 0;
    const double magnitude = std::fabs(static_cast<double>(value));
    const auto above =
        std::lower_bound(values_.begin(), values_.end(), magnitude);
    const uint16_t infinity = static_cast<uint16_t>(values_.size() - 1);
    if (above == values_.end()) return sign | infinity;
    const uint16_t hi = static_cast<uint16_t>(above - values_.begin());
    if (*above == magnitude) return sign | hi;
    const uint16_t lo = hi - 1;
    const double to_lo = magnitude - values_[lo];
    const double to_hi = values_[hi] - magnitude;
    if (to_lo < to_hi) return sign | lo;
    if (to_hi < to_lo) return sign | hi;
    return sign | ((lo % 2 == 0) ? lo : hi);
  }

 private:
  std::vector<double> values_;
};

TEST(DTypeTest, SizesAndNames) {
  EXPECT_EQ(DTypeSize(DType::kFloat32), 4);
  EXPECT_EQ(DTypeSize(DType::kFloat16), 2);
  EXPECT_EQ(DTypeSize(DType::kBFloat16), 2);
  EXPECT_STREQ(DTypeName(DType::kFloat32), "fp32");
  EXPECT_STREQ(DTypeName(DType::kFloat16), "fp16");
  EXPECT_STREQ(DTypeName(DType::kBFloat16), "bf16");
}

TEST(HalfTest, ConvertsExactValuesExactly) {
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xc000);
  EXPECT_EQ(FloatToHalf(0.5f), 0x3800);
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(FloatToHalf(1023 * std::ldexp(1.0f, -24)),
            0x03ff);                                      // largest subnormal
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);               // largest finite
  EXPECT_EQ(FloatToHalf(-65504.0f), 0xfbff);
}

TEST(HalfTest, WidensEdgeValuesExactly) {
  EXPECT_EQ(HalfToFloat(0x3c00), 1.0f);
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(HalfToFloat(0x8001), -std::ldexp(1.0f, -24));
  EXPECT_EQ(HalfToFloat(0x03ff), 1023 * std::ldexp(1.0f, -24));
  EXPECT_EQ(HalfToFloat(0x0400), std::ldexp(1.0f, -14));
  EXPECT_EQ(HalfToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(HalfToFloat(0x7c00), kInf);
  EXPECT_EQ(HalfToFloat(0xfc00), -kInf);
}

TEST(HalfTest, HalfRoundsTiesToEven) {
  const float ulp = std::ldexp(1.0f, -10);  // fp16 ulp at 1.0
  // 1 + ulp/2 lies between 0x3c00 (even) and 0x3c01 (odd).
  EXPECT_EQ(FloatToHalf(1.0f + ulp / 2), 0x3c00);
  EXPECT_EQ(FloatToHalf(Below(1.0f + ulp / 2)), 0x3c00);
  EXPECT_EQ(FloatToHalf(Above(1.0f + ulp / 2)), 0x3c01);
  // 1 + 3ulp/2 lies between 0x3c01 (odd) and 0x3c02 (even).
  EXPECT_EQ(FloatToHalf(1.0f + 3 * ulp / 2), 0x3c02);
  EXPECT_EQ(FloatToHalf(Below(1.0f + 3 * ulp / 2)), 0x3c01);
  EXPECT_EQ(FloatToHalf(Above(1.0f + 3 * ulp / 2)), 0x3c02);
  EXPECT_EQ(FloatToHalf(-(1.0f + 3 * ulp / 2)), 0xbc02);
}

TEST(HalfTest, HalfRoundsSubnormalTiesToEven) {
  const float tiny = std::ldexp(1.0f, -24);  // smallest fp16 subnormal
  // Half the smallest subnormal ties between zero (even) and 0x0001.
  EXPECT_EQ(FloatToHalf(tiny / 2), 0x0000);
  EXPECT_EQ(FloatToHalf(-tiny / 2), 0x8000);
  EXPECT_EQ(FloatToHalf(Above(tiny / 2)), 0x0001);
  EXPECT_EQ(FloatToHalf(Below(tiny / 2)), 0x0000);
  // 1.5 tiny: between 0x0001 (odd) and 0x0002 (even).
  EXPECT_EQ(FloatToHalf(1.5f * tiny), 0x0002);
  EXPECT_EQ(FloatToHalf(Below(1.5f * tiny)), 0x0001);
  // 2.5 tiny: between 0x0002 (even) and 0x0003 (odd).
  EXPECT_EQ(FloatToHalf(2.5f * tiny), 0x0002);
  EXPECT_EQ(FloatToHalf(Above(2.5f * tiny)), 0x0003);
  // Between the largest subnormal (odd) and the smallest normal (even).
  EXPECT_EQ(FloatToHalf(1023.5f * tiny), 0x0400);
  EXPECT_EQ(FloatToHalf(Below(1023.5f * tiny)), 0x03ff);
}

TEST(HalfTest, HalfFlushesFloatSubnormalsToSignedZero) {
  EXPECT_EQ(FloatToHalf(FromBits(0x00000001)), 0x0000);
  EXPECT_EQ(FloatToHalf(FromBits(0x007fffff)), 0x0000);
  EXPECT_EQ(FloatToHalf(FromBits(0x80000001)), 0x8000);
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::min()), 0x0000);
}

TEST(HalfTest, HalfOverflowsToInfinityFrom65520) {
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65519.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(Below(65520.0f)), 0x7bff);  // 65519.996
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);
  EXPECT_EQ(FloatToHalf(-65520.0f), 0xfc00);
  EXPECT_EQ(FloatToHalf(65536.0f), 0x7c00);
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::max()), 0x7c00);
  // 65488 ties between 0x7bfe (even) and 0x7bff (odd).
  EXPECT_EQ(FloatToHalf(65488.0f), 0x7bfe);
  EXPECT_EQ(FloatToHalf(Above(65488.0f)), 0x7bff);
}

TEST(HalfTest, HalfKeepsInfinitiesAndSignedZeros) {
  EXPECT_EQ(FloatToHalf(kInf), 0x7c00);
  EXPECT_EQ(FloatToHalf(-kInf), 0xfc00);
  EXPECT_EQ(FloatToHalf(0.0f), 0x0000);
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(Bits(HalfToFloat(0x8000)), 0x80000000u);
  EXPECT_EQ(Bits(HalfToFloat(0x0000)), 0x00000000u);
}

TEST(HalfTest, HalfKeepsNaNQuietWithSign) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const uint16_t half_nan = FloatToHalf(nan);
  EXPECT_TRUE(IsHalfNaN(half_nan));
  EXPECT_NE(half_nan & 0x0200, 0);
  EXPECT_EQ(half_nan & 0x8000, 0);
  const uint16_t negative_nan = FloatToHalf(-nan);
  EXPECT_TRUE(IsHalfNaN(negative_nan));
  EXPECT_NE(negative_nan & 0x8000, 0);
  // A signalling NaN whose payload lies only in bits fp16 drops is still a NaN.
  EXPECT_TRUE(IsHalfNaN(FloatToHalf(FromBits(0x7f800001))));
  EXPECT_TRUE(IsHalfNaN(FloatToHalf(FromBits(0xff800001))));

  EXPECT_TRUE(std::isnan(HalfToFloat(0x7e00)));
  const float widened_signalling = HalfToFloat(0xfc01);
  EXPECT_TRUE(std::isnan(widened_signalling));
  EXPECT_TRUE(std::signbit(widened_signalling));
  EXPECT_NE(Bits(widened_signalling) & 0x00400000u, 0u);
}

TEST(HalfTest, WidensEveryPatternToItsDefinedValue) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const uint16_t half = static_cast<uint16_t>(bits);
    if ((half & 0x7c00) == 0x7c00)
      continue;  // inf and NaN are checked elsewhere
    ASSERT_EQ(static_cast<double>(HalfToFloat(half)), HalfValue(half))
        << std::hex << bits;
  }
}

TEST(HalfTest, EveryPatternRoundTrips) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const uint16_t half = static_cast<uint16_t>(bits);
    const float widened = HalfToFloat(half);
    const uint16_t back = FloatToHalf(widened);
    if (IsHalfNaN(half)) {
      ASSERT_TRUE(std::isnan(widened)) << std::hex << bits;
      ASSERT_TRUE(IsHalfNaN(back)) << std::hex << bits;
      ASSERT_EQ(back & 0x8000, half & 0x8000) << std::hex << bits;
    } else {
      ASSERT_EQ(back, half) << std::hex << bits;
    }
  }
}

TEST(BFloat16Test, ConvertsExactValuesExactly) {
  EXPECT_EQ(FloatToBFloat16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBFloat16(-2.0f), 0xc000);
  EXPECT_EQ(FloatToBFloat16(FromBits(0x00010000)),
            0x0001);  // smallest subnormal
  EXPECT_EQ(FloatToBFloat16(FromBits(0x007f0000)),
            0x007f);  // largest subnormal
  EXPECT_EQ(FloatToBFloat16(std::numeric_limits<float>::min()), 0x0080);
  EXPECT_EQ(FloatToBFloat16(FromBits(0x7f7f0000)), 0x7f7f);  // largest finite
  EXPECT_EQ(Bits(BFloat16ToFloat(0x0001)), 0x00010000u);
  EXPECT_EQ(Bits(BFloat16ToFloat(0x7f7f)), 0x7f7f0000u);
  EXPECT_EQ(BFloat16ToFloat(0x3f80), 1.0f);
  EXPECT_EQ(BFloat16ToFloat(0x7f80), kInf);
  EXPECT_EQ(BFloat16ToFloat(0xff80), -kInf);
}

TEST(BFloat16Test, BFloat16RoundsTiesToEven) {
  // 0x3f808000 ties between 0x3f80 (even) and 0x3f81 (odd).
  EXPECT_EQ(FloatToBFloat16(FromBits(0x3f808000)), 0x3f80);
  EXPECT_EQ(FloatToBFloat16(FromBits(0x3f807fff)), 0x3f80);
  EXPECT_EQ(FloatToBFloat16(FromBits(0x3f808001)), 0x3f81);
  // 0x3f818000 ties between 0x3f81 (odd) and 0x3f82 (even).
  EXPECT_EQ(FloatToBFloat16(FromBits(0x3f818000)), 0x3f82);
  EXPECT_EQ(FloatToBFloat16(FromBits(0x3f817fff)), 0x3f81);
  EXPECT_EQ(FloatToBFloat16(FromBits(0xbf818000)), 0xbf82);
  // Rounding up the largest mantissa carries into the exponent.
  EXPECT_EQ(FloatToBFloat16(FromBits(0x3fffffff)), 0x4000);
}

TEST(BFloat16Test, BFloat16RoundsFloatSubnormalsToNearest) {
  EXPECT_EQ(FloatToBFloat16(FromBits(0x00000001)), 0x0000);
  EXPECT_EQ(FloatToBFloat16(FromBits(0x80000001)), 0x8000);
  EXPECT_EQ(FloatToBFloat16(FromBits(0x00008000)), 0x0000);  // tie, even zero
  EXPECT_EQ(FloatToBFloat16(FromBits(0x00008001)), 0x0001);
  EXPECT_EQ(FloatToBFloat16(FromBits(0x00018000)), 0x0002);  // tie, odd below
  EXPECT_EQ(FloatToBFloat16(FromBits(0x007fffff)), 0x0080);  // up to min normal
  EXPECT_EQ(FloatToBFloat16(FromBits(0x007f7fff)), 0x007f);
}

TEST(BFloat16Test, BFloat16OverflowsToInfinity) {
  EXPECT_EQ(FloatToBFloat16(FromBits(0x7f7f7fff)), 0x7f7f);
  EXPECT_EQ(FloatToBFloat16(FromBits(0x7f7f8000)), 0x7f80);  // tie, odd below
  EXPECT_EQ(FloatToBFloat16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(FloatToBFloat16(-std::numeric_limits<float>::max()), 0xff80);
}

TEST(BFloat16Test, BFloat16KeepsInfinitiesSignedZerosAndNaN) {
  EXPECT_EQ(FloatToBFloat16(kInf), 0x7f80);
  EXPECT_EQ(FloatToBFloat16(-kInf), 0xff80);
  EXPECT_EQ(FloatToBFloat16(0.0f), 0x0000);
  EXPECT_EQ(FloatToBFloat16(-0.0f), 0x8000);
  EXPECT_EQ(Bits(BFloat16ToFloat(0x8000)), 0x80000000u);

  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(IsBFloat16NaN(FloatToBFloat16(nan)));
  EXPECT_NE(FloatToBFloat16(-nan) & 0x8000, 0);
  EXPECT_TRUE(IsBFloat16NaN(FloatToBFloat16(-nan)));
  // Payload only in the dropped bits: rounding must not turn it into infinity.
  const uint16_t from_signalling = FloatToBFloat16(FromBits(0x7f800001));
  EXPECT_TRUE(IsBFloat16NaN(from_signalling));
  EXPECT_NE(from_signalling & 0x0040, 0);
  EXPECT_TRUE(IsBFloat16NaN(FloatToBFloat16(FromBits(0x7fffffff))));
  EXPECT_TRUE(IsBFloat16NaN(FloatToBFloat16(FromBits(0xffffffff))));

  const float widened_signalling = BFloat16ToFloat(0xff81);
  EXPECT_TRUE(std::isnan(widened_signalling));
  EXPECT_TRUE(std::signbit(widened_signalling));
  EXPECT_NE(Bits(widened_signalling) & 0x00400000u, 0u);
}

TEST(BFloat16Test, WidensEveryPatternToItsDefinedValue) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const uint16_t bfloat16 = static_cast<uint16_t>(bits);
    if ((bfloat16 & 0x7f80) == 0x7f80)
      continue;  // inf and NaN checked elsewhere
    ASSERT_EQ(static_cast<double>(BFloat16ToFloat(bfloat16)),
              BFloat16Value(bfloat16))
        << std::hex << bits;
  }
}

TEST(BFloat16Test, EveryPatternRoundTrips) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const uint16_t bfloat16 = static_cast<uint16_t>(bits);
    const float widened = BFloat16ToFloat(bfloat16);
    const uint16_t back = FloatToBFloat16(widened);
    if (IsBFloat16NaN(bfloat16)) {
      ASSERT_TRUE(std::isnan(widened)) << std::hex << bits;
      ASSERT_TRUE(IsBFloat16NaN(back)) << std::hex << bits;
      ASSERT_EQ(back & 0x8000, bfloat16 & 0x8000) << std::hex << bits;
    } else {
      ASSERT_EQ(back, bfloat16) << std::hex << bits;
    }
  }
}

// Random float bit patterns of three kinds: uniform over all 2^32; with the
// exponent limited to fp16's range and its neighbourhood; and the latter with
// the low bits forced to just below, at, or just above a rounding tie of either
// format.
std::vector<float> SampleFloats() {
  std::mt19937 rng(20240607);
  std::uniform_int_distribution<uint32_t> any_bits;
  std::uniform_int_distribution<uint32_t> near_half_exponent(95, 145);
  std::uniform_int_distribution<int> tie_kind(0, 5);
  constexpr int kPerKind = 1 << 20;
  std::vector<float> samples;
  samples.reserve(3 * kPerKind);
  for (int i = 0; i < kPerKind; ++i) samples.push_back(FromBits(any_bits(rng)));
  for (int kind = 0; kind < 2; ++kind) {
    for (int i = 0; i < kPerKind; ++i) {
      uint32_t bits =
          (any_bits(rng) & 0x807fffffu) | (near_half_exponent(rng) << 23);
      if (kind == 1) {
        const int tie = tie_kind(rng);
        const bool for_half = tie < 3;
        const uint32_t low_mask = for_half ? 0x1fffu : 0xffffu;
        const uint32_t midpoint = for_half ? 0x1000u : 0x8000u;
        bits = (bits & ~low_mask) | (midpoint + (tie % 3) - 1);
      }
      samples.push_back(FromBits(bits));
    }
  }
  return samples;
}

TEST(HalfTest, FloatToHalfMatchesDoubleReferenceOnSampledFloats) {
  const ReferenceRounder reference(HalfValue, 0x7c00, 65536.0);
  int64_t checked = 0;
  for (float value : SampleFloats()) {
    const uint16_t half = FloatToHalf(value);
    if (std::isnan(value)) {
      ASSERT_TRUE(IsHalfNaN(half)) << std::hex << Bits(value);
      continue;
    }
    ASSERT_EQ(half, reference.Round(value))
        << std::hex << Bits(value) << " (" << value << ")";
    ++checked;
  }
  EXPECT_GT(checked, 3000000);
}

TEST(BFloat16Test, FloatToBFloat16MatchesDoubleReferenceOnSampledFloats) {
  const ReferenceRounder reference(BFloat16Value, 0x7f80, std::ldexp(1.0, 128));
  int64_t checked = 0;
  for (float value : SampleFloats()) {
    const uint16_t bfloat16 = FloatToBFloat16(value);
    if (std::isnan(value)) {
      ASSERT_TRUE(IsBFloat16NaN(bfloat16)) << std::hex << Bits(value);
      continue;
    }
    ASSERT_EQ(bfloat16, reference.Round(value))
        << std::hex << Bits(value) << " (" << value << ")";
    ++checked;
  }
  EXPECT_GT(checked, 3000000);
}

TEST(DTypeTest, BulkConversionsMatchScalarOnes) {
  const std::vector<float> values = {
      0.0f,  -0.0f, 1.0f,   -1.5f, 3.14159f, 65519.0f,  1e-7f, 1e30f,
      -kInf, kInf,  1e-40f, 2.5f,  -7e4f,    0.333333f, 100.0f};
  const int64_t count = static_cast<int64_t>(values.size());

  std::vector<float> copy(values.size());
  ConvertFromFloat(DType::kFloat32, values.data(), copy.data(), count);
  for (size_t i = 0; i < values.size(); ++i) {
    EXPECT_EQ(Bits(copy[i]), Bits(values[i]));
  }
  std::vector<float> copied_back(values.size());
  ConvertToFloat(DType::kFloat32, copy.data(), copied_back.data(), count);
  for (size_t i = 0; i < values.size(); ++i) {
    EXPECT_EQ(Bits(copied_back[i]), Bits(values[i]));
  }

  std::vector<uint16_t> halves(values.size());
  std::vector<float> from_halves(values.size());
  ConvertFromFloat(DType::kFloat16, values.data(), halves.data(), count);
  ConvertToFloat(DType::kFloat16, halves.data(), from_halves.data(), count);
  for (size_t i = 0; i < values.size(); ++i) {
    EXPECT_EQ(halves[i], FloatToHalf(values[i])) << i;
    EXPECT_EQ(Bits(from_halves[i]), Bits(HalfToFloat(halves[i]))) << i;
  }

  std::vector<uint16_t> bfloat16s(values.size());
  std::vector<float> from_bfloat16s(values.size());
  ConvertFromFloat(DType::kBFloat16, values.data(), bfloat16s.data(), count);
  ConvertToFloat(DType::kBFloat16, bfloat16s.data(), from_bfloat16s.data(),
                 count);
  for (size_t i = 0; i < values.size(); ++i) {
    EXPECT_EQ(bfloat16s[i], FloatToBFloat16(values[i])) << i;
    EXPECT_EQ(Bits(from_bfloat16s[i]), Bits(BFloat16ToFloat(bfloat16s[i])))
        << i;
  }
}

// The bulk loops are vectorized (and cloned for AVX2): over every 16-bit
// pattern and an odd count of random fp32 patterns, NaNs included, they give
// the scalar conversions' bits.
TEST(DTypeTest, VectorizedBulkConversionsMatchScalarOnesOnEveryPattern) {
  std::vector<uint16_t> patterns(65536);
  for (size_t i = 0; i < patterns.size(); ++i) patterns[i] = i;
  std::vector<float> widened(patterns.size());
  for (const DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    ConvertToFloat(dtype, patterns.data(), widened.data(),
                   static_cast<int64_t>(patterns.size()));
    for (size_t i = 0; i < patterns.size(); ++i) {
      const float scalar = dtype == DType::kBFloat16
                               ? BFloat16ToFloat(patterns[i])
                               : HalfToFloat(patterns[i]);
      ASSERT_EQ(Bits(widened[i]), Bits(scalar)) << DTypeName(dtype) << " " << i;
    }
  }
  std::mt19937 rng(7);
  std::vector<float> values(100003);
  for (float& v : values) v = FromBits(static_cast<uint32_t>(rng()));
  values[5] = FromBits(0x7fc00001);  // quiet NaN with a payload
  values[6] = FromBits(0xff800001);  // signalling NaN
  values[7] = kInf;
  values[8] = FromBits(0x3f808000);  // a tie between two bf16 values
  std::vector<uint16_t> narrowed(values.size());
  for (const DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    ConvertFromFloat(dtype, values.data(), narrowed.data(),
                     static_cast<int64_t>(values.size()));
    for (size_t i = 0; i < values.size(); ++i) {
      const uint16_t scalar = dtype == DType::kBFloat16
                                  ? FloatToBFloat16(values[i])
                                  : FloatToHalf(values[i]);
      ASSERT_EQ(narrowed[i], scalar)
          << DTypeName(dtype) << " " << std::hex << Bits(values[i]);
    }
  }
}

TEST(DTypeTest, BulkConversionsAcceptZeroCount) {
  ConvertToFloat(DType::kFloat32, nullptr, nullptr, 0);
  ConvertFromFloat(DType::kFloat16, nullptr, nullptr, 0);
}

TEST(ConvertDTypeTest, HalfToBFloat16GoesThroughFp32PastOneBatch) {
  // 2500 values: more than the 1024 the conversion widens at a time.
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 30.0f);
  std::vector<uint16_t> halves(2500);
  for (uint16_t& h : halves) h = FloatToHalf(normal(rng));
  std::vector<uint16_t> bf16s(halves.size());
  ConvertDType(DType::kFloat16, halves.data(), DType::kBFloat16, bf16s.data(),
               static_cast<int64_t>(halves.size()));
  for (size_t i = 0; i < halves.size(); ++i) {
    ASSERT_EQ(bf16s[i], FloatToBFloat16(HalfToFloat(halves[i]))) << i;
  }
  std::vector<float> widened(halves.size());
  ConvertDType(DType::kFloat16, halves.data(), DType::kFloat32, widened.data(),
               static_cast<int64_t>(halves.size()));
  EXPECT_EQ(widened[2499], HalfToFloat(halves[2499]));
}

}  // namespace
}  // namespace ringattn
