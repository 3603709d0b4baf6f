#ifndef RINGATTN_WORKER_RESIDENT_ROWS_TESTING_H_
#define RINGATTN_WORKER_RESIDENT_ROWS_TESTING_H_

// For executor tests: K/V rows laid out as a resident context holds them.

#include <vector>

#include "core/dtype.h"
#include "core/range.h"
#include "core/tensor.h"
#include "worker/cpu_kv_holding.h"

namespace ringattn {

// The rows of `chunks` of `k` and `v` (fp32, [B, N, H, D]), in chunk order, as
// a resident context holds them: in `dtype` (fp32 or bf16), in buffers with
// spare rows after them, so that batches lie further apart than the rows.
ResidentRows ResidentRowsOf(const Tensor<float>& k, const Tensor<float>& v,
                            const std::vector<Range>& chunks, DType dtype);

}  // namespace ringattn

#endif  // RINGATTN_WORKER_RESIDENT_ROWS_TESTING_H_
