#ifndef RINGATTN_KERNELS_CPU_KV_VIEW_H_
#define RINGATTN_KERNELS_CPU_KV_VIEW_H_

// KvView: keys or values as the CPU kernels read them, in fp32 or in bf16. A
// resident context held in bf16 is read at its own width, which halves the
// bytes a decode step moves; the kernels widen each value as they load it,
// which is exact, so both widths give the same results.

#include <cstdint>
#include <cstring>

#include "core/tensor.h"

namespace ringattn {

// The fp32 value of bf16 bits (the top half of an fp32). Written so that GCC
// vectorizes loops of it.
[[gnu::always_inline]] inline float Widen(uint16_t bfloat16) {
  const uint32_t bits = static_cast<uint32_t>(bfloat16) << 16;
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}
[[gnu::always_inline]] inline float Widen(float value) { return value; }

class KvView {
 public:
  KvView() = default;
  // fp32 rows (implicit, as a View<const float> was what kernels took).
  KvView(View<const float> rows) : f32_(rows) {}  // NOLINT
  KvView(View<float> rows) : f32_(rows) {}        // NOLINT
  // bf16 rows, as bits.
  static KvView BFloat16(View<const uint16_t> rows) {
    KvView view;
    view.bf16_ = rows;
    view.is_bf16_ = true;
    return view;
  }

  bool is_bf16() const { return is_bf16_; }
  const Shape& shape() const { return is_bf16_ ? bf16_.shape() : f32_.shape(); }
  // The rows in their width; each is empty unless the view is of that width.
  const View<const float>& f32() const { return f32_; }
  const View<const uint16_t>& bf16() const { return bf16_; }
  // The rows as `T`, float or uint16_t (bf16), which must be their width.
  template <typename T>
  const View<const T>& As() const;

  // Positions [begin, end) along seq.
  KvView Slice(int64_t begin, int64_t end) const {
    KvView view = *this;
    if (is_bf16_) {
      view.bf16_ = bf16_.Slice(begin, end);
    } else {
      view.f32_ = f32_.Slice(begin, end);
    }
    return view;
  }

 private:
  View<const float> f32_;
  View<const uint16_t> bf16_;
  bool is_bf16_ = false;
};

template <>
inline const View<const float>& KvView::As<float>() const {
  return f32_;
}
template <>
inline const View<const uint16_t>& KvView::As<uint16_t>() const {
  return bf16_;
}

}  // namespace ringattn

#endif  // RINGATTN_KERNELS_CPU_KV_VIEW_H_
