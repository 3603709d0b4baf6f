#include "worker/gpu_ring_testing.h"

#include <cuda_runtime.h>

#include <cmath>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/dtype.h"
#include "core/status_macros.h"
#include "gtest/gtest.h"
#include "kernels/cpu/reference_attention.h"
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

ReferenceProblem MakeReferenceProblem(const AttentionSpec& spec,
                                      DeviceDType dtype, int64_t sampled_rows) {
  ReferenceProblem p;
  p.spec = spec;
  p.q = RoundedRandomTensor(
      {spec.batch, spec.q_len, spec.q_heads, spec.head_dim}, dtype, 1);
  p.k = RoundedRandomTensor(
      {spec.batch, spec.kv_len, spec.kv_heads, spec.head_dim}, dtype, 2);
  p.v = RoundedRandomTensor(
      {spec.batch, spec.kv_len, spec.kv_heads, spec.head_dim}, dtype, 3);
  p.o_ref = Tensor<double>(p.q.shape());
  p.lse_ref = Tensor<double>({spec.batch, spec.q_len, spec.q_heads, 1});
  if (sampled_rows == 0 || sampled_rows >= spec.q_len) {
    for (int64_t i = 0; i < spec.q_len; ++i) p.rows.push_back(i);
    ReferenceAttention(spec, p.q.view(), p.k.view(), p.v.view(), p.o_ref.view(),
                       p.lse_ref.view());
    return p;
  }
  std::mt19937 rng(4);
  std::uniform_int_distribution<int64_t> any(0, spec.q_len - 1);
  p.rows = {0, spec.q_len - 1};
  while (static_cast<int64_t>(p.rows.size()) < sampled_rows) {
    p.rows.push_back(any(rng));
  }
  ReferenceAttentionRows(spec, p.q.view(), p.k.view(), p.v.view(), p.rows,
                         p.o_ref.view(), p.lse_ref.view());
  return p;
}

void CompareWithReference(const ReferenceProblem& p, const Tensor<float>& o,
                          const Tensor<float>& lse, ReferenceError* error) {
  *error = ReferenceError();
  const AttentionSpec& s = p.spec;
  for (int64_t b = 0; b < s.batch; ++b) {
    for (const int64_t i : p.rows) {
      for (int64_t h = 0; h < s.q_heads; ++h) {
        auto row = [&] {
          return absl::StrCat("batch ", b, " row ", i, " head ", h);
        };
        const double want_lse = p.lse_ref.view().At(b, i, h, 0);
        const float got_lse = lse.view().At(b, i, h, 0);
        if (std::isinf(want_lse)) {
          ASSERT_EQ(got_lse, -INFINITY) << row() << " sees no key";
          for (int64_t d = 0; d < s.head_dim; ++d) {
            ASSERT_EQ(o.view().At(b, i, h, d), 0.0f)
                << row() << " sees no key; O[" << d << "]";
          }
          continue;
        }
        ASSERT_NEAR(got_lse, want_lse, 1e-2 * (1 + std::fabs(want_lse)))
            << "LSE of " << row();
        for (int64_t d = 0; d < s.head_dim; ++d) {
          const double want = p.o_ref.view().At(b, i, h, d);
          const double got = o.view().At(b, i, h, d);
          ASSERT_FALSE(std::isnan(got)) << "O of " << row() << " value " << d;
          const double e = std::fabs(got - want) / (1 + std::fabs(want));
          if (e > error->worst) {
            error->worst = e;
            error->where = absl::StrCat("O of ", row(), " value ", d, ": got ",
                                        got, ", want ", want);
          }
        }
      }
    }
  }
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
