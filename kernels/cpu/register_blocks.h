#ifndef RINGATTN_KERNELS_CPU_REGISTER_BLOCKS_H_
#define RINGATTN_KERNELS_CPU_REGISTER_BLOCKS_H_

// The register-blocked products both CPU attention kernels (block_attention,
// decode_attention) are built from: scores Q·Kᵀ and the update O += P·V for a
// small block of rows whose accumulators stay in registers. Shapes are
// template parameters so that the compiler unrolls and vectorizes them for
// the target of the function they are inlined into.

#include <cstdint>

namespace ringattn {

// s[r][c] = sum_d q[r][d] * kt[d][c] for a kRows x kCols block. s and kt have
// row stride kStride, q has row stride q_stride.
template <int kRows, int kCols, int kStride>
[[gnu::always_inline]] inline void ScoreBlock(const float* q, int64_t q_stride,
                                              const float* kt, int64_t depth,
                                              float* s) {
  float acc[kRows][kCols] = {};
  for (int64_t d = 0; d < depth; ++d) {
    // Gathering the query values first keeps the nest imperfect, so GCC does
    // not interchange it and the accumulators stay in registers across d.
    float a[kRows];
    for (int r = 0; r < kRows; ++r) a[r] = q[r * q_stride + d];
    const float* k = kt + d * kStride;
    for (int r = 0; r < kRows; ++r) {
      for (int c = 0; c < kCols; ++c) acc[r][c] += a[r] * k[c];
    }
  }
  for (int r = 0; r < kRows; ++r) {
    for (int c = 0; c < kCols; ++c) s[r * kStride + c] = acc[r][c];
  }
}

// out[r][j] += sum_c p[r][c] * v[c][j] over `count` keys for a kRows x kCols
// block. p has row stride kStride, v and out have row strides v_stride and
// out_stride.
template <int kRows, int kCols, int kStride>
[[gnu::always_inline]] inline void AccumulateBlock(const float* p,
                                                   const float* v,
                                                   int64_t v_stride,
                                                   int64_t count, float* out,
                                                   int64_t out_stride) {
  float acc[kRows][kCols];
  for (int r = 0; r < kRows; ++r) {
    for (int j = 0; j < kCols; ++j) acc[r][j] = out[r * out_stride + j];
  }
  for (int64_t c = 0; c < count; ++c) {
    const float* v_row = v + c * v_stride;
    for (int r = 0; r < kRows; ++r) {
      const float a = p[r * kStride + c];
      for (int j = 0; j < kCols; ++j) acc[r][j] += a * v_row[j];
    }
  }
  for (int r = 0; r < kRows; ++r) {
    for (int j = 0; j < kCols; ++j) out[r * out_stride + j] = acc[r][j];
  }
}

}  // namespace ringattn

#endif  // RINGATTN_KERNELS_CPU_REGISTER_BLOCKS_H_
