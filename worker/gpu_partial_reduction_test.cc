// Broadcast-Q's tree on the device, two ranks over NCCL with one thread and
// GPU each: each rank computes its partial with a broadcast GpuRingExecutor
// (bf16, GQA, causal continuation), the partials reduce on the devices
// (DevicePartials, the GPU merge kernel), and rank 0's fp32 result must match
// the host merge of the two downloaded partials to 1e-5 * (1 + |x|), its
// bf16 output (DownloadOutput) that merge rounded to bf16, and the float64
// reference to bf16 accuracy, 2e-2 * (1 + |ref|). A peer that leaves mid-tree
// fails its parent within the step timeout.

#include "worker/gpu_partial_reduction.h"

#include <cmath>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/dtype.h"
#include "core/random_tensor.h"
#include "core/status_macros.h"
#include "gtest/gtest.h"
#include "kernels/cpu/merge_with_lse.h"
#include "kernels/cpu/reference_attention.h"
#include "worker/device.h"
#include "worker/gpu_ring_executor.h"
#include "worker/gpu_test_skip.h"
#include "worker/nccl_communicator.h"
#include "worker/partial_reduction.h"
#include "worker/solo_communicator.h"

namespace ringattn {
namespace {

constexpr double kMergeTolerance = 1e-5;
constexpr double kBf16Tolerance = 2e-2;

AttentionSpec ContinuationSpec(int64_t nq) {
  AttentionSpec spec;
  spec.q_len = nq;
  spec.kv_len = nq + 4099;
  spec.q_heads = 8;
  spec.kv_heads = 2;
  spec.head_dim = 128;
  spec.causal = true;
  return spec;
}

struct RankResult {
  absl::Status status;
  Tensor<float> partial_o, partial_lse;  // before the tree
  Tensor<float> o, lse;                  // after it (rank 0)
  TypedTensor narrowed;                  // DownloadOutput(bf16) (rank 0)
  ReductionStats stats;
  absl::Duration elapsed;
};

// Rank `rank` of 2: computes its partial on GPU `rank`, then (unless
// `leave`) reduces it over NCCL.
absl::Status RunRank(const AttentionSpec& spec, const Tensor<float>& q,
                     const Tensor<float>& k, const Tensor<float>& v, int rank,
                     const ncclUniqueId& id, bool leave,
                     const RingOptions& options, RankResult& result) {
  GpuRingConfig config;
  config.device = rank;
  config.host_staging = true;
  absl::StatusOr<std::unique_ptr<GpuRingExecutor>> executor =
      GpuRingExecutor::CreateBroadcast(spec, rank, 2, config);
  if (!executor.ok()) return executor.status();
  GpuRingExecutor& e = **executor;
  Tensor<float> k_shard(e.kv_shape());
  Tensor<float> v_shard(e.kv_shape());
  int64_t row = 0;
  for (const Range& chunk : e.kv_layout().Chunks(0)) {
    CopyView(k.view().Slice(chunk.begin, chunk.end),
             k_shard.view().Slice(row, row + chunk.size()));
    CopyView(v.view().Slice(chunk.begin, chunk.end),
             v_shard.view().Slice(row, row + chunk.size()));
    row += chunk.size();
  }
  RINGATTN_RETURN_IF_ERROR(e.Upload(q.view(), k_shard.view(), v_shard.view()));
  SoloCommunicator solo;
  absl::StatusOr<GpuRingStats> ran = e.Run(solo, options);
  if (!ran.ok()) return ran.status();
  const Shape shape = e.q_shape();
  Shape lse_shape = shape;
  lse_shape.dim = 1;
  result.partial_o = Tensor<float>(shape);
  result.partial_lse = Tensor<float>(lse_shape);
  RINGATTN_RETURN_IF_ERROR(
      e.Download(result.partial_o.view(), result.partial_lse.view()));

  absl::StatusOr<std::unique_ptr<NcclCommunicator>> communicator =
      NcclCommunicator::Create(id, rank, 2, rank, absl::Seconds(60));
  if (!communicator.ok()) return communicator.status();
  if (leave) return absl::OkStatus();
  absl::StatusOr<std::unique_ptr<DevicePartials>> partials =
      DevicePartials::Create(rank, e.device_o(), e.device_lse(),
                             shape.batch * shape.seq * shape.heads, shape.dim,
                             e.stream());
  if (!partials.ok()) return partials.status();
  const absl::Time start = absl::Now();
  absl::StatusOr<ReductionStats> reduced =
      ReduceToRankZero(**communicator, **partials, options);
  result.elapsed = absl::Now() - start;
  if (!reduced.ok()) return reduced.status();
  result.stats = *reduced;
  if (rank != 0) return absl::OkStatus();
  result.o = Tensor<float>(shape);
  result.lse = Tensor<float>(lse_shape);
  RINGATTN_RETURN_IF_ERROR(e.Download(result.o.view(), result.lse.view()));
  absl::StatusOr<RingOutput> narrowed = e.DownloadOutput(DType::kBFloat16);
  if (!narrowed.ok()) return narrowed.status();
  result.narrowed = std::move(narrowed->o);
  return absl::OkStatus();
}

std::vector<RankResult> RunTwoRanks(const AttentionSpec& spec,
                                    const Tensor<float>& q,
                                    const Tensor<float>& k,
                                    const Tensor<float>& v, int leaving_rank,
                                    const RingOptions& options) {
  std::vector<RankResult> results(2);
  const absl::StatusOr<ncclUniqueId> id = NewNcclUniqueId();
  if (!id.ok()) {
    for (RankResult& r : results) r.status = id.status();
    return results;
  }
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      results[rank].status =
          RunRank(spec, q, k, v, rank, *id, rank == leaving_rank, options,
                  results[rank]);
    });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

class DeviceTreeTest : public ::testing::TestWithParam<int64_t> {};

TEST_P(DeviceTreeTest, TwoGpuTreeMatchesHostMergeAndReference) {
  SKIP_WITHOUT_GPUS(2);
  const AttentionSpec spec = ContinuationSpec(GetParam());
  const uint32_t seed = std::random_device()();
  SCOPED_TRACE(absl::StrCat("Nq = ", spec.q_len, ", seed = ", seed));
  const Shape q_shape{1, spec.q_len, spec.q_heads, spec.head_dim};
  const Shape kv_shape{1, spec.kv_len, spec.kv_heads, spec.head_dim};
  const Tensor<float> q = RandomTensor(q_shape, seed);
  const Tensor<float> k = RandomTensor(kv_shape, seed + 1);
  const Tensor<float> v = RandomTensor(kv_shape, seed + 2);
  RingOptions options;
  options.step_timeout = absl::Seconds(60);
  const std::vector<RankResult> results =
      RunTwoRanks(spec, q, k, v, /*leaving_rank=*/-1, options);
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(results[rank].status.ok())
        << "rank " << rank << ": " << results[rank].status;
  }
  EXPECT_EQ(results[0].stats.rounds, 1);
  EXPECT_EQ(results[1].stats.transfers, 1);

  // The host merge of both partials, as the coordinator computes it.
  Tensor<float> o = Tensor<float>(q_shape);
  Tensor<float> lse(Shape{1, spec.q_len, spec.q_heads, 1});
  std::fill(lse.values().begin(), lse.values().end(), -INFINITY);
  for (const RankResult& r : results) {
    MergeWithLse(o.view(), lse.view(), r.partial_o.view(),
                 r.partial_lse.view());
  }
  const RankResult& root = results[0];
  for (size_t i = 0; i < o.values().size(); ++i) {
    ASSERT_NEAR(root.o.values()[i], o.values()[i],
                kMergeTolerance * (1 + std::abs(o.values()[i])))
        << "O element " << i;
  }
  for (size_t i = 0; i < lse.values().size(); ++i) {
    ASSERT_NEAR(root.lse.values()[i], lse.values()[i],
                kMergeTolerance * (1 + std::abs(lse.values()[i])))
        << "LSE element " << i;
  }
  ASSERT_EQ(root.narrowed.dtype(), DType::kBFloat16);
  std::vector<float> widened(o.values().size());
  ConvertDType(DType::kBFloat16, root.narrowed.view().data(), DType::kFloat32,
               widened.data(), static_cast<int64_t>(widened.size()));
  Tensor<double> o_ref(q_shape);
  Tensor<double> lse_ref(Shape{1, spec.q_len, spec.q_heads, 1});
  ReferenceAttention(spec, q.view(), k.view(), v.view(), o_ref.view(),
                     lse_ref.view());
  for (size_t i = 0; i < widened.size(); ++i) {
    // The narrowed rows are the root's fp32 result rounded to bf16 (8
    // significant bits): at most half a unit in the last place from it.
    ASSERT_NEAR(widened[i], root.o.values()[i],
                std::ldexp(std::abs(root.o.values()[i]), -8) + 1e-30)
        << "narrowed O element " << i;
    ASSERT_NEAR(widened[i], o_ref.values()[i],
                kBf16Tolerance * (1 + std::abs(o_ref.values()[i])))
        << "O element " << i << " against the reference";
  }
}

INSTANTIATE_TEST_SUITE_P(QueryRows, DeviceTreeTest,
                         ::testing::Values<int64_t>(1, 300, 2048),
                         [](const ::testing::TestParamInfo<int64_t>& info) {
                           return absl::StrCat("nq", info.param);
                         });

TEST(DeviceTreeFailureTest, PeerThatLeavesMidTreeFailsItsParentInTime) {
  SKIP_WITHOUT_GPUS(2);
  const AttentionSpec spec = ContinuationSpec(17);
  const Shape q_shape{1, spec.q_len, spec.q_heads, spec.head_dim};
  const Shape kv_shape{1, spec.kv_len, spec.kv_heads, spec.head_dim};
  RingOptions options;
  options.step_timeout = absl::Seconds(5);
  const std::vector<RankResult> results =
      RunTwoRanks(spec, RandomTensor(q_shape, 1), RandomTensor(kv_shape, 2),
                  RandomTensor(kv_shape, 3), /*leaving_rank=*/1, options);
  ASSERT_FALSE(results[0].status.ok());
  EXPECT_TRUE(absl::IsUnavailable(results[0].status) ||
              absl::IsDeadlineExceeded(results[0].status))
      << results[0].status;
  EXPECT_LT(results[0].elapsed, options.step_timeout + absl::Seconds(10));
}

}  // namespace
}  // namespace ringattn
