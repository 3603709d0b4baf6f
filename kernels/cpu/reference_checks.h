#ifndef RINGATTN_KERNELS_CPU_REFERENCE_CHECKS_H_
#define RINGATTN_KERNELS_CPU_REFERENCE_CHECKS_H_

// The comparison the fp32 attention tests make with the float64 reference:
// no NaN, |O - O_ref| <= tolerance * (1 + |O_ref|) for every element, the
// same bound for the LSE, and rows that see no key with LSE exactly -inf.
// For tests only (it reports through gtest).

#include "core/tensor.h"

namespace ringattn {

// Adds gtest failures where `o` and `lse` ([B, N, H, D] and [B, N, H, 1])
// break that comparison against `o_ref` and `lse_ref`.
void ExpectCloseToReference(const Tensor<float>& o, const Tensor<float>& lse,
                            const Tensor<double>& o_ref,
                            const Tensor<double>& lse_ref, double tolerance);

}  // namespace ringattn

#endif  // RINGATTN_KERNELS_CPU_REFERENCE_CHECKS_H_
