#ifndef RINGATTN_WORKER_RESIDENT_CONTEXTS_H_
#define RINGATTN_WORKER_RESIDENT_CONTEXTS_H_

// ResidentContexts: where a worker keeps the K/V rows of resident contexts
// between requests. A context grows by whole pieces (the rows one upload gave
// this worker) and is freed only by Drop. CPU workers keep them in host memory
// (ContextStore), GPU workers in device memory (DeviceContextStore); the
// StoreContext and DropContext calls go through this interface.

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/dtype.h"
#include "core/range.h"
#include "core/typed_tensor.h"

namespace ringattn {

class ResidentContexts {
 public:
  struct Layout {
    int64_t batch = 0;
    int64_t kv_heads = 0;
    int64_t head_dim = 0;
  };

  virtual ~ResidentContexts() = default;

  // Adds the rows of context positions `positions` (K and V: [batch, n,
  // kv_heads, head_dim]) to context `name`, creating it if `create`. Returns
  // the bytes the context holds here afterwards. ALREADY_EXISTS / NOT_FOUND
  // when `create` does not match, INVALID_ARGUMENT for another layout or
  // positions already held, RESOURCE_EXHAUSTED past the capacity.
  virtual absl::StatusOr<int64_t> Add(const std::string& name, bool create,
                                      const Layout& layout, Range positions,
                                      TypedTensor k, TypedTensor v) = 0;

  // Forgets context `name` (nothing if unknown), or with keep_length > 0 only
  // its pieces that start at or after keep_length.
  virtual void Drop(const std::string& name, int64_t keep_length = 0) = 0;

  // Bytes all contexts hold here.
  virtual int64_t bytes_in_use() = 0;

  // The dtype context `name`'s K and V rows are held in here; NOT_FOUND for
  // an unknown context.
  virtual absl::StatusOr<DType> HeldDType(const std::string& name) = 0;

  // Add for the rows of an append (or create) that started once
  // `undone_appends` appends to `name` had been undone: ABORTED, storing
  // nothing, when an Undo has undone more since (the rows belong to an append
  // that was undone before they arrived).
  absl::StatusOr<int64_t> AddUnlessUndone(const std::string& name, bool create,
                                          const Layout& layout, Range positions,
                                          TypedTensor k, TypedTensor v,
                                          int64_t undone_appends)
      ABSL_LOCKS_EXCLUDED(undo_mutex_);
  // Drop(name, keep_length); with keep_length > 0 it undoes an append, the
  // `undone_appends`-th, and AddUnlessUndone refuses the rows of appends that
  // started before it from now on. Forgetting the whole context forgets that
  // too.
  void Undo(const std::string& name, int64_t keep_length,
            int64_t undone_appends) ABSL_LOCKS_EXCLUDED(undo_mutex_);

  // How many pieces were added so far (a count that only grows), and a wait
  // until it exceeds `seen` or `deadline` passes (false then): for a query
  // whose new rows arrive on another stream at the same time.
  int64_t additions() ABSL_LOCKS_EXCLUDED(additions_mutex_);
  bool AwaitAddition(int64_t seen, absl::Time deadline)
      ABSL_LOCKS_EXCLUDED(additions_mutex_);

 protected:
  // Implementations call this once a piece is in place.
  void CountAddition() ABSL_LOCKS_EXCLUDED(additions_mutex_);

 private:
  // Orders AddUnlessUndone and Undo, so that rows either arrive before their
  // undo (which then drops them) or are refused.
  absl::Mutex undo_mutex_;
  std::map<std::string, int64_t> undone_appends_ ABSL_GUARDED_BY(undo_mutex_);
  absl::Mutex additions_mutex_;
  int64_t additions_ ABSL_GUARDED_BY(additions_mutex_) = 0;
};

// What Add checks before it stores anything: `create` against whether the
// context `exists`, and the layout of the new rows against the one it `has`
// (when it exists).
absl::Status CheckAddition(const std::string& name, bool create, bool exists,
                           const ResidentContexts::Layout& has,
                           const ResidentContexts::Layout& layout);

// OK if `added` more bytes fit beside `in_use` of `capacity` in `where` (e.g.
// "this worker's context memory"); RESOURCE_EXHAUSTED saying so otherwise.
absl::Status CheckContextRoom(const char* where, int64_t in_use,
                              int64_t capacity, int64_t added);

// The rows a context's buffers are reallocated to when an append finds no
// room for `rows`: an eighth more, so that appends rarely reallocate.
int64_t GrownCapacity(int64_t rows);

}  // namespace ringattn

#endif  // RINGATTN_WORKER_RESIDENT_CONTEXTS_H_
