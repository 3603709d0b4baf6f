// RunAttentionTask's kernel choice: tasks of at most kDecodeMaxPackedRows
// packed rows (query rows times Hq / Hkv) run DecodeAttention, longer ones
// BlockAttention, and either way two
// tasks over the halves of the keys, merged into one output, match the float64
// reference (dense and causal bottom-right, GQA, D=80, prime Nk); block-sparse
// tasks stay on BlockAttention.

#include "kernels/cpu/run_task.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/attention_spec.h"
#include "core/block_mask.h"
#include "core/random_tensor.h"
#include "core/ring_plan.h"
#include "core/tensor.h"
#include "gtest/gtest.h"
#include "kernels/cpu/reference_attention.h"

namespace ringattn {
namespace {

constexpr double kTolerance = 2e-5;
constexpr int64_t kKeys = 1009;  // prime, split 504 + 505 over two tasks
constexpr int64_t kGroup = 4;    // Hq / Hkv
constexpr int64_t kDecodeMaxRows = kDecodeMaxPackedRows / kGroup;

struct Case {
  int64_t nq = 1;
  bool causal = false;
};

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  return (info.param.causal ? "Causal" : "Dense") + std::string("Nq") +
         std::to_string(info.param.nq);
}

class RunTaskTest : public ::testing::TestWithParam<Case> {};

TEST_P(RunTaskTest, ChoosesKernelByPackedRowsAndMatchesReference) {
  const Case& c = GetParam();
  AttentionSpec spec;
  spec.q_len = c.nq;
  spec.kv_len = kKeys;
  spec.q_heads = 2 * kGroup;
  spec.kv_heads = 2;
  spec.head_dim = 80;
  spec.causal = c.causal;
  ASSERT_TRUE(spec.Validate().ok());

  std::mt19937 rng(17 + c.nq);
  const Tensor<float> q = RandomTensor({1, c.nq, 2 * kGroup, 80}, rng);
  const Tensor<float> k = RandomTensor({1, kKeys, 2, 80}, rng);
  const Tensor<float> v = RandomTensor({1, kKeys, 2, 80}, rng);
  Tensor<float> o({1, c.nq, 2 * kGroup, 80});
  Tensor<float> lse({1, c.nq, 2 * kGroup, 1});
  std::fill(lse.values().begin(), lse.values().end(),
            -std::numeric_limits<float>::infinity());
  std::vector<float> scratch;
  const WorkerBuffers buffers{q.view(), k.view(),   v.view(),
                              o.view(), lse.view(), &scratch};

  const CpuKernel want =
      c.nq <= kDecodeMaxRows ? CpuKernel::kDecode : CpuKernel::kBlock;
  const int64_t half = kKeys / 2;
  for (const Range& keys : {Range{0, half}, Range{half, kKeys}}) {
    AttentionTask task;
    task.q = Range{0, c.nq};
    task.k = keys;
    task.k_row = keys.begin;
    task.kind = c.causal ? TaskKind::kCausal : TaskKind::kFull;
    EXPECT_EQ(RunAttentionTask(spec, /*blocks=*/nullptr, task, buffers), want);
  }
  FinishAttention(spec, o.view());

  Tensor<double> want_o({1, c.nq, 2 * kGroup, 80});
  Tensor<double> want_lse({1, c.nq, 2 * kGroup, 1});
  ReferenceAttention(spec, q.view(), k.view(), v.view(), want_o.view(),
                     want_lse.view());
  for (size_t i = 0; i < o.values().size(); ++i) {
    const double ref = want_o.values()[i];
    ASSERT_LE(std::abs(o.values()[i] - ref), kTolerance * (1 + std::abs(ref)))
        << "o[" << i << "]";
  }
  for (size_t i = 0; i < lse.values().size(); ++i) {
    const double ref = want_lse.values()[i];
    ASSERT_LE(std::abs(lse.values()[i] - ref), kTolerance * (1 + std::abs(ref)))
        << "lse[" << i << "]";
  }
}

INSTANTIATE_TEST_SUITE_P(QueryRows, RunTaskTest,
                         ::testing::Values(Case{1, false}, Case{1, true},
                                           Case{3, false}, Case{3, true},
                                           Case{17, false}, Case{17, true},
                                           Case{kDecodeMaxRows + 1, false},
                                           Case{kDecodeMaxRows + 1, true}),
                         CaseName);

// Block-sparse tasks stay on BlockAttention, which skips dropped tiles, however
// few their query rows.
TEST(RunTaskKernelTest, BlockSparseTaskRunsBlockKernel) {
  AttentionSpec spec;
  spec.q_len = 1;
  spec.kv_len = kKeys;
  spec.q_heads = 2 * kGroup;
  spec.kv_heads = 2;
  spec.head_dim = 80;
  BlockSparseRules rules;
  rules.block_size = 64;
  rules.local = 1;
  rules.global = 1;
  spec.block_sparse = rules;
  const BlockMask blocks = BlockMask::FromRules(rules, kKeys);
  std::mt19937 rng(5);
  const Tensor<float> q = RandomTensor({1, 1, 2 * kGroup, 80}, rng);
  const Tensor<float> k = RandomTensor({1, kKeys, 2, 80}, rng);
  const Tensor<float> v = RandomTensor({1, kKeys, 2, 80}, rng);
  Tensor<float> o({1, 1, 2 * kGroup, 80});
  Tensor<float> lse({1, 1, 2 * kGroup, 1});
  std::fill(lse.values().begin(), lse.values().end(),
            -std::numeric_limits<float>::infinity());
  std::vector<float> scratch;
  AttentionTask task;
  task.q = Range{0, 1};
  task.k = Range{0, kKeys};
  task.kind = TaskKind::kBlockSparse;
  EXPECT_EQ(RunAttentionTask(spec, &blocks, task,
                             WorkerBuffers{q.view(), k.view(), v.view(),
                                           o.view(), lse.view(), &scratch}),
            CpuKernel::kBlock);
}

}  // namespace
}  // namespace ringattn
