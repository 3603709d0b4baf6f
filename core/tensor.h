#ifndef RINGATTN_CORE_TENSOR_H_
#define RINGATTN_CORE_TENSOR_H_

// Views and owning buffers for attention operands laid out as [batch, seq,
// heads, dim]. A view may be strided along batch and seq (a slice of a longer
// sequence); heads and dim are always contiguous. Views do not own memory and
// are cheap to copy; like raw pointers they are safe to share between threads
// as long as writers do not overlap.

#include <algorithm>
#include <cstdint>
#include <vector>

namespace ringattn {

// The extent of a [batch, seq, heads, dim] tensor.
struct Shape {
  int64_t batch = 0;
  int64_t seq = 0;
  int64_t heads = 0;
  int64_t dim = 0;

  int64_t NumElements() const { return batch * seq * heads * dim; }
  friend bool operator==(const Shape& a, const Shape& b) {
    return a.batch == b.batch && a.seq == b.seq && a.heads == b.heads &&
           a.dim == b.dim;
  }
  friend bool operator!=(const Shape& a, const Shape& b) { return !(a == b); }
};

// A non-owning, possibly seq-strided view of a [batch, seq, heads, dim] tensor.
template <typename T>
class View {
 public:
  View() = default;
  // A contiguous tensor of `shape` starting at `data`.
  View(T* data, Shape shape)
      : data_(data),
        shape_(shape),
        seq_stride_(shape.heads * shape.dim),
        batch_stride_(shape.seq * shape.heads * shape.dim) {}
  View(T* data, Shape shape, int64_t batch_stride, int64_t seq_stride)
      : data_(data),
        shape_(shape),
        seq_stride_(seq_stride),
        batch_stride_(batch_stride) {}

  // A read-only view of the same memory.
  operator View<const T>() const {
    return View<const T>(data_, shape_, batch_stride_, seq_stride_);
  }

  const Shape& shape() const { return shape_; }
  T* data() const { return data_; }
  int64_t seq_stride() const { return seq_stride_; }
  int64_t batch_stride() const { return batch_stride_; }

  // The `dim` contiguous values of (b, n, h).
  T* Row(int64_t b, int64_t n, int64_t h) const {
    return data_ + b * batch_stride_ + n * seq_stride_ + h * shape_.dim;
  }
  T& At(int64_t b, int64_t n, int64_t h, int64_t d) const {
    return Row(b, n, h)[d];
  }

  // Positions [begin, end) along seq; requires 0 <= begin <= end <= seq.
  View Slice(int64_t begin, int64_t end) const {
    Shape s = shape_;
    s.seq = end - begin;
    return View(data_ + begin * seq_stride_, s, batch_stride_, seq_stride_);
  }

 private:
  T* data_ = nullptr;
  Shape shape_;
  int64_t seq_stride_ = 0;
  int64_t batch_stride_ = 0;
};

// A contiguous [batch, seq, heads, dim] tensor that owns its memory
// (zero-filled).
template <typename T>
class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(Shape shape)
      : shape_(shape), values_(static_cast<size_t>(shape.NumElements())) {}

  const Shape& shape() const { return shape_; }
  T* data() { return values_.data(); }
  const T* data() const { return values_.data(); }
  std::vector<T>& values() { return values_; }
  const std::vector<T>& values() const { return values_; }

  View<T> view() { return View<T>(values_.data(), shape_); }
  View<const T> view() const { return View<const T>(values_.data(), shape_); }

 private:
  Shape shape_;
  std::vector<T> values_;
};

// Copies `src` into `dst`; the shapes must be equal.
template <typename T>
void CopyView(View<const T> src, View<T> dst) {
  const Shape& s = src.shape();
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t n = 0; n < s.seq; ++n) {
      const T* from = src.Row(b, n, 0);
      T* to = dst.Row(b, n, 0);
      std::copy(from, from + s.heads * s.dim, to);
    }
  }
}

}  // namespace ringattn

#endif  // RINGATTN_CORE_TENSOR_H_
