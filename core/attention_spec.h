#ifndef RINGATTN_CORE_ATTENTION_SPEC_H_
#define RINGATTN_CORE_ATTENTION_SPEC_H_

// AttentionSpec: everything that defines one attention request apart from the
// tensors themselves (shapes, scale, masking patterns). The semantics are those
// of DESIGN.md; Validate() says whether a spec is well formed. A plain value
// type.

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace ringattn {

// How the branches of dilated attention are combined.
enum class DilatedCombine {
  // Every head takes every branch (offset h % r); branches merge by
  // log-sum-exp.
  kLse,
  // Heads split into one contiguous group per branch; group k runs branch k
  // with
  // offset k % r; the output is divided by the number of branches.
  kHeadGroups,
};

// One LongNet branch: segments of `segment_length` positions, keeping every
// `dilation`-th position of each segment.
struct DilatedBranch {
  int64_t segment_length = 0;
  int64_t dilation = 1;
};

// Rules of the block-sparse pattern; a block pair is computed iff any rule
// allows it.
struct BlockSparseRules {
  int64_t block_size = 0;
  int64_t local = -1;   // |i - j| <= local; negative: rule off
  int64_t global = 0;   // i < global or j < global; 0: off
  int64_t dilated = 0;  // (i - j) % dilated == 0; 0: off
  int64_t random = 0;   // this many extra key blocks per query block; 0: off
  uint64_t seed = 0;    // seeds `random`
  std::vector<std::pair<int64_t, int64_t>>
      pairs;  // explicit (query, key) blocks
};

// Tokens that live on a `height` x `width` grid, reordered along a Hilbert
// curve.
struct HilbertGrid {
  int64_t height = 0;
  int64_t width = 0;
};

struct AttentionSpec {
  int64_t batch = 1;
  int64_t q_len = 0;           // Nq
  int64_t kv_len = 0;          // Nk
  int64_t q_heads = 0;         // Hq
  int64_t kv_heads = 0;        // Hkv; Hq % Hkv == 0
  int64_t head_dim = 0;        // D <= 256
  std::optional<float> scale;  // default 1/sqrt(D)
  bool causal =
      false;  // bottom-right aligned: key j visible iff j <= i + Nk - Nq
  std::vector<DilatedBranch> dilated;
  DilatedCombine combine = DilatedCombine::kLse;
  std::optional<BlockSparseRules> block_sparse;
  std::optional<HilbertGrid> hilbert;

  // OK, or INVALID_ARGUMENT whose message names the field and its bad value.
  absl::Status Validate() const;

  float EffectiveScale() const;
  int64_t GqaRatio() const { return q_heads / kv_heads; }
  // The key/value head that query head `h` reads.
  int64_t KvHeadOf(int64_t h) const { return h / GqaRatio(); }
};

// The largest head dimension any path accepts.
inline constexpr int64_t kMaxHeadDim = 256;

// The most elements Q, K, V or O may hold (2^56), so that the byte counts of a
// whole request, and of a worker's share of it, stay far inside int64.
inline constexpr int64_t kMaxTensorElements = int64_t{1} << 56;

}  // namespace ringattn

#endif  // RINGATTN_CORE_ATTENTION_SPEC_H_
