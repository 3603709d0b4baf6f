#ifndef RINGATTN_CORE_BLOCK_MASK_H_
#define RINGATTN_CORE_BLOCK_MASK_H_

// The block-sparse pattern of DESIGN.md: which (query block, key block) pairs
// are computed. Query block i covers positions [i*b, (i+1)*b) (the last may be
// short). Immutable once built; safe to share between threads.

#include <cstdint>
#include <optional>
#include <vector>

#include "core/attention_spec.h"

namespace ringattn {

class BlockMask {
 public:
  // The mask the rules allow for a sequence of `seq_len` positions.
  static BlockMask FromRules(const BlockSparseRules& rules, int64_t seq_len);
  // The mask of a block-sparse spec (over its K/V length); none otherwise.
  static std::optional<BlockMask> ForSpec(const AttentionSpec& spec);

  int64_t block_size() const { return block_size_; }
  int64_t num_blocks() const { return num_blocks_; }
  bool Allowed(int64_t q_block, int64_t k_block) const {
    return allowed_[q_block * num_blocks_ + k_block] != 0;
  }
  // Whether any pair (q_block, k_block) with q positions in [q_begin, q_end)
  // and k positions in [k_begin, k_end) is allowed.
  bool AnyAllowed(int64_t q_begin, int64_t q_end, int64_t k_begin,
                  int64_t k_end) const;
  // The number of allowed pairs.
  int64_t CountAllowed() const;

 private:
  BlockMask(int64_t block_size, int64_t num_blocks);

  int64_t block_size_;
  int64_t num_blocks_;
  std::vector<uint8_t>
      allowed_;  // num_blocks_ x num_blocks_, row = query block
};

}  // namespace ringattn

#endif  // RINGATTN_CORE_BLOCK_MASK_H_
