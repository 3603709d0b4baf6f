#include "worker/gpu_ring_testing.h"

#include <cuda_runtime.h>

#include <cmath>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/dtype.h"
#include "core/status_macros.h"
#include "kernels/cuda/device_buffer.h"

namespace ringattn {

Tensor<float> RoundedRandomTensor(Shape shape, DeviceDType dtype,
                                  uint32_t seed) {
  Tensor<float> t(shape);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& x : t.values()) {
    x = dtype == DeviceDType::kBFloat16
            ? BFloat16ToFloat(FloatToBFloat16(normal(rng)))
            : HalfToFloat(FloatToHalf(normal(rng)));
  }
  return t;
}

Tensor<float> GatherChunks(const Tensor<float>& full,
                           const std::vector<Range>& chunks) {
  Shape shape = full.shape();
  shape.seq = 0;
  for (const Range& c : chunks) shape.seq += c.size();
  Tensor<float> shard(shape);
  int64_t row = 0;
  for (const Range& c : chunks) {
    CopyView(full.view().Slice(c.begin, c.end),
             shard.view().Slice(row, row + c.size()));
    row += c.size();
  }
  return shard;
}

void ScatterChunks(const Tensor<float>& shard, const std::vector<Range>& chunks,
                   Tensor<float>& full) {
  int64_t row = 0;
  for (const Range& c : chunks) {
    CopyView(shard.view().Slice(row, row + c.size()),
             full.view().Slice(c.begin, c.end));
    row += c.size();
  }
}

absl::Status PoisonOutput(const GpuRingExecutor& executor) {
  const Shape q = executor.q_shape();
  const size_t rows = static_cast<size_t>(q.batch * q.seq * q.heads);
  // Every byte 0xff: a float NaN.
  RINGATTN_RETURN_IF_ERROR(CudaStatus(
      cudaMemsetAsync(executor.device_o(), 0xff,
                      rows * static_cast<size_t>(q.dim) * sizeof(float),
                      executor.stream()),
      "poisoning O"));
  return CudaStatus(cudaMemsetAsync(executor.device_lse(), 0xff,
                                    rows * sizeof(float), executor.stream()),
                    "poisoning the LSE");
}

std::string FirstNaN(const Tensor<float>& o, const Tensor<float>& lse) {
  const Shape s = o.shape();
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t i = 0; i < s.seq; ++i) {
      for (int64_t h = 0; h < s.heads; ++h) {
        if (std::isnan(lse.view().At(b, i, h, 0))) {
          return absl::StrCat("LSE of batch ", b, " row ", i, " head ", h);
        }
        for (int64_t d = 0; d < s.dim; ++d) {
          if (std::isnan(o.view().At(b, i, h, d))) {
            return absl::StrCat("O of batch ", b, " row ", i, " head ", h,
                                " value ", d);
          }
        }
      }
    }
  }
  return "";
}

}  // namespace ringattn
