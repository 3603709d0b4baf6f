#include "kernels/cuda/attention_test_util.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/attention_spec.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "kernels/cpu/reference_attention.h"
#include "kernels/cuda/partial_merge.h"

namespace ringattn {
namespace {

// Every bit set: a NaN in fp16, bf16 and fp32 alike.
constexpr uint16_t kNaN16 = 0xffff;

uint16_t Narrow(DeviceDType dtype, float x) {
  return dtype == DeviceDType::kBFloat16 ? FloatToBFloat16(x) : FloatToHalf(x);
}

float Widen(DeviceDType dtype, uint16_t bits) {
  return dtype == DeviceDType::kBFloat16 ? BFloat16ToFloat(bits)
                                         : HalfToFloat(bits);
}

// Elements from one row of a padded [B, N, H*D + padding] buffer to the next.
int64_t RowStride(const AttentionCase& c, int64_t heads) {
  return heads * c.head_dim + c.row_padding;
}

// Random values rounded to the case's dtype: `exact` gets what the GPU reads
// (contiguous fp32, for the reference), `device` the padded 16-bit layout.
struct Operand {
  std::vector<float> exact;
  std::vector<uint16_t> device;
};

Operand MakeOperand(const AttentionCase& c, int64_t seq, int64_t heads,
                    std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t width = heads * c.head_dim;
  const int64_t stride = RowStride(c, heads);
  Operand operand;
  operand.exact.resize(static_cast<size_t>(c.batch * seq * width));
  operand.device.assign(static_cast<size_t>(c.batch * seq * stride), kNaN16);
  for (int64_t row = 0; row < c.batch * seq; ++row) {
    for (int64_t i = 0; i < width; ++i) {
      const uint16_t bits = Narrow(c.dtype, normal(rng));
      operand.device[row * stride + i] = bits;
      operand.exact[row * width + i] = Widen(c.dtype, bits);
    }
  }
  return operand;
}

absl::StatusOr<DeviceBuffer> Upload(const std::vector<uint16_t>& host) {
  if (host.empty()) return DeviceBuffer();
  absl::StatusOr<DeviceBuffer> buffer =
      DeviceBuffer::Allocate(host.size() * sizeof(uint16_t));
  if (!buffer.ok()) return buffer;
  absl::Status copied = CudaStatus(
      cudaMemcpy(buffer->as<void>(), host.data(),
                 host.size() * sizeof(uint16_t), cudaMemcpyHostToDevice),
      "uploading an operand");
  if (!copied.ok()) return copied;
  return buffer;
}

template <typename T>
DeviceTensor<T> MakeDeviceTensor(const DeviceBuffer& buffer,
                                 const AttentionCase& c, int64_t seq,
                                 int64_t heads) {
  DeviceTensor<T> tensor;
  tensor.data = buffer.as<void>();
  tensor.seq_stride = RowStride(c, heads);
  tensor.batch_stride = seq * tensor.seq_stride;
  return tensor;
}

// Float64 attention of the pairs `list` shows, from the definitions in
// attention_work_list.h: writes the rows of its tiles into o and lse ([B, Nq,
// Hq, D] and [B, Nq, Hq]) and marks them touched in `untouched`.
void ListReference(const AttentionCase& c, float scale,
                   const HostAttentionWorkList& list,
                   const std::vector<float>& q, const std::vector<float>& k,
                   const std::vector<float>& v, std::vector<double>& o,
                   std::vector<double>& lse, std::vector<bool>& untouched) {
  const int64_t d_count = c.head_dim;
  const int64_t group = c.q_heads / c.kv_heads;
  std::vector<double> weights(static_cast<size_t>(c.kv_len));
  std::vector<int64_t> keys;
  for (const QueryTile& tile : list.tiles) {
    for (int64_t i = std::max<int64_t>(tile.begin, 0);
         i < std::min<int64_t>(tile.end, c.q_len); ++i) {
      keys.clear();
      for (int32_t s = 0; s < tile.span_count; ++s) {
        const KeySpan& span = list.spans[tile.first_span + s];
        for (int64_t j = std::max<int64_t>(span.begin, 0);
             j < std::min<int64_t>(span.end, c.kv_len); ++j) {
          if (!span.causal || j <= i + span.shift) keys.push_back(j);
        }
      }
      for (int64_t b = 0; b < c.batch; ++b) {
        untouched[b * c.q_len + i] = false;
        for (int64_t h = 0; h < c.q_heads; ++h) {
          const int64_t entry = (b * c.q_len + i) * c.q_heads + h;
          const float* qr = &q[entry * d_count];
          double most = -std::numeric_limits<double>::infinity();
          for (size_t n = 0; n < keys.size(); ++n) {
            const float* kr =
                &k[((b * c.kv_len + keys[n]) * c.kv_heads + h / group) *
                   d_count];
            double dot = 0.0;
            for (int64_t d = 0; d < d_count; ++d) {
              dot += static_cast<double>(qr[d]) * kr[d];
            }
            weights[n] = dot * scale;
            most = std::max(most, weights[n]);
          }
          double sum = 0.0;
          for (size_t n = 0; n < keys.size(); ++n) {
            weights[n] = std::exp(weights[n] - most);
            sum += weights[n];
          }
          for (int64_t d = 0; d < d_count; ++d) o[entry * d_count + d] = 0.0;
          lse[entry] = keys.empty() ? -std::numeric_limits<double>::infinity()
                                    : most + std::log(sum);
          for (size_t n = 0; n < keys.size(); ++n) {
            const float* vr =
                &v[((b * c.kv_len + keys[n]) * c.kv_heads + h / group) *
                   d_count];
            for (int64_t d = 0; d < d_count; ++d) {
              o[entry * d_count + d] += weights[n] / sum * vr[d];
            }
          }
        }
      }
    }
  }
}

}  // namespace

void SkipWithoutGpu() {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess || count == 0) {
    GTEST_SKIP() << "no CUDA device here (" << cudaGetErrorName(error)
                 << "); runs on the GPU machine";
  }
}

AttentionCase MakeAttentionCase(std::string name, int64_t batch, int64_t q_len,
                                int64_t kv_len, int64_t q_heads,
                                int64_t kv_heads, int64_t head_dim,
                                bool causal) {
  AttentionCase c;
  c.name = std::move(name);
  c.batch = batch;
  c.q_len = q_len;
  c.kv_len = kv_len;
  c.q_heads = q_heads;
  c.kv_heads = kv_heads;
  c.head_dim = head_dim;
  c.causal = causal;
  return c;
}

std::vector<AttentionCase> InBothDTypes(const std::vector<AttentionCase>& in) {
  std::vector<AttentionCase> out;
  for (DeviceDType dtype : {DeviceDType::kBFloat16, DeviceDType::kFloat16}) {
    for (AttentionCase c : in) {
      c.dtype = dtype;
      out.push_back(std::move(c));
    }
  }
  return out;
}

std::vector<AttentionCase> StandardAttentionCases() {
  std::vector<AttentionCase> cases = {
      MakeAttentionCase("DenseSquare", 2, 257, 257, 4, 4, 64, false),
      MakeAttentionCase("CausalSquare", 2, 257, 257, 4, 4, 128, true),
      MakeAttentionCase("CausalFewerQueriesThanKeys", 2, 7, 1000, 8, 2, 128,
                        true),
      MakeAttentionCase("CausalMoreQueriesThanKeys", 2, 1000, 257, 4, 4, 64,
                        true),
      MakeAttentionCase("CausalOneKeySevenQueries", 1, 7, 1, 2, 2, 64, true),
      MakeAttentionCase("OneQueryOneKey", 1, 1, 1, 2, 1, 64, false),
      MakeAttentionCase("CausalOneQueryManyKeys", 2, 1, 1000, 8, 2, 128, true),
      MakeAttentionCase("NoKeys", 2, 7, 0, 2, 2, 64, false),
      MakeAttentionCase("GroupedQueryDense", 2, 257, 1000, 8, 2, 128, false),
      MakeAttentionCase("MultiQueryCausalMoreQueries", 2, 1000, 257, 8, 1, 64,
                        true),
      MakeAttentionCase("HeadDim80Causal", 2, 257, 257, 4, 2, 80, true),
      MakeAttentionCase("HeadDim256Dense", 1, 257, 1000, 4, 1, 256, false),
      MakeAttentionCase("HeadDim256CausalMoreQueries", 1, 1000, 257, 2, 2, 256,
                        true),
      MakeAttentionCase("LongCausal", 1, 1000, 1000, 2, 2, 128, true),
      MakeAttentionCase("SharpScoresUnitScale", 2, 257, 257, 2, 2, 64, true),
      MakeAttentionCase("StridedSlices", 2, 257, 1000, 4, 2, 64, true),
  };
  for (AttentionCase& c : cases) {
    if (c.name == "SharpScoresUnitScale") c.scale = 1.0f;
    if (c.name == "StridedSlices") c.row_padding = 24;
  }
  return InBothDTypes(cases);
}

std::vector<AttentionCase> UnalignedAttentionCases() {
  std::vector<AttentionCase> cases = {
      MakeAttentionCase("HeadDim100Causal", 2, 257, 257, 4, 2, 100, true),
      MakeAttentionCase("HeadDim36Dense", 1, 257, 1000, 2, 1, 36, false),
      MakeAttentionCase("HeadDim1Causal", 1, 7, 7, 1, 1, 1, true),
      MakeAttentionCase("RowsThreeElementsApart", 2, 257, 257, 2, 1, 64, true),
  };
  cases.back().row_padding = 3;
  return InBothDTypes(cases);
}

std::string AttentionCaseName(
    const ::testing::TestParamInfo<AttentionCase>& info) {
  return absl::StrCat(info.param.name, "_", DeviceDTypeName(info.param.dtype));
}

absl::StatusOr<AttentionProblem> AttentionProblem::Create(
    const AttentionCase& c, uint32_t seed) {
  return Build(c, seed, nullptr);
}

absl::StatusOr<AttentionProblem> AttentionProblem::CreateWithWorkList(
    const AttentionCase& c, uint32_t seed, const HostAttentionWorkList& list) {
  return Build(c, seed, &list);
}

absl::StatusOr<AttentionProblem> AttentionProblem::Build(
    const AttentionCase& c, uint32_t seed, const HostAttentionWorkList* list) {
  AttentionProblem problem;
  problem.case_ = c;
  std::mt19937 rng(seed);
  const Operand q = MakeOperand(c, c.q_len, c.q_heads, rng);
  const Operand k = MakeOperand(c, c.kv_len, c.kv_heads, rng);
  const Operand v = MakeOperand(c, c.kv_len, c.kv_heads, rng);
  const std::vector<uint16_t> o(
      static_cast<size_t>(c.batch * c.q_len * RowStride(c, c.q_heads)), kNaN16);
  for (auto [buffer, host] :
       {std::pair{&problem.q_, &q.device}, std::pair{&problem.k_, &k.device},
        std::pair{&problem.v_, &v.device}, std::pair{&problem.o_, &o}}) {
    absl::StatusOr<DeviceBuffer> uploaded = Upload(*host);
    if (!uploaded.ok()) return uploaded.status();
    *buffer = *std::move(uploaded);
  }
  absl::StatusOr<DeviceBuffer> lse = DeviceBuffer::Allocate(
      static_cast<size_t>(c.batch * c.q_len * c.q_heads) * sizeof(float));
  if (!lse.ok()) return lse.status();
  problem.lse_ = *std::move(lse);

  DeviceAttentionArgs& args = problem.args_;
  args.dtype = c.dtype;
  args.batch = c.batch;
  args.q_len = c.q_len;
  args.kv_len = c.kv_len;
  args.q_heads = c.q_heads;
  args.kv_heads = c.kv_heads;
  args.head_dim = c.head_dim;
  args.q = MakeDeviceTensor<const void>(problem.q_, c, c.q_len, c.q_heads);
  args.k = MakeDeviceTensor<const void>(problem.k_, c, c.kv_len, c.kv_heads);
  args.v = MakeDeviceTensor<const void>(problem.v_, c, c.kv_len, c.kv_heads);
  args.o = MakeDeviceTensor<void>(problem.o_, c, c.q_len, c.q_heads);
  args.lse = problem.lse_.as<float>();
  args.scale = c.scale > 0.0f
                   ? c.scale
                   : 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  args.causal = c.causal;

  const int64_t rows = c.batch * c.q_len * c.q_heads;
  problem.reference_o_.assign(static_cast<size_t>(rows * c.head_dim), 0.0);
  problem.reference_lse_.assign(static_cast<size_t>(rows),
                                -std::numeric_limits<double>::infinity());
  problem.untouched_rows_.assign(static_cast<size_t>(c.batch * c.q_len),
                                 list != nullptr);
  if (list != nullptr) {
    for (auto [buffer, bytes, host] :
         {std::tuple{&problem.tiles_, list->tiles.size() * sizeof(QueryTile),
                     static_cast<const void*>(list->tiles.data())},
          std::tuple{&problem.spans_, list->spans.size() * sizeof(KeySpan),
                     static_cast<const void*>(list->spans.data())}}) {
      if (bytes == 0) continue;
      absl::StatusOr<DeviceBuffer> uploaded = DeviceBuffer::Allocate(bytes);
      if (!uploaded.ok()) return uploaded.status();
      if (absl::Status s = CudaStatus(cudaMemcpy(uploaded->as<void>(), host,
                                                 bytes, cudaMemcpyHostToDevice),
                                      "uploading the work list");
          !s.ok()) {
        return s;
      }
      *buffer = *std::move(uploaded);
    }
    args.work.tiles = problem.tiles_.as<QueryTile>();
    args.work.tile_count = static_cast<int64_t>(list->tiles.size());
    args.work.spans = problem.spans_.as<KeySpan>();
    args.work.span_count = static_cast<int64_t>(list->spans.size());
    ListReference(c, args.scale, *list, q.exact, k.exact, v.exact,
                  problem.reference_o_, problem.reference_lse_,
                  problem.untouched_rows_);
  } else if (c.kv_len > 0) {
    AttentionSpec spec;
    spec.batch = c.batch;
    spec.q_len = c.q_len;
    spec.kv_len = c.kv_len;
    spec.q_heads = c.q_heads;
    spec.kv_heads = c.kv_heads;
    spec.head_dim = c.head_dim;
    spec.scale = args.scale;
    spec.causal = c.causal;
    if (absl::Status valid = spec.Validate(); !valid.ok()) return valid;
    const Shape q_shape{c.batch, c.q_len, c.q_heads, c.head_dim};
    const Shape kv_shape{c.batch, c.kv_len, c.kv_heads, c.head_dim};
    ReferenceAttention(spec, View<const float>(q.exact.data(), q_shape),
                       View<const float>(k.exact.data(), kv_shape),
                       View<const float>(v.exact.data(), kv_shape),
                       View<double>(problem.reference_o_.data(), q_shape),
                       View<double>(problem.reference_lse_.data(),
                                    {c.batch, c.q_len, c.q_heads, 1}));
  }
  return problem;
}

std::vector<KeyPart> TwoKeyParts(const AttentionCase& c) {
  const int64_t split =
      c.causal ? std::max<int64_t>(0, c.kv_len - c.q_len) / 2 : c.kv_len / 3;
  std::vector<KeyPart> parts;
  if (split > 0) parts.push_back({0, split, false});
  if (c.kv_len > split) parts.push_back({split, c.kv_len - split, c.causal});
  return parts;
}

DeviceAttentionArgs ArgsForKeys(const DeviceAttentionArgs& args,
                                const KeyPart& part) {
  DeviceAttentionArgs keys = args;
  const int64_t offset = part.first * args.k.seq_stride * sizeof(uint16_t);
  keys.k.data = static_cast<const char*>(args.k.data) + offset;
  keys.v.data = static_cast<const char*>(args.v.data) + offset;
  keys.kv_len = part.count;
  keys.causal = part.causal;
  return keys;
}

absl::StatusOr<CaseAccumulators> AttentionProblem::EmptyAccumulators() const {
  const AttentionCase& c = case_;
  const int64_t rows = c.batch * c.q_len * c.q_heads;
  CaseAccumulators acc;
  absl::StatusOr<DeviceBuffer> o =
      DeviceBuffer::Allocate(std::max<int64_t>(1, rows * c.head_dim) * 4);
  if (!o.ok()) return o.status();
  absl::StatusOr<DeviceBuffer> lse =
      DeviceBuffer::Allocate(std::max<int64_t>(1, rows) * 4);
  if (!lse.ok()) return lse.status();
  acc.o = *std::move(o);
  acc.lse = *std::move(lse);
  acc.rows.o = acc.o.as<float>();
  acc.rows.o_batch_stride = c.q_len * c.q_heads * c.head_dim;
  acc.rows.o_seq_stride = c.q_heads * c.head_dim;
  acc.rows.lse = acc.lse.as<float>();
  acc.rows.lse_batch_stride = c.q_len * c.q_heads;
  acc.rows.lse_seq_stride = c.q_heads;
  if (absl::Status s =
          CudaStatus(LaunchClearAccumulators(acc.rows.o, rows * c.head_dim,
                                             acc.rows.lse, rows, nullptr),
                     "clearing the accumulators");
      !s.ok()) {
    return s;
  }
  return acc;
}

absl::Status AttentionProblem::FoldKeyParts(const Fold& fold, Start start) {
  absl::StatusOr<CaseAccumulators> acc = EmptyAccumulators();
  if (!acc.ok()) return acc.status();
  AccumulatorRows into = acc->rows;
  const std::vector<KeyPart> parts = TwoKeyParts(case_);
  // Without keys nothing stores into the accumulators: they stay cleared.
  if (start == Start::kFresh && !parts.empty()) {
    // All bits set: NaN in every float, which a fold would carry into O.
    for (const DeviceBuffer* buffer : {&acc->o, &acc->lse}) {
      if (absl::Status s =
              CudaStatus(cudaMemset(buffer->as<void>(), 0xff, buffer->bytes()),
                         "poisoning the accumulators");
          !s.ok()) {
        return s;
      }
    }
    into.fresh = true;
  }
  for (const KeyPart& part : parts) {
    if (absl::Status s = fold(ArgsForKeys(args(), part), into); !s.ok()) {
      return s;
    }
    into.fresh = false;
  }
  if (absl::Status s = PoisonOutputs(); !s.ok()) return s;
  return StoreAccumulators(*acc);
}

absl::Status AttentionProblem::StoreAccumulators(
    const CaseAccumulators& accumulators) {
  const AttentionCase& c = case_;
  const int64_t rows = c.batch * c.q_len;
  const int64_t width = c.q_heads * c.head_dim;
  std::vector<float> acc_o(rows * width);
  std::vector<uint16_t> o(o_.bytes() / sizeof(uint16_t));
  if (absl::Status s = CudaStatus(cudaDeviceSynchronize(), "waiting to store");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CudaStatus(
          cudaMemcpy(acc_o.data(), accumulators.o.as<void>(),
                     acc_o.size() * sizeof(float), cudaMemcpyDeviceToHost),
          "downloading the accumulators' O");
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          CudaStatus(cudaMemcpy(o.data(), o_.as<void>(), o_.bytes(),
                                cudaMemcpyDeviceToHost),
                     "downloading O");
      !s.ok()) {
    return s;
  }
  const int64_t stride = RowStride(c, c.q_heads);
  for (int64_t row = 0; row < rows; ++row) {
    for (int64_t p = 0; p < width; ++p) {
      o[row * stride + p] = Narrow(c.dtype, acc_o[row * width + p]);
    }
  }
  if (absl::Status s =
          CudaStatus(cudaMemcpy(o_.as<void>(), o.data(), o_.bytes(),
                                cudaMemcpyHostToDevice),
                     "storing O");
      !s.ok()) {
    return s;
  }
  return CudaStatus(
      cudaMemcpy(lse_.as<void>(), accumulators.lse.as<void>(),
                 rows * c.q_heads * sizeof(float), cudaMemcpyDeviceToDevice),
      "storing the LSE");
}

absl::Status AttentionProblem::PoisonOutputs() {
  if (absl::Status s = CudaStatus(cudaMemset(o_.as<void>(), 0xff, o_.bytes()),
                                  "poisoning O");
      !s.ok()) {
    return s;
  }
  return CudaStatus(cudaMemset(lse_.as<void>(), 0xff, lse_.bytes()),
                    "poisoning LSE");
}

::testing::AssertionResult AttentionProblem::OutputsMatchReference() const {
  const AttentionCase& c = case_;
  if (cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess) {
    return ::testing::AssertionFailure()
           << "the device reported " << cudaGetErrorName(e) << ": "
           << cudaGetErrorString(e);
  }
  std::vector<uint16_t> o(o_.bytes() / sizeof(uint16_t));
  std::vector<float> lse(lse_.bytes() / sizeof(float));
  if (cudaMemcpy(o.data(), o_.as<void>(), o_.bytes(), cudaMemcpyDeviceToHost) !=
          cudaSuccess ||
      cudaMemcpy(lse.data(), lse_.as<void>(), lse_.bytes(),
                 cudaMemcpyDeviceToHost) != cudaSuccess) {
    return ::testing::AssertionFailure() << "downloading O and LSE failed";
  }
  const double tolerance = c.dtype == DeviceDType::kBFloat16 ? 2e-2 : 5e-3;
  constexpr double kLseTolerance = 1e-2;
  constexpr int kExamples = 5;
  int64_t mismatches = 0;
  double worst = 0.0;
  std::string examples;
  auto mismatch = [&](const std::string& what) {
    if (++mismatches <= kExamples) absl::StrAppend(&examples, "\n  ", what);
  };
  const int64_t stride = RowStride(c, c.q_heads);
  const int64_t width = c.q_heads * c.head_dim;
  for (int64_t b = 0; b < c.batch; ++b) {
    for (int64_t i = 0; i < c.q_len; ++i) {
      const int64_t row = b * c.q_len + i;
      if (untouched_rows_[row]) {
        for (int64_t p = 0; p < stride; ++p) {
          if (o[row * stride + p] != kNaN16) {
            mismatch(absl::StrCat("row ", row,
                                  " is in no tile but O was written at ", p));
          }
        }
        for (int64_t h = 0; h < c.q_heads; ++h) {
          if (!std::isnan(lse[row * c.q_heads + h])) {
            mismatch(absl::StrCat("row ", row, " is in no tile but LSE of ",
                                  "head ", h, " was written"));
          }
        }
        continue;
      }
      for (int64_t h = 0; h < c.q_heads; ++h) {
        const int64_t entry = row * c.q_heads + h;
        const double ref_lse = reference_lse_[entry];
        const bool empty = std::isinf(ref_lse);
        const std::string where =
            absl::StrCat("(b=", b, ", i=", i, ", h=", h, ")");
        if (empty ? lse[entry] != -std::numeric_limits<float>::infinity()
                  : !(std::fabs(lse[entry] - ref_lse) <= kLseTolerance)) {
          mismatch(absl::StrCat("lse", where, " = ", lse[entry], ", reference ",
                                ref_lse));
        }
        for (int64_t d = 0; d < c.head_dim; ++d) {
          const double got =
              Widen(c.dtype, o[row * stride + h * c.head_dim + d]);
          const double ref = reference_o_[entry * c.head_dim + d];
          const double error = std::fabs(got - ref);
          if (!empty) worst = std::max(worst, error / (1 + std::fabs(ref)));
          if (empty ? got != 0.0
                    : !(error <= tolerance * (1 + std::fabs(ref)))) {
            mismatch(absl::StrCat("o", where, "[d=", d, "] = ", got,
                                  ", reference ", ref));
          }
        }
      }
      for (int64_t p = width; p < stride; ++p) {
        if (o[row * stride + p] != kNaN16) {
          mismatch(absl::StrCat("padding of O row ", row, " at ", p,
                                " was overwritten"));
        }
      }
    }
  }
  if (mismatches == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << mismatches << " mismatches (worst relative O error of rows "
         << "that see keys " << worst << ", tolerance " << tolerance
         << "); first ones:" << examples;
}

}  // namespace ringattn
