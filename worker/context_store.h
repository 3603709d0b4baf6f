#ifndef RINGATTN_WORKER_CONTEXT_STORE_H_
#define RINGATTN_WORKER_CONTEXT_STORE_H_

// ContextStore: the K/V rows of resident contexts that this worker holds
// between requests. A context grows by whole pieces (the rows one upload gave
// this worker); memory is accounted against a fixed capacity and freed only by
// Drop. Rows stay in the dtype they arrived in. Thread-safe.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "core/range.h"
#include "core/typed_tensor.h"

namespace ringattn {

class ContextStore {
 public:
  explicit ContextStore(int64_t capacity_bytes) : capacity_(capacity_bytes) {}

  ContextStore(const ContextStore&) = delete;
  ContextStore& operator=(const ContextStore&) = delete;

  struct Layout {
    int64_t batch = 0;
    int64_t kv_heads = 0;
    int64_t head_dim = 0;
  };

  // Adds the rows of context positions `positions` (K and V: [batch, n,
  // kv_heads, head_dim]) to context `name`, creating it if `create`. Returns
  // the bytes the context holds here afterwards. ALREADY_EXISTS / NOT_FOUND
  // when `create` does not match, INVALID_ARGUMENT for another layout or
  // positions already held, RESOURCE_EXHAUSTED past the capacity.
  absl::StatusOr<int64_t> Add(const std::string& name, bool create,
                              const Layout& layout, Range positions,
                              TypedTensor k, TypedTensor v);

  // Forgets context `name` (nothing if unknown), or with keep_length > 0 only
  // its pieces that start at or after keep_length.
  void Drop(const std::string& name, int64_t keep_length = 0);

  // Copies the rows of `chunks` (context positions, in order) into k and v
  // ([batch, total, kv_heads, head_dim], converted to their dtype). NOT_FOUND
  // for an unknown context, FAILED_PRECONDITION if this worker does not hold
  // some of the positions.
  absl::Status Copy(const std::string& name, const std::vector<Range>& chunks,
                    const TypedView& k, const TypedView& v);

  int64_t bytes_in_use();

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
