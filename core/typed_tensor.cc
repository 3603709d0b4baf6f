#include "core/typed_tensor.h"

namespace ringattn {

TypedTensor::TypedTensor(DType dtype, Shape shape)
    : dtype_(dtype), shape_(shape) {
  const size_t bytes =
      static_cast<size_t>(shape.NumElements() * DTypeSize(dtype));
  allocated_ = std::unique_ptr<char[], DeleteInSteps>(new char[bytes],
                                                      DeleteInSteps{bytes});
  data_ = allocated_.get();
}

TypedTensor::TypedTensor(Tensor<float> values)
    : dtype_(DType::kFloat32),
      shape_(values.shape()),
      fp32_(std::move(values.values())),
      data_(reinterpret_cast<char*>(fp32_.data())) {}

void CopyTyped(const TypedView& src, const TypedView& dst) {
  ConvertDType(src.dtype(), src.data(), dst.dtype(), dst.data(),
               src.shape().NumElements());
}

}  // namespace ringattn
