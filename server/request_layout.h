#ifndef RINGATTN_SERVER_REQUEST_LAYOUT_H_
#define RINGATTN_SERVER_REQUEST_LAYOUT_H_

// RequestLayout: where each token of a request lives. Tokens are first put in
// masking order (the Hilbert curve's, or their own), then sharded over the
// workers exactly as the workers' ring plan expects. It turns a run of caller
// tokens into per-worker pieces and maps worker output positions back to caller
// tokens. Immutable; safe to share.

#include <cstdint>
#include <vector>

#include "core/attention_spec.h"
#include "core/shard_layout.h"

namespace ringattn {

class RequestLayout {
 public:
  RequestLayout(const AttentionSpec& spec, int64_t workers);

  // Caller tokens [first_token, first_token + count) of Q (or of K/V when
  // `keys`) that go to one worker: their masking-order positions, in token
  // order, and where they sit in the caller's run.
  struct Piece {
    int64_t worker;
    int64_t first_token;             // index into the caller's run
    std::vector<int64_t> positions;  // consecutive tokens of the run
    bool contiguous;                 // positions are consecutive numbers
  };
  std::vector<Piece> Route(bool keys, int64_t first_token, int64_t count) const;

  // The caller token at masking-order position `position` (of Q and of K/V
  // alike).
  int64_t TokenAt(int64_t position) const;

  const ShardLayout& q_layout() const { return q_layout_; }
  const ShardLayout& kv_layout() const { return kv_layout_; }

 private:
  int64_t WorkerOf(const ShardLayout& layout, int64_t position) const;

  ShardLayout q_layout_;
  ShardLayout kv_layout_;
  std::vector<int64_t> order_;        // Hilbert only: order_[position] = token
  std::vector<int64_t> position_of_;  // Hilbert only: inverse of order_
};

}  // namespace ringattn

#endif  // RINGATTN_SERVER_REQUEST_LAYOUT_H_
