#include "kernels/cpu/merge_with_lse.h"

#include <cmath>
#include <vector>

namespace ringattn {
namespace {

// Folds one head's row of `dim` fp32 values, `part` with LSE `part_lse`, into
// `out` with LSE `acc_lse`.
void MergeRow(float* out, float& acc_lse, const float* part, float part_lse,
              int64_t dim) {
  if (part_lse == -INFINITY) return;
  if (acc_lse == -INFINITY) {
    for (int64_t d = 0; d < dim; ++d) out[d] = part[d];
    acc_lse = part_lse;
    return;
  }
  const float max = std::fmax(acc_lse, part_lse);
  const float keep = std::exp(acc_lse - max);
  const float add = std::exp(part_lse - max);
  const float total = keep + add;
  const float keep_weight = keep / total;
  const float add_weight = add / total;
  for (int64_t d = 0; d < dim; ++d) {
    out[d] = out[d] * keep_weight + part[d] * add_weight;
  }
  acc_lse = max + std::log(total);
}

}  // namespace

void MergeWithLse(View<float> o, View<float> lse, View<const float> part_o,
                  View<const float> part_lse) {
  const Shape& s = o.shape();
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t n = 0; n < s.seq; ++n) {
      for (int64_t h = 0; h < s.heads; ++h) {
        MergeRow(o.Row(b, n, h), lse.At(b, n, h, 0), part_o.Row(b, n, h),
                 part_lse.At(b, n, h, 0), s.dim);
      }
    }
  }
}

void MergeWithLse(View<float> o, View<float> lse, DType part_dtype,
                  const void* part_o, View<const float> part_lse) {
  const Shape& s = o.shape();
  if (part_dtype == DType::kFloat32) {
    MergeWithLse(o, lse,
                 View<const float>(static_cast<const float*>(part_o), s),
                 part_lse);
    return;
  }
  const int64_t row_values = s.heads * s.dim;
  const int64_t row_bytes = row_values * DTypeSize(part_dtype);
  const char* rows = static_cast<const char*>(part_o);
  std::vector<float> widened(static_cast<size_t>(row_values));
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t n = 0; n < s.seq; ++n) {
      ConvertToFloat(part_dtype, rows + (b * s.seq + n) * row_bytes,
                     widened.data(), row_values);
      for (int64_t h = 0; h < s.heads; ++h) {
        MergeRow(o.Row(b, n, h), lse.At(b, n, h, 0), widened.data() + h * s.dim,
                 part_lse.At(b, n, h, 0), s.dim);
      }
    }
  }
}

}  // namespace ringattn
