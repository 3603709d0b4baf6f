#ifndef RINGATTN_SERVER_STRATEGY_CHOICE_H_
#define RINGATTN_SERVER_STRATEGY_CHOICE_H_

// The cost model that picks a strategy for STRATEGY_AUTO, and the check of a
// forced one. It counts the bytes each strategy moves over all links for one
// request over p workers (B batch, Nq/Nk query/key tokens, Hq/Hkv heads, D
// head dim, w bytes per wire element; the CPU ring carries fp32 K/V):
//
//   Q  = B * Nq * Hq * D * w            query rows, coordinator -> workers
//   R  = B * Nq * Hq * (D + 1) * 4      fp32 partial O and LSE, workers -> back
//   KV = 2 * B * Nk * Hkv * D * 4       K and V blocks on the ring
//
//   pass-KV     = Q + R + (p - 1) * KV  (each rank forwards p - 1 blocks of
//                                        about KV / p: (p-1)/p * KV per rank)
//   broadcast-Q = p * (Q + R)           (every rank gets all of Q and returns
//                                        a partial O/LSE for every row)
//
// Uploading K/V (Attend) costs the same under both, so it is left out.
// broadcast-Q wins iff it moves strictly fewer bytes, which for p > 1 is
// Q + R < KV: short query batches against long contexts. It is never chosen
// for dilated, block-sparse or Hilbert specs, nor on GPU workers. Compute is
// the same under both and is not weighed. Pure functions; thread-safe.

#include <cstdint>

#include "absl/status/statusor.h"
#include "core/attention_spec.h"
#include "ringattn/v1/attention.pb.h"

namespace ringattn {

struct BytesMoved {
  double pass_kv = 0;
  double broadcast_q = 0;
};

// The model above for `spec` over `workers` workers.
BytesMoved EstimateBytesMoved(const AttentionSpec& spec, int64_t workers,
                              int64_t wire_element_bytes);

// The strategy to run: `requested` if forced, or the model's choice for
// STRATEGY_AUTO. `broadcast_q_workers`: every worker runs broadcast-Q (CPU
// workers). UNIMPLEMENTED for PASS_Q, and for BROADCAST_Q where the spec or
// the workers cannot run it (the message says why).
absl::StatusOr<v1::Strategy> ChooseStrategy(const AttentionSpec& spec,
                                            v1::Strategy requested,
                                            int64_t workers,
                                            int64_t wire_element_bytes,
                                            bool broadcast_q_workers);

}  // namespace ringattn

#endif  // RINGATTN_SERVER_STRATEGY_CHOICE_H_
