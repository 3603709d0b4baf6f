#ifndef RINGATTN_WORKER_SHARD_ROWS_H_
#define RINGATTN_WORKER_SHARD_ROWS_H_

// ShardRowsTarget: where the rows of one tensor of this worker's shard land as
// ShardRows messages arrive (converted from the wire dtype to the target's),
// and which rows are still missing. Rows outside the shard, duplicates and
// wrong byte counts are refused with a message that names them.
// Thread-compatible.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/dtype.h"
#include "core/shard_layout.h"
#include "core/typed_tensor.h"
#include "ringattn/v1/worker.pb.h"

namespace ringattn {

class ShardRowsTarget {
 public:
  ShardRowsTarget() = default;
  // Rows of `layout.Chunks(rank)` in chunk order land in `rows` ([B, n, H, D],
  // contiguous, in any dtype). `layout` must outlive the target.
  ShardRowsTarget(const char* name, TypedView rows, const ShardLayout* layout,
                  int rank);

  // Converts and stores `rows`: Claim, then Store. INVALID_ARGUMENT for a bad
  // batch, positions outside the sequence or the shard, a wrong byte count,
  // or a row twice.
  absl::Status Place(const v1::ShardRows& rows, DType wire_dtype);

  // Checks `rows` as Place does and counts them as arrived; returns the slot
  // (batch * n + local row) of each. Rows before one that fails stay counted.
  absl::StatusOr<std::vector<int64_t>> Claim(const v1::ShardRows& rows,
                                             DType wire_dtype);
  // Converts `rows` into the slots Claim returned for them. Touches only
  // those rows, so stores of different claims may run at once.
  void Store(const v1::ShardRows& rows, DType wire_dtype,
             const std::vector<int64_t>& slots) const;

  // False for a default-constructed target, which takes no rows.
  bool takes_rows() const { return layout_ != nullptr; }

  // Counts every row as present (they were filled another way).
  void MarkAllArrived();

  int64_t missing() const { return missing_; }
  // OK if every row arrived; INVALID_ARGUMENT naming the first missing one.
  absl::Status CheckComplete() const;

  const char* name() const { return name_; }
  const TypedView& rows() const { return rows_; }

 private:
  int64_t LocalRow(int64_t position) const;

  const char* name_ = "";
  TypedView rows_;
  const ShardLayout* layout_ = nullptr;
  int rank_ = 0;
  std::vector<bool> arrived_;  // [B * n]
  int64_t missing_ = 0;
};

}  // namespace ringattn

#endif  // RINGATTN_WORKER_SHARD_ROWS_H_
