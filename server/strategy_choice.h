#ifndef RINGATTN_SERVER_STRATEGY_CHOICE_H_
#define RINGATTN_SERVER_STRATEGY_CHOICE_H_

// The cost model that picks a strategy for STRATEGY_AUTO, and the check of a
// forced one. It estimates the seconds each strategy spends on what differs
// between them for one query of a resident context over p workers: moving query
// and output rows between the coordinator and the workers (gRPC, rate G),
// moving blocks around the ring (rate L), the workers' attention (a pass over j
// keys reads them at M bytes/s, and its FLOPs run at F) and a fixed cost S per
// ring step. With B batch, Nq/Nk query/key tokens, Hq/Hkv heads, D head dim, w
// wire bytes and o output bytes per element, k bytes per ring element,
// n = ceil(Nq / p) and m = ceil(Nk / p):
//
//   Q       = B * Nq * Hq * D * w            query rows to the workers
//   Y       = B * Nq * Hq * (D * o + 4)      output rows (and LSE) back
//   KV(j)   = 2 * B * j * Hkv * D * k        j K/V rows
//   A       = B * Nq * Hq * (D * k + 4 * (D + 1))
//                                            query blocks with their running
//                                            fp32 O and LSE, all ranks
//   T(i, j) = KV(j) / M + 4 * B * i * j * Hq * D * c / F
//                                            attention of i rows against j
//                                            keys (c: the fraction of pairs a
//                                            causal mask leaves)
//
//   pass-KV     = (Q + Y) / G + C * 2 * KV(m) / M + T(n, m)
//                 + (p - 1) * (max(T(n, m), KV(m) / L)
//                 + I * min(T(n, m), KV(m) / L) + S)
//                                            (each K/V hop runs beside the
//                                            step's compute and slows it by I
//                                            of the shorter one; C = 1 where
//                                            it first copies the context's
//                                            rows into its ring buffer: with
//                                            more than one worker, and on CPU
//                                            workers always; 0 otherwise)
//   pass-Q      = (Q + Y) / G + p * (T(n, m) + A / (p * L) + S)
//                                            (a query block leaves only with
//                                            the worker's keys merged in; one
//                                            worker: T(Nq, Nk))
//   broadcast-Q = p * Q / G + T(Nq, m) + the cheaper merge of
//                 server/merge_choice.h      (every rank gets all of Q)
//
// The client's own upload and download are the same under all three and are
// left out. AUTO takes the strategy estimated strictly fastest (ties go to
// pass-KV, then broadcast-Q), considering pass-Q only where each of its
// blocks has at least kPassQFullRateRows rows: on 2x H200 (1M-token context,
// Hq=32, Hkv=8) pass-Q took 3.6 ms end to end for 16 rows against
// broadcast-Q's 2.8-3.4 (its GPUs read each shard twice, 1.1 ms against 0.55,
// while its gRPC saving is a few hundred KiB), and 9.3 ms for 128 rows against
// 9.4-9.7. So broadcast-Q takes short query batches against long contexts
// (each shard is read once; the ring strategies read it p times), pass-Q a
// hundred rows and more against long contexts on GPUs (its rows cross gRPC
// once, not once per worker), and pass-KV Nq close to Nk.
// Broadcast-Q does not run dilated, block-sparse or Hilbert specs. Pure
// functions; thread-safe.

#include <cstdint>

#include "absl/status/statusor.h"
#include "core/attention_spec.h"
#include "ringattn/v1/attention.pb.h"
#include "server/merge_choice.h"

namespace ringattn {

// The fewest rows per block for which AUTO weighs pass-Q (above).
inline constexpr int64_t kPassQFullRateRows = 64;

// The rates of the model for one kind of worker.
struct StrategyRates {
  MergeRates merge;                // G, L and broadcast-Q's merge
  double memory = 0;               // M, bytes per second
  double flops = 0;                // F, FLOP per second
  double step = 0;                 // S, seconds
  double hop_interference = 0;     // I
  int64_t ring_element_bytes = 0;  // k
  // Whether pass-KV copies the context's rows with a single worker too.
  bool single_worker_copies = false;
};

// GPU workers (one H200 each, NVLink): M 4 TB/s (a one-row query read its
// K/V at 3.9-4.2 TB/s), F 550 TFLOP/s (cuDNN and our Hopper kernel on long
// blocks), S 0.2 ms (a one-row pass-Q query over 2 GPUs took 0.9 ms more than
// broadcast-Q, 0.55 ms of it its second read of a shard), I 1/3 (a 4096-row
// pass-KV query of a 1M context computed 59 ms against pass-Q's 52, beside a
// 21 ms hop of its K/V), 16-bit ring blocks; G, L and the merge from
// GpuMergeRates.
StrategyRates GpuStrategyRates();
// CPU workers: M 10 GB/s, F 50 GFLOP/s per worker, S 50 us (Gloo over TCP),
// I 1/3 as on GPUs (not measured), fp32 ring blocks; a single worker's
// pass-KV copies the context too (broadcast-Q and pass-Q read it in place:
// a 64K-token decode step on one CPU worker took 122-136 ms with pass-KV).
StrategyRates CpuStrategyRates();

struct StrategySeconds {
  double pass_kv = 0;
  double pass_q = 0;
  double broadcast_q = 0;
};

// The model above for `spec` over `workers` workers. `communicator_kept`:
// the coordinator can lend the workers' kept communicator now (broadcast-Q's
// merge on the workers joins one).
StrategySeconds EstimateStrategySeconds(const AttentionSpec& spec,
                                        int64_t workers,
                                        int64_t wire_element_bytes,
                                        int64_t output_element_bytes,
                                        const StrategyRates& rates,
                                        bool communicator_kept);

// The strategy to run: `requested` if forced, or the model's choice for
// STRATEGY_AUTO. UNIMPLEMENTED for BROADCAST_Q where the spec cannot run it
// (the message says why); INVALID_ARGUMENT for a value that names no
// strategy.
absl::StatusOr<v1::Strategy> ChooseStrategy(
    const AttentionSpec& spec, v1::Strategy requested, int64_t workers,
    int64_t wire_element_bytes, int64_t output_element_bytes,
    const StrategyRates& rates, bool communicator_kept);

}  // namespace ringattn

#endif  // RINGATTN_SERVER_STRATEGY_CHOICE_H_
