// The broadcast-Q executor: p ranks each compute every query against their own
// K/V shard; their partials merged by log-sum-exp must match the float64
// reference (|x - ref| <= 2e-5 * (1 + |ref|)), and rows that see none of a
// rank's keys come back O = 0, LSE = -inf; K and V in the executor's own
// buffers or read where a resident context holds them. With K/V in bf16 the
// reference takes the same bf16 values.

#include "worker/broadcast_executor.h"

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/random_tensor.h"
#include "gtest/gtest.h"
#include "kernels/cpu/merge_with_lse.h"
#include "kernels/cpu/reference_attention.h"
#include "kernels/cpu/run_task.h"
#include "worker/resident_rows_testing.h"

namespace ringattn {
namespace {

constexpr double kTolerance = 2e-5;

// Copies the rows of `chunks` of `from` ([B, N, H, D]) into `to` in order,
// converted to its dtype.
void CopyChunks(const Tensor<float>& from, const std::vector<Range>& chunks,
                TypedView to) {
  const Shape& shape = from.shape();
  const int64_t values = shape.heads * shape.dim;
  int64_t row = 0;
  for (const Range& chunk : chunks) {
    for (int64_t b = 0; b < shape.batch; ++b) {
      ConvertDType(DType::kFloat32, from.view().Row(b, chunk.begin, 0),
                   to.dtype(), to.Row(b, row), chunk.size() * values);
    }
    row += chunk.size();
  }
}

// The values of `t` rounded to bf16.
Tensor<float> RoundedToBFloat16(const Tensor<float>& t) {
  Tensor<float> rounded(t.shape());
  for (size_t i = 0; i < t.values().size(); ++i) {
    rounded.values()[i] = BFloat16ToFloat(FloatToBFloat16(t.values()[i]));
  }
  return rounded;
}

AttentionSpec Spec(int64_t nq, int64_t nk, int64_t kv_heads, bool causal) {
  AttentionSpec spec;
  spec.q_len = nq;
  spec.kv_len = nk;
  spec.q_heads = 8;
  spec.kv_heads = kv_heads;
  spec.head_dim = 80;
  spec.causal = causal;
  return spec;
}

// Runs all `p` ranks and checks their merged output against the reference.
void ExpectMergedMatchesReference(const AttentionSpec& spec, int p,
                                  uint32_t seed, CpuKvHolding holding = {}) {
  const DType kv_dtype = holding.dtype;
  const Shape q_shape{spec.batch, spec.q_len, spec.q_heads, spec.head_dim};
  const Shape kv_shape{spec.batch, spec.kv_len, spec.kv_heads, spec.head_dim};
  const Tensor<float> q = RandomTensor(q_shape, seed);
  Tensor<float> k = RandomTensor(kv_shape, seed + 1);
  Tensor<float> v = RandomTensor(kv_shape, seed + 2);
  if (kv_dtype == DType::kBFloat16) {
    k = RoundedToBFloat16(k);
    v = RoundedToBFloat16(v);
  }
  Tensor<float> o(q_shape);
  Tensor<float> lse(Shape{spec.batch, spec.q_len, spec.q_heads, 1});
  std::fill(lse.values().begin(), lse.values().end(), -INFINITY);
  for (int rank = 0; rank < p; ++rank) {
    absl::StatusOr<std::unique_ptr<BroadcastExecutor>> executor =
        BroadcastExecutor::Create(spec, rank, p, std::nullopt, holding);
    ASSERT_TRUE(executor.ok()) << executor.status();
    BroadcastExecutor& e = **executor;
    CopyView(q.view(), e.q());
    if (holding.resident) {
      ASSERT_TRUE(
          e.UseResidentRows(
               ResidentRowsOf(k, v, e.kv_layout().Chunks(rank), kv_dtype))
              .ok());
    } else {
      ASSERT_EQ(e.k().dtype(), kv_dtype);
      CopyChunks(k, e.kv_layout().Chunks(rank), e.k());
      CopyChunks(v, e.kv_layout().Chunks(rank), e.v());
    }
    absl::StatusOr<RingOutput> part = e.Run(/*cancelled=*/nullptr);
    ASSERT_TRUE(part.ok()) << part.status();
    EXPECT_EQ(part->stats.transfers, 0);
    // Few packed rows run the decode kernel (run_task.h), more the block one.
    const bool decode = spec.q_len * spec.GqaRatio() <= kDecodeMaxPackedRows;
    EXPECT_EQ(part->stats.launches.cpu_decode, decode ? part->stats.tasks : 0);
    EXPECT_EQ(part->stats.launches.cpu_block, decode ? 0 : part->stats.tasks);
    MergeWithLse(o.view(), lse.view(), part->o.floats(), part->lse.view());
  }
  Tensor<double> o_ref(q_shape);
  Tensor<double> lse_ref(Shape{spec.batch, spec.q_len, spec.q_heads, 1});
  ReferenceAttention(spec, q.view(), k.view(), v.view(), o_ref.view(),
                     lse_ref.view());
  for (size_t i = 0; i < o.values().size(); ++i) {
    ASSERT_NEAR(o.values()[i], o_ref.values()[i],
                kTolerance * (1 + std::abs(o_ref.values()[i])))
        << "element " << i;
  }
  for (size_t i = 0; i < lse.values().size(); ++i) {
    if (std::isinf(lse_ref.values()[i])) {
      ASSERT_EQ(lse.values()[i], -INFINITY) << "lse element " << i;
      continue;
    }
    ASSERT_NEAR(lse.values()[i], lse_ref.values()[i],
                kTolerance * (1 + std::abs(lse_ref.values()[i])))
        << "lse element " << i;
  }
}

TEST(BroadcastExecutor, MergedPartialsMatchReference) {
  for (int64_t nq : {1, 3, 17, 300}) {
    for (int64_t kv_heads : {2, 1}) {
      for (bool causal : {true, false}) {
        SCOPED_TRACE("Nq=" + std::to_string(nq) + " Hkv=" +
                     std::to_string(kv_heads) + (causal ? " causal" : ""));
        ExpectMergedMatchesReference(Spec(nq, 307, kv_heads, causal), 3,
                                     static_cast<uint32_t>(nq + kv_heads));
      }
    }
  }
}

TEST(BroadcastExecutor, Bf16KeysAndValuesMatchReference) {
  for (int64_t nq : {1, 3, 17, 300}) {
    SCOPED_TRACE("Nq=" + std::to_string(nq));
    ExpectMergedMatchesReference(Spec(nq, 307, 2, true), 3,
                                 static_cast<uint32_t>(nq),
                                 CpuKvHolding{DType::kBFloat16});
  }
  // One row of 4-to-1 GQA at D=128: the decode kernel reads K in place.
  AttentionSpec decode = Spec(1, 1031, 2, true);
  decode.head_dim = 128;
  ExpectMergedMatchesReference(decode, 2, 5, CpuKvHolding{DType::kBFloat16});
}

// K and V read where a resident context holds them (batches further apart
// than the rows), in fp32 and bf16.
TEST(BroadcastExecutor, ResidentRowsMatchReference) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    for (int64_t nq : {1, 17, 300}) {
      SCOPED_TRACE(std::string(DTypeName(dtype)) + " Nq=" + std::to_string(nq));
      AttentionSpec spec = Spec(nq, 307, 2, true);
      spec.batch = 2;
      ExpectMergedMatchesReference(spec, 3, static_cast<uint32_t>(nq + 7),
                                   CpuKvHolding{dtype, /*resident=*/true});
    }
  }
  AttentionSpec decode = Spec(1, 1031, 2, true);
  decode.head_dim = 128;
  ExpectMergedMatchesReference(decode, 2, 6,
                               CpuKvHolding{DType::kBFloat16, true});
}

TEST(BroadcastExecutor, ResidentRowsMustBeGivenAndFitTheShard) {
  const AttentionSpec spec = Spec(1, 40, 2, true);
  const Tensor<float> k = RandomTensor({1, 40, 2, 80}, 1);
  absl::StatusOr<std::unique_ptr<BroadcastExecutor>> resident =
      BroadcastExecutor::Create(spec, 0, 2, std::nullopt,
                                CpuKvHolding{DType::kFloat32, true});
  ASSERT_TRUE(resident.ok()) << resident.status();
  EXPECT_EQ((*resident)->k().shape().NumElements(), 0);
  EXPECT_EQ(
      (*resident)
          ->UseResidentRows(ResidentRowsOf(k, k, {{0, 3}}, DType::kFloat32))
          .code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*resident)->Run(nullptr).status().code(),
            absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<std::unique_ptr<BroadcastExecutor>> own =
      BroadcastExecutor::Create(spec, 0, 2);
  ASSERT_TRUE(own.ok()) << own.status();
  EXPECT_EQ((*own)
                ->UseResidentRows(ResidentRowsOf(
                    k, k, (*own)->kv_layout().Chunks(0), DType::kFloat32))
                .code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(BroadcastExecutor, BytesNeededCountsTheKvDtype) {
  const AttentionSpec spec = Spec(1, 4096, 2, true);
  const int64_t fp32 = BroadcastExecutor::BytesNeeded(spec, 0, 1);
  const int64_t bf16 = BroadcastExecutor::BytesNeeded(
      spec, 0, 1, nullptr, CpuKvHolding{DType::kBFloat16});
  const int64_t resident = BroadcastExecutor::BytesNeeded(
      spec, 0, 1, nullptr, CpuKvHolding{DType::kFloat32, true});
  // K and V: 2 x 4096 x 2 x 80 values, 2 bytes fewer each in bf16, none of
  // them when read in place.
  EXPECT_EQ(fp32 - bf16, 2 * 4096 * 2 * 80 * 2);
  EXPECT_EQ(fp32 - resident, 2 * 4096 * 2 * 80 * 4);
}

TEST(BroadcastExecutor, MoreWorkersThanKeys) {
  ExpectMergedMatchesReference(Spec(3, 2, 2, true), 4, 9);
}

TEST(BroadcastExecutor, RowsThatSeeNoneOfTheShardAreEmpty) {
  // Causal 6 x 6 over 3 ranks (zigzag): rank 1 holds keys 1 and 4, so query 0
  // sees none of them.
  const AttentionSpec spec = Spec(6, 6, 2, true);
  absl::StatusOr<std::unique_ptr<BroadcastExecutor>> executor =
      BroadcastExecutor::Create(spec, 1, 3);
  ASSERT_TRUE(executor.ok()) << executor.status();
  for (const View<float>& t : {(*executor)->q(), (*executor)->k().floats(),
                               (*executor)->v().floats()}) {
    std::fill(t.data(), t.data() + t.shape().NumElements(), 0.5f);
  }
  absl::StatusOr<RingOutput> part = (*executor)->Run(nullptr);
  ASSERT_TRUE(part.ok()) << part.status();
  for (int64_t h = 0; h < spec.q_heads; ++h) {
    EXPECT_EQ(part->lse.view().At(0, 0, h, 0), -INFINITY);
    for (int64_t d = 0; d < spec.head_dim; ++d) {
      EXPECT_EQ(part->o.floats().At(0, 0, h, d), 0.0f);
    }
    EXPECT_TRUE(std::isfinite(part->lse.view().At(0, 1, h, 0)));
  }
  EXPECT_EQ((*executor)->Run(nullptr).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(BroadcastExecutor, RefusesPatternsItDoesNotRun) {
  AttentionSpec dilated = Spec(16, 16, 2, false);
  dilated.dilated = {DilatedBranch{8, 2}};
  absl::StatusOr<std::unique_ptr<BroadcastExecutor>> executor =
      BroadcastExecutor::Create(dilated, 0, 2);
  EXPECT_EQ(executor.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(executor.status().message().find("dilated"), std::string::npos);
  EXPECT_EQ(
      BroadcastExecutor::Create(Spec(4, 16, 2, false), 2, 2).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BroadcastExecutor::Create(Spec(4, 16, 2, false), 0, 2, std::nullopt,
                                      CpuKvHolding{DType::kFloat16})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ringattn
