#include "core/block_mask.h"

#include <algorithm>
#include <numeric>

namespace ringattn {
namespace {

// SplitMix64: a small, well-mixed generator, so `random` blocks depend only on
// the seed.
uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

BlockMask::BlockMask(int64_t block_size, int64_t num_blocks)
    : block_size_(block_size),
      num_blocks_(num_blocks),
      allowed_(static_cast<size_t>(num_blocks * num_blocks), 0) {}

std::optional<BlockMask> BlockMask::ForSpec(const AttentionSpec& spec) {
  if (!spec.block_sparse.has_value()) return std::nullopt;
  return FromRules(*spec.block_sparse, spec.kv_len);
}

BlockMask BlockMask::FromRules(const BlockSparseRules& rules, int64_t seq_len) {
  // Rounded up without seq_len + block_size - 1, which could overflow.
  const int64_t nb =
      seq_len / rules.block_size + (seq_len % rules.block_size != 0);
  BlockMask mask(rules.block_size, nb);
  auto allow = [&](int64_t i, int64_t j) { mask.allowed_[i * nb + j] = 1; };
  for (int64_t i = 0; i < nb; ++i) {
    for (int64_t j = 0; j < nb; ++j) {
      const int64_t distance = i > j ? i - j : j - i;
      if ((rules.local >= 0 && distance <= rules.local) ||
          (i < rules.global || j < rules.global) ||
          (rules.dilated > 0 && distance % rules.dilated == 0)) {
        allow(i, j);
      }
    }
  }
  if (rules.random > 0) {
    // Query block i draws min(random, nb) distinct key blocks by a partial
    // Fisher-Yates shuffle seeded from (seed, i).
    std::vector<int64_t> candidates(static_cast<size_t>(nb));
    for (int64_t i = 0; i < nb; ++i) {
      uint64_t state = rules.seed ^ (0xD1B54A32D192ED03ull * (i + 1));
      std::iota(candidates.begin(), candidates.end(), 0);
      const int64_t draws = std::min(rules.random, nb);
      for (int64_t d = 0; d < draws; ++d) {
        const int64_t pick =
            d + static_cast<int64_t>(SplitMix64(state) %
                                     static_cast<uint64_t>(nb - d));
        std::swap(candidates[d], candidates[pick]);
        allow(i, candidates[d]);
      }
    }
  }
  for (const auto& [i, j] : rules.pairs) allow(i, j);
  return mask;
}

bool BlockMask::AnyAllowed(int64_t q_begin, int64_t q_end, int64_t k_begin,
                           int64_t k_end) const {
  if (q_begin >= q_end || k_begin >= k_end) return false;
  const int64_t k_first = k_begin / block_size_;
  const int64_t k_last = (k_end - 1) / block_size_;
  for (int64_t i = q_begin / block_size_; i <= (q_end - 1) / block_size_; ++i) {
    for (int64_t j = k_first; j <= k_last; ++j) {
      if (Allowed(i, j)) return true;
    }
  }
  return false;
}

int64_t BlockMask::CountAllowed() const {
  return std::count(allowed_.begin(), allowed_.end(), 1);
}

}  // namespace ringattn
