#ifndef RINGATTN_KERNELS_CPU_MERGE_WITH_LSE_H_
#define RINGATTN_KERNELS_CPU_MERGE_WITH_LSE_H_

// MergeWithLse: folds a partial attention result (over some keys) into an
// accumulated one (over other keys), exactly, in fp32. Rows whose LSE is -inf
// hold no keys yet and merge without NaN.

#include "core/dtype.h"
#include "core/tensor.h"

namespace ringattn {

// o/lse: [B, n, H, D] / [B, n, H, 1], updated in place to the result over the
// union of both key sets. part_o/part_lse: the same shapes. LSE is natural log.
void MergeWithLse(View<float> o, View<float> lse, View<const float> part_o,
                  View<const float> part_lse);

// The same for a partial O of o's shape held as `part_dtype` elements at
// `part_o`, widened one token row at a time as it merges: the same result as
// widening it whole first, without fp32 memory of its size.
void MergeWithLse(View<float> o, View<float> lse, DType part_dtype,
                  const void* part_o, View<const float> part_lse);

}  // namespace ringattn

#endif  // RINGATTN_KERNELS_CPU_MERGE_WITH_LSE_H_
