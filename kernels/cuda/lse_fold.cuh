#ifndef RINGATTN_KERNELS_CUDA_LSE_FOLD_CUH_
#define RINGATTN_KERNELS_CUDA_LSE_FOLD_CUH_

// The log-sum-exp fold of one partial attention row into an accumulated one,
// as every GPU merge computes it (kernels/cpu/merge_with_lse.h's semantics):
// O = keep_weight * O_kept + add_weight * O_added, LSE = merged. The caller
// skips a partial row whose LSE is -inf (it changes nothing); an accumulated
// row at -inf (the empty result) takes the partial as it is.

#include <cmath>

namespace ringattn {
namespace device {

struct LseFold {
  float keep_weight;
  float add_weight;
  float merged;
};

// The fold of a partial row of LSE `add` (finite) into one of LSE `kept`.
__device__ __forceinline__ LseFold FoldLse(float kept, float add) {
  if (kept == -INFINITY) return {0.0f, 1.0f, add};
  const float top = fmaxf(kept, add);
  const float keep = expf(kept - top);
  const float more = expf(add - top);
  const float sum = keep + more;
  return {keep / sum, more / sum, top + logf(sum)};
}

}  // namespace device
}  // namespace ringattn

#endif  // RINGATTN_KERNELS_CUDA_LSE_FOLD_CUH_
