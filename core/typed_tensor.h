#ifndef RINGATTN_CORE_TYPED_TENSOR_H_
#define RINGATTN_CORE_TYPED_TENSOR_H_

// Contiguous [batch, seq, heads, dim] tensors whose element type (fp32, fp16
// or bf16) is chosen at run time. Shards are staged in the dtype they travel
// or compute in, so a 16-bit request is never widened to fp32 on its way to a
// GPU and back. Like View and Tensor: views do not own memory; a tensor does.

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/large_buffers.h"
#include "core/tensor.h"

namespace ringattn {

class TypedView {
 public:
  TypedView() = default;
  TypedView(DType dtype, void* data, Shape shape)
      : dtype_(dtype), data_(static_cast<char*>(data)), shape_(shape) {}
  // A contiguous fp32 view.
  explicit TypedView(View<float> view)
      : TypedView(DType::kFloat32, view.data(), view.shape()) {}

  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  char* data() const { return data_; }
  int64_t row_bytes() const {
    return shape_.heads * shape_.dim * DTypeSize(dtype_);
  }
  int64_t bytes() const { return shape_.batch * shape_.seq * row_bytes(); }
  // The values as fp32; requires dtype() == kFloat32.
  View<float> floats() const {
    return View<float>(reinterpret_cast<float*>(data_), shape_);
  }
  // The heads * dim values of token row (b, n).
  char* Row(int64_t b, int64_t n) const {
    return data_ + (b * shape_.seq + n) * row_bytes();
  }

 private:
  DType dtype_ = DType::kFloat32;
  char* data_ = nullptr;
  Shape shape_;
};

class TypedTensor {
 public:
  TypedTensor() = default;
  // A tensor of `shape` in `dtype`. Its values are uninitialized: a shard is
  // filled row by row, every row checked in.
  TypedTensor(DType dtype, Shape shape);
  // Takes over an fp32 tensor's memory.
  explicit TypedTensor(Tensor<float> values);
  // A tensor of `shape` in `dtype` in memory it did not allocate: `data`, of
  // at least that many bytes, which `owner` keeps until the tensor goes (a
  // lent page-locked buffer, say). Uninitialized, as above.
  TypedTensor(DType dtype, Shape shape, char* data, std::shared_ptr<void> owner)
      : dtype_(dtype), shape_(shape), lent_(std::move(owner)), data_(data) {}

  TypedTensor(TypedTensor&&) = default;
  TypedTensor& operator=(TypedTensor&&) = default;

  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  TypedView view() const { return TypedView(dtype_, data_, shape_); }
  // The values as fp32; requires dtype() == kFloat32.
  View<float> floats() const { return view().floats(); }

  // Holds `guard` until the storage is freed and drops it just before (a page
  // lock on the storage, say). Requires storage allocated by the tensor.
  void ReleaseBeforeFree(std::shared_ptr<void> guard) {
    allocated_.get_deleter().release_first = std::move(guard);
  }

 private:
  DType dtype_ = DType::kFloat32;
  Shape shape_;
  std::vector<float> fp32_;  // storage of an adopted fp32 tensor
  std::unique_ptr<char[], DeleteInSteps> allocated_;  // storage it allocated
  std::shared_ptr<void> lent_;  // keeps storage it was lent
  char* data_ = nullptr;
};

// Copies the rows of `src` into `dst`, converting the element type as
// ConvertDType does. The shapes must be equal.
void CopyTyped(const TypedView& src, const TypedView& dst);

}  // namespace ringattn

#endif  // RINGATTN_CORE_TYPED_TENSOR_H_
