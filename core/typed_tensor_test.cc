#include "core/typed_tensor.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <vector>

#include "gtest/gtest.h"

namespace ringattn {
namespace {

TEST(TypedTensorTest, RowsAreContiguousInTheElementType) {
  const Shape shape{2, 3, 4, 5};
  TypedTensor t(DType::kBFloat16, shape);
  const TypedView v = t.view();
  EXPECT_EQ(v.row_bytes(), 4 * 5 * 2);
  EXPECT_EQ(v.bytes(), 2 * 3 * 4 * 5 * 2);
  EXPECT_EQ(v.Row(1, 2) - v.Row(0, 0), (1 * 3 + 2) * 4 * 5 * 2);
}

TEST(TypedTensorTest, AdoptsAnFp32TensorWithoutCopying) {
  Tensor<float> values(Shape{1, 2, 1, 3});
  values.values()[4] = 7.5f;
  const float* storage = values.data();
  TypedTensor t(std::move(values));
  EXPECT_EQ(t.dtype(), DType::kFloat32);
  EXPECT_EQ(t.floats().data(), storage);
  EXPECT_EQ(t.floats().At(0, 1, 0, 1), 7.5f);
}

TEST(TypedTensorTest, LentStorageIsKeptUntilTheLastTensorOnItGoes) {
  std::vector<char> buffer(2 * 3 * 4 * 2 + 100);
  int returned = 0;
  std::shared_ptr<void> owner(buffer.data(),
                              [&returned](void*) { ++returned; });
  std::optional<TypedTensor> moved;
  {
    TypedTensor first(DType::kFloat16, Shape{1, 3, 4, 2}, buffer.data(), owner);
    TypedTensor second(DType::kFloat16, Shape{1, 3, 4, 2}, buffer.data() + 48,
                       owner);
    owner.reset();
    EXPECT_EQ(first.view().data(), buffer.data());
    EXPECT_EQ(second.view().Row(0, 1), buffer.data() + 48 + 4 * 2 * 2);
    moved.emplace(std::move(first));
  }
  // `second` went; the moved `first` still holds the storage.
  EXPECT_EQ(returned, 0);
  EXPECT_EQ(moved->view().data(), buffer.data());
  moved.reset();
  EXPECT_EQ(returned, 1);
}

TEST(TypedTensorTest, CopyTypedNarrowsAndWidensAsTheScalarConversions) {
  const Shape shape{1, 3, 2, 3};
  Tensor<float> source(shape);
  for (size_t i = 0; i < source.values().size(); ++i) {
    source.values()[i] = 0.1f * static_cast<float>(i) - 0.77f;
  }
  TypedTensor half(DType::kFloat16, shape);
  CopyTyped(TypedView(source.view()), half.view());
  TypedTensor bf16(DType::kBFloat16, shape);
  CopyTyped(half.view(), bf16.view());
  const auto* halves = reinterpret_cast<const uint16_t*>(half.view().data());
  const auto* bf16s = reinterpret_cast<const uint16_t*>(bf16.view().data());
  for (size_t i = 0; i < source.values().size(); ++i) {
    EXPECT_EQ(halves[i], FloatToHalf(source.values()[i])) << i;
    EXPECT_EQ(bf16s[i], FloatToBFloat16(HalfToFloat(halves[i]))) << i;
  }
  TypedTensor copy(DType::kFloat16, shape);
  CopyTyped(half.view(), copy.view());
  EXPECT_EQ(std::memcmp(copy.view().data(), half.view().data(),
                        static_cast<size_t>(half.view().bytes())),
            0);
}

}  // namespace
}  // namespace ringattn
