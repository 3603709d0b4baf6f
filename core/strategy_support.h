#ifndef RINGATTN_CORE_STRATEGY_SUPPORT_H_
#define RINGATTN_CORE_STRATEGY_SUPPORT_H_

// Which specs the strategies beside pass-KV run, shared by the coordinator
// (which refuses early and lets STRATEGY_AUTO avoid them) and the workers
// (which check their input). Pure functions; thread-safe.

#include "absl/status/status.h"
#include "core/attention_spec.h"

namespace ringattn {

// OK if broadcast-Q can run `spec` (dense or causal, any GQA ratio);
// UNIMPLEMENTED naming the pattern (dilated, block-sparse or Hilbert)
// otherwise.
absl::Status CheckBroadcastQSupports(const AttentionSpec& spec);

}  // namespace ringattn

#endif  // RINGATTN_CORE_STRATEGY_SUPPORT_H_
