#include "kernels/cpu/reference_checks.h"

#include <algorithm>
#include <cmath>

#include "gtest/gtest.h"

namespace ringattn {

void ExpectCloseToReference(const Tensor<float>& o, const Tensor<float>& lse,
                            const Tensor<double>& o_ref,
                            const Tensor<double>& lse_ref, double tolerance) {
  ASSERT_EQ(o.values().size(), o_ref.values().size());
  ASSERT_EQ(lse.values().size(), lse_ref.values().size());
  double worst = 0;
  for (size_t i = 0; i < o.values().size(); ++i) {
    const double got = o.values()[i];
    const double want = o_ref.values()[i];
    ASSERT_FALSE(std::isnan(got)) << "NaN at " << i;
    worst = std::max(worst, std::fabs(got - want) / (1 + std::fabs(want)));
  }
  EXPECT_LE(worst, tolerance);
  for (size_t i = 0; i < lse.values().size(); ++i) {
    const double want = lse_ref.values()[i];
    if (std::isinf(want)) {
      ASSERT_EQ(lse.values()[i], -INFINITY) << "row " << i << " sees no key";
      continue;
    }
    ASSERT_NEAR(lse.values()[i], want, tolerance * (1 + std::fabs(want)))
        << "lse row " << i;
  }
}

}  // namespace ringattn
