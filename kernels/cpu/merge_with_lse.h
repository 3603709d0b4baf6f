#ifndef RINGATTN_KERNELS_CPU_MERGE_WITH_LSE_H_
#define RINGATTN_KERNELS_CPU_MERGE_WITH_LSE_H_

// MergeWithLse: folds a partial attention result (over some keys) into an
// accumulated one (over other keys), exactly, in fp32. Rows whose LSE is -inf
// hold no keys yet and merge without NaN.

#include "core/tensor.h"

namespace ringattn {

// o/lse: [B, n, H, D] / [B, n, H, 1], updated in place to the result over the
// union of both key sets. part_o/part_lse: the same shapes. LSE is natural log.
void MergeWithLse(View<float> o, View<float> lse, View<const float> part_o,
                  View<const float> part_lse);

}  // namespace ringattn

#endif  // RINGATTN_KERNELS_CPU_MERGE_WITH_LSE_H_
