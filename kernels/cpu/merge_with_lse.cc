#include "kernels/cpu/merge_with_lse.h"

#include <cmath>

namespace ringattn {

void MergeWithLse(View<float> o, View<float> lse, View<const float> part_o,
                  View<const float> part_lse) {
  const Shape& s = o.shape();
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t n = 0; n < s.seq; ++n) {
      for (int64_t h = 0; h < s.heads; ++h) {
        float& acc_lse = lse.At(b, n, h, 0);
        const float new_lse = part_lse.At(b, n, h, 0);
        if (new_lse == -INFINITY) continue;
        float* out = o.Row(b, n, h);
        const float* part = part_o.Row(b, n, h);
        if (acc_lse == -INFINITY) {
          for (int64_t d = 0; d < s.dim; ++d) out[d] = part[d];
          acc_lse = new_lse;
          continue;
        }
        const float max = std::fmax(acc_lse, new_lse);
        const float keep = std::exp(acc_lse - max);
        const float add = std::exp(new_lse - max);
        const float total = keep + add;
        const float keep_weight = keep / total;
        const float add_weight = add / total;
        for (int64_t d = 0; d < s.dim; ++d) {
          out[d] = out[d] * keep_weight + part[d] * add_weight;
        }
        acc_lse = max + std::log(total);
      }
    }
  }
}

}  // namespace ringattn
