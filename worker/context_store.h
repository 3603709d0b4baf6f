#ifndef RINGATTN_WORKER_CONTEXT_STORE_H_
#define RINGATTN_WORKER_CONTEXT_STORE_H_

// ContextStore: the resident contexts of a CPU worker, in host memory. Memory
// is accounted against a fixed capacity; rows stay in the dtype they arrived
// in, and a query copies the rows it needs (Copy, converting on every
// core). Thread-safe.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "core/range.h"
#include "core/typed_tensor.h"
#include "worker/resident_contexts.h"

namespace ringattn {

class ContextStore final : public ResidentContexts {
 public:
  explicit ContextStore(int64_t capacity_bytes) : capacity_(capacity_bytes) {}

  ContextStore(const ContextStore&) = delete;
  ContextStore& operator=(const ContextStore&) = delete;

  absl::StatusOr<int64_t> Add(const std::string& name, bool create,
                              const Layout& layout, Range positions,
                              TypedTensor k, TypedTensor v) override;
  void Drop(const std::string& name, int64_t keep_length = 0) override;

  // Whether every row context `name` holds is in bf16 (false for an unknown
  // context).
  bool HoldsOnlyBFloat16(const std::string& name);

  // Copies the rows of `chunks` (context positions, in order) into k and v
  // ([batch, total, kv_heads, head_dim], converted to their dtype). NOT_FOUND
  // for an unknown context, FAILED_PRECONDITION if this worker does not hold
  // some of the positions.
  absl::Status Copy(const std::string& name, const std::vector<Range>& chunks,
                    const TypedView& k, const TypedView& v);

  int64_t bytes_in_use() override;

 private:
  struct Piece {
    Range positions;
    TypedTensor k;
    TypedTensor v;
  };
  struct Context {
    Layout layout;
    std::map<int64_t, Piece> pieces;  // by first position
    int64_t bytes = 0;
  };

  const int64_t capacity_;
  absl::Mutex mutex_;
  std::map<std::string, Context> contexts_ ABSL_GUARDED_BY(mutex_);
  int64_t bytes_ ABSL_GUARDED_BY(mutex_) = 0;
};

}  // namespace ringattn

#endif  // RINGATTN_WORKER_CONTEXT_STORE_H_
