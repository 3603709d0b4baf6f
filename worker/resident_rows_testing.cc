#include "worker/resident_rows_testing.h"

#include <cstdint>
#include <memory>
#include <utility>

#include "core/typed_tensor.h"

namespace ringattn {
namespace {

constexpr int64_t kSpareRows = 5;

}  // namespace

ResidentRows ResidentRowsOf(const Tensor<float>& k, const Tensor<float>& v,
                            const std::vector<Range>& chunks, DType dtype) {
  const Shape& full = k.shape();
  int64_t rows = 0;
  for (const Range& chunk : chunks) rows += chunk.size();
  const Shape shape{full.batch, rows + kSpareRows, full.heads, full.dim};
  auto buffers = std::make_shared<std::pair<TypedTensor, TypedTensor>>(
      TypedTensor(dtype, shape), TypedTensor(dtype, shape));
  const int64_t values = full.heads * full.dim;
  for (const auto& [from, to] : {std::make_pair(&k, &buffers->first),
                                 std::make_pair(&v, &buffers->second)}) {
    int64_t row = 0;
    for (const Range& chunk : chunks) {
      for (int64_t b = 0; b < full.batch; ++b) {
        ConvertDType(DType::kFloat32, from->view().Row(b, chunk.begin, 0),
                     dtype, to->view().Row(b, row), chunk.size() * values);
      }
      row += chunk.size();
    }
  }
  ResidentRows resident;
  resident.k = KvRowsOf(buffers->first.view(), 0, rows);
  resident.v = KvRowsOf(buffers->second.view(), 0, rows);
  resident.keep_alive = std::move(buffers);
  return resident;
}

}  // namespace ringattn
