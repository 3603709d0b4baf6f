#include <cstdint>

#include "kernels/cuda/empty_rows.h"

namespace ringattn {
namespace {

// Grid-stride over (batch, row, head * head_dim): one 16-bit zero each, and
// -inf for each (batch, row, head) LSE entry.
__global__ void MarkRowsEmptyKernel(uint16_t* o, int64_t o_batch_stride,
                                    int64_t o_seq_stride, float* lse,
                                    int64_t batch, int64_t rows, int64_t q_len,
                                    int64_t q_heads, int64_t row_width) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first =
      static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t elements = batch * rows * row_width;
  for (int64_t i = first; i < elements; i += step) {
    const int64_t column = i % row_width;
    const int64_t row = i / row_width % rows;
    const int64_t b = i / (row_width * rows);
    o[b * o_batch_stride + row * o_seq_stride + column] = 0;
  }
  if (lse == nullptr) return;
  const int64_t entries = batch * rows * q_heads;
  for (int64_t i = first; i < entries; i += step) {
    const int64_t h = i % q_heads;
    const int64_t row = i / q_heads % rows;
    const int64_t b = i / (q_heads * rows);
    lse[(b * q_len + row) * q_heads + h] = -INFINITY;
  }
}

}  // namespace

cudaError_t LaunchMarkRowsEmpty(const DeviceAttentionArgs& args, int64_t rows,
                                cudaStream_t stream) {
  if (rows < 0 || rows > args.q_len) return cudaErrorInvalidValue;
  if (rows == 0 || args.batch == 0) return cudaSuccess;
  const int64_t row_width = args.q_heads * args.head_dim;
  const int64_t elements = args.batch * rows * row_width;
  constexpr int kThreads = 256;
  constexpr int64_t kMaxBlocks = 4096;
  const int64_t blocks = (elements + kThreads - 1) / kThreads;
  MarkRowsEmptyKernel<<<static_cast<unsigned>(blocks < kMaxBlocks ? blocks
                                                                  : kMaxBlocks),
                        kThreads, 0, stream>>>(
      static_cast<uint16_t*>(args.o.data), args.o.batch_stride,
      args.o.seq_stride, args.lse, args.batch, rows, args.q_len, args.q_heads,
      row_width);
  return cudaGetLastError();
}

}  // namespace ringattn
