#ifndef RINGATTN_WORKER_CPU_KV_DTYPE_H_
#define RINGATTN_WORKER_CPU_KV_DTYPE_H_

// The dtypes the CPU executors hold their own K and V rows in: fp32, or bf16
// when the rows arrive in bf16 (the kernels read them at that width, which is
// exact, with half the bytes to copy and to read).

#include "absl/status/status.h"
#include "core/attention_spec.h"
#include "core/dtype.h"
#include "core/typed_tensor.h"
#include "kernels/cpu/kv_view.h"

namespace ringattn {

// INVALID_ARGUMENT unless K and V of `spec` can be held in `kv_dtype`: fp32
// always, bf16 unless the spec is dilated (its tasks gather strided fp32
// rows).
absl::Status CheckCpuKvDType(const AttentionSpec& spec, DType kv_dtype);

// The kernels' view of K or V rows held in fp32 or bf16.
KvView CpuKvView(const TypedTensor& rows);

}  // namespace ringattn

#endif  // RINGATTN_WORKER_CPU_KV_DTYPE_H_
