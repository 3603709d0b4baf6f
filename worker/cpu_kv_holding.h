#ifndef RINGATTN_WORKER_CPU_KV_HOLDING_H_
#define RINGATTN_WORKER_CPU_KV_HOLDING_H_

// How the CPU executors that keep their K/V shard (broadcast-Q, pass-Q) hold
// it: in buffers of their own, in fp32, or in bf16 when the rows arrive in
// bf16 (the kernels read them at that width, which is exact, with half the
// bytes to copy and to read); or not at all, reading the rows of a resident
// context where they lie (ResidentRows).

#include <memory>

#include "absl/status/status.h"
#include "core/attention_spec.h"
#include "core/dtype.h"
#include "core/typed_tensor.h"
#include "kernels/cpu/kv_view.h"

namespace ringattn {

struct CpuKvHolding {
  DType dtype = DType::kFloat32;  // of the executor's own buffers
  bool resident = false;          // rows of a resident context instead
};

// Rows of a resident context as a query reads them in place: K and V
// [batch, rows, kv_heads, head_dim], fp32 or bf16. Keeps the memory alive
// while it exists.
struct ResidentRows {
  KvView k;
  KvView v;
  std::shared_ptr<const void> keep_alive;
};

// INVALID_ARGUMENT unless the K and V of `spec` can be held as `holding`
// says: own buffers in fp32 always, in bf16 unless the spec is dilated (its
// tasks gather strided fp32 rows); resident rows unless the spec is dilated.
absl::Status CheckCpuKvHolding(const AttentionSpec& spec,
                               const CpuKvHolding& holding);

// The kernels' view of K or V rows held in fp32 or bf16.
KvView CpuKvView(const TypedTensor& rows);

}  // namespace ringattn

#endif  // RINGATTN_WORKER_CPU_KV_HOLDING_H_
