#ifndef RINGATTN_KERNELS_CUDA_CONVERT_H_
#define RINGATTN_KERNELS_CUDA_CONVERT_H_

// fp32 <-> fp16 / bf16 conversion of device arrays, bit for bit the same as the
// host conversions in core/dtype.h: narrowing rounds to nearest, ties to even;
// overflow becomes infinity; NaN stays a quiet NaN with its sign and the top of
// its payload (hardware conversions would return one canonical NaN instead).
// Stateless and thread-safe.

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/attention_args.h"

namespace ringattn {

// Narrows `count` fp32 values at `src` into `dtype` elements at `dst`, on
// `stream`. Requires count >= 0 and device buffers of the right sizes. Returns
// the launch status.
cudaError_t LaunchConvertFromFloat(DeviceDType dtype, const float* src,
                                   void* dst, int64_t count,
                                   cudaStream_t stream);

// Widens `count` `dtype` elements at `src` into fp32 at `dst` (always exact),
// on `stream`. Same requirements and result as LaunchConvertFromFloat.
cudaError_t LaunchConvertToFloat(DeviceDType dtype, const void* src, float* dst,
                                 int64_t count, cudaStream_t stream);

}  // namespace ringattn

#endif  // RINGATTN_KERNELS_CUDA_CONVERT_H_
