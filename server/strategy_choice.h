#ifndef RINGATTN_SERVER_STRATEGY_CHOICE_H_
#define RINGATTN_SERVER_STRATEGY_CHOICE_H_

// The cost model that picks a strategy for STRATEGY_AUTO, and the check of a
// forced one. It counts the bytes each strategy moves over all links for one
// request over p workers (B batch, Nq/Nk query/key tokens, Hq/Hkv heads, D
// head dim, w bytes per wire element; the CPU ring carries fp32 blocks):
//
//   Q  = B * Nq * Hq * D * w            query rows, coordinator -> workers
//   R  = B * Nq * Hq * (D + 1) * 4      fp32 (partial) O and LSE, back
//   KV = 2 * B * Nk * Hkv * D * 4       K and V blocks on the ring
//   A  = B * Nq * Hq * (2D + 1) * 4     fp32 Q blocks with their running O
//                                       and LSE on the ring
//
//   pass-KV     = Q + R + (p - 1) * KV  (each rank forwards p - 1 blocks of
//                                        about KV / p: (p-1)/p * KV per rank)
//   pass-Q      = Q + R + p * A         (each Q block and its accumulators
//                                        makes p hops, the last one home;
//                                        nothing travels when p = 1)
//   broadcast-Q = p * (Q + R)           (every rank gets all of Q and returns
//                                        a partial O/LSE for every row)
//
// Uploading K/V (Attend) costs the same under all three, so it is left out.
// AUTO takes the strategy that moves strictly the fewest bytes (ties go to
// pass-KV, then broadcast-Q). Broadcast-Q wins over pass-KV iff, for p > 1,
// Q + R < KV: short query batches against long contexts. Pass-Q beats pass-KV
// iff p * A < (p - 1) * KV (a medium query batch against a long context), but
// as A >= Q + R it never moves fewer bytes than broadcast-Q, so AUTO would
// pick it only where broadcast-Q cannot run: dilated, block-sparse and
// Hilbert specs, which need Nq = Nk, where pass-KV always moves less (Hq >=
// Hkv). So under this count AUTO does not pick pass-Q today; forcing PASS_Q
// runs it. CPU and GPU workers run all three, and the count is the same for
// both (it overstates what a GPU ring moves, whose K/V and query blocks are
// 16-bit, alike for pass-KV and pass-Q, so the comparison barely moves);
// broadcast-Q does not run dilated, block-sparse or Hilbert specs. Compute is
// the same under all three and is not weighed. Pure functions; thread-safe.

#include <cstdint>

#include "absl/status/statusor.h"
#include "core/attention_spec.h"
#include "ringattn/v1/attention.pb.h"

namespace ringattn {

struct BytesMoved {
  double pass_kv = 0;
  double pass_q = 0;
  double broadcast_q = 0;
};

// The model above for `spec` over `workers` workers.
BytesMoved EstimateBytesMoved(const AttentionSpec& spec, int64_t workers,
                              int64_t wire_element_bytes);

// The strategy to run: `requested` if forced, or the model's choice for
// STRATEGY_AUTO, on CPU and GPU workers alike. UNIMPLEMENTED for BROADCAST_Q
// where the spec cannot run it (the message says why); INVALID_ARGUMENT for
// a value that names no strategy.
absl::StatusOr<v1::Strategy> ChooseStrategy(const AttentionSpec& spec,
                                            v1::Strategy requested,
                                            int64_t workers,
                                            int64_t wire_element_bytes);

}  // namespace ringattn

#endif  // RINGATTN_SERVER_STRATEGY_CHOICE_H_
