#ifndef RINGATTN_KERNELS_CUDA_ATTENTION_TEST_UTIL_H_
#define RINGATTN_KERNELS_CUDA_ATTENTION_TEST_UTIL_H_

// Test support for the GPU attention paths: the shapes they are held to, random
// inputs on the device, and the comparison of their outputs with the float64
// reference (kernels/cpu/reference_attention.h) computed from the same
// 16-bit-rounded inputs. Thread-compatible.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "kernels/cuda/attention_args.h"
#include "kernels/cuda/device_buffer.h"

namespace ringattn {

// Skips the calling test, with the reason, where there is no CUDA device.
// Use as: SkipWithoutGpu(); if (IsSkipped()) return;
void SkipWithoutGpu();

// One attention block to test.
struct AttentionCase {
  std::string name;  // letters, digits and underscores
  int64_t batch = 1;
  int64_t q_len = 0;
  int64_t kv_len = 0;
  int64_t q_heads = 1;
  int64_t kv_heads = 1;
  int64_t head_dim = 64;
  bool causal = false;
  float scale = 0.0f;  // 0: the default 1 / sqrt(head_dim)
  DeviceDType dtype = DeviceDType::kBFloat16;
  // Extra elements between consecutive rows of Q, K, V and O, so that the
  // tensors are strided slices of wider buffers (filled with NaN, which must
  // never be read, and checked to be left alone in O).
  int64_t row_padding = 0;
};

// A case of the given shape in bf16, no scale override, no row padding.
AttentionCase MakeAttentionCase(std::string name, int64_t batch, int64_t q_len,
                                int64_t kv_len, int64_t q_heads,
                                int64_t kv_heads, int64_t head_dim,
                                bool causal);

// Every case of `cases` in bf16, then every one in fp16.
std::vector<AttentionCase> InBothDTypes(
    const std::vector<AttentionCase>& cases);

// The shapes every path is held to (dense and causal; q_len below, equal to
// and above kv_len; GQA and MQA; head dims 64, 80, 128 and 256; lengths 1, 7,
// 257 and 1000; batch 2; strided slices), each in bf16 and fp16.
std::vector<AttentionCase> StandardAttentionCases();

// Shapes only our kernel takes: head dims that are not multiples of 8 and rows
// that are not 16 bytes apart.
std::vector<AttentionCase> UnalignedAttentionCases();

// "<name>_<dtype>", for gtest parameter names.
std::string AttentionCaseName(
    const ::testing::TestParamInfo<AttentionCase>& info);

// A work list in host memory (see attention_work_list.h).
struct HostAttentionWorkList {
  std::vector<QueryTile> tiles;
  std::vector<KeySpan> spans;
};

// A range of a block's keys: keys [first, first + count), causal or not.
struct KeyPart {
  int64_t first = 0;
  int64_t count = 0;
  bool causal = false;
};

// The keys of `c` in two parts whose results, folded by log-sum-exp, are the
// whole block's: dense, a third of the keys and the rest; causal, the keys
// every query row sees (half of those before the bottom-right diagonal's
// start) and the rest, causal. Parts without keys are left out.
std::vector<KeyPart> TwoKeyParts(const AttentionCase& c);

// `args` against the keys of `part` only.
DeviceAttentionArgs ArgsForKeys(const DeviceAttentionArgs& args,
                                const KeyPart& part);

// fp32 accumulators for the rows of one case (partial_merge.h), contiguous:
// O [batch, q_len, q_heads, head_dim] and LSE [batch, q_len, q_heads].
struct CaseAccumulators {
  DeviceBuffer o;
  DeviceBuffer lse;
  AccumulatorRows rows;  // where they lie
};

// Random inputs of one case in device memory, with room for the outputs, and
// the reference result of those inputs.
class AttentionProblem {
 public:
  // Draws inputs from `seed` and computes the reference.
  static absl::StatusOr<AttentionProblem> Create(const AttentionCase& c,
                                                 uint32_t seed);
  // The same for the pairs `list` shows (c.causal ignored): the list goes to
  // the device and into args().work; the reference is computed from the list's
  // definition, and rows in none of its tiles must keep what was in O and LSE.
  static absl::StatusOr<AttentionProblem> CreateWithWorkList(
      const AttentionCase& c, uint32_t seed, const HostAttentionWorkList& list);

  AttentionProblem(AttentionProblem&&) = default;
  AttentionProblem& operator=(AttentionProblem&&) = default;

  // Pointers and strides of this problem's buffers.
  const DeviceAttentionArgs& args() const { return args_; }

  // Fills O (rows and padding) and LSE with NaN, so that whatever a path does
  // not write fails the comparison.
  absl::Status PoisonOutputs();

  // Waits for the device, downloads O and LSE and compares them with the
  // reference: |o - ref| <= tol * (1 + |ref|) with tol 2e-2 for bf16 and 5e-3
  // for fp16; |lse - ref| <= 1e-2; rows that see no key exactly O = 0 and
  // LSE = -inf; O's padding untouched, and with a work list the rows of no
  // tile (still NaN after PoisonOutputs).
  ::testing::AssertionResult OutputsMatchReference() const;

  // Accumulators for this problem's rows, holding the empty result (O = 0,
  // LSE = -inf).
  absl::StatusOr<CaseAccumulators> EmptyAccumulators() const;

  // The path under test: folds the result of `args` into the accumulator
  // rows `into`, or says why it cannot.
  using Fold = std::function<absl::Status(const DeviceAttentionArgs& args,
                                          const AccumulatorRows& into)>;

  // How FoldKeyParts begins: with cleared accumulators, or with ones full of
  // NaN that the first part stores into (AccumulatorRows::fresh) and the
  // second folds into; a case without keys has no part to store, and keeps
  // them cleared.
  enum class Start { kCleared, kFresh };

  // Folds the results of the case's TwoKeyParts with `fold` into the
  // accumulators `start` says, then poisons the outputs and stores the
  // accumulators as them, for OutputsMatchReference to judge.
  absl::Status FoldKeyParts(const Fold& fold, Start start = Start::kCleared);

 private:
  AttentionProblem() = default;

  // Waits for the device, then stores `accumulators` as this problem's O
  // (rounded to the case's dtype, padding untouched) and LSE.
  absl::Status StoreAccumulators(const CaseAccumulators& accumulators);

  static absl::StatusOr<AttentionProblem> Build(
      const AttentionCase& c, uint32_t seed, const HostAttentionWorkList* list);

  AttentionCase case_;
  DeviceAttentionArgs args_;
  DeviceBuffer q_, k_, v_, o_, lse_, tiles_, spans_;
  std::vector<bool> untouched_rows_;   // [B * Nq]: in no tile of the list
  std::vector<double> reference_o_;    // [B, Nq, Hq, D]
  std::vector<double> reference_lse_;  // [B, Nq, Hq]
};

}  // namespace ringattn

#endif  // RINGATTN_KERNELS_CUDA_ATTENTION_TEST_UTIL_H_
