#ifndef RINGATTN_WORKER_COMPUTE_DTYPE_H_
#define RINGATTN_WORKER_COMPUTE_DTYPE_H_

// The 16-bit dtype GPU workers compute in for each wire dtype, and the host
// dtype with the same bits.

#include "core/dtype.h"
#include "kernels/cuda/attention_args.h"

namespace ringattn {

// fp16 for fp16, bf16 for bf16 and fp32.
inline DeviceDType ComputeDTypeFor(DType wire) {
  return wire == DType::kFloat16 ? DeviceDType::kFloat16
                                 : DeviceDType::kBFloat16;
}

// The host dtype with the same bits as `dtype`.
inline DType HostDTypeOf(DeviceDType dtype) {
  return dtype == DeviceDType::kFloat16 ? DType::kFloat16 : DType::kBFloat16;
}

}  // namespace ringattn

#endif  // RINGATTN_WORKER_COMPUTE_DTYPE_H_
