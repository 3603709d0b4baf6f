#ifndef RINGATTN_WORKER_CONTEXT_STORE_H_
#define RINGATTN_WORKER_CONTEXT_STORE_H_

// ContextStore: the resident contexts of a CPU worker, in host memory, so that
// a query reads them where they lie (as DeviceContextStore does on a GPU). A
// context is one K and one V buffer [batch, capacity, kv_heads, head_dim]
// whose first rows are the positions this worker holds, in position order; so
// pieces must come in order, each after every position held (as the
// coordinator's uploads and appends send them). It is held in bf16 if it was
// created in bf16 and in fp32 otherwise (the CPU kernels read both; fp16
// widens exactly); later pieces are converted to it. A new context gets
// exactly its first piece's rows; when an append finds no room, the buffers
// are reallocated an eighth larger than needed. A reader holds the buffers it
// reads (ResidentRows), so neither growth nor Drop frees memory under a
// running query. Capacity is accounted against a fixed budget. Thread-safe.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "core/dtype.h"
#include "core/range.h"
#include "core/typed_tensor.h"
#include "worker/cpu_kv_holding.h"
#include "worker/held_positions.h"
#include "worker/resident_contexts.h"

namespace ringattn {

class ContextStore final : public ResidentContexts {
 public:
  explicit ContextStore(int64_t capacity_bytes) : capacity_(capacity_bytes) {}

  ContextStore(const ContextStore&) = delete;
  ContextStore& operator=(const ContextStore&) = delete;

  // ResidentContexts::Add, and INVALID_ARGUMENT for positions not after every
  // one held.
  absl::StatusOr<int64_t> Add(const std::string& name, bool create,
                              const Layout& layout, Range positions,
                              TypedTensor k, TypedTensor v) override;
  void Drop(const std::string& name, int64_t keep_length = 0) override;
  int64_t bytes_in_use() override;
  // bf16 for a context created from bf16 rows, fp32 otherwise.
  absl::StatusOr<DType> HeldDType(const std::string& name) override;

  // The rows of `chunks` (context positions, in order), which must be held
  // here as one run of rows (a query's chunks of this worker are). NOT_FOUND
  // for an unknown context, FAILED_PRECONDITION if some position is not held
  // here or the chunks skip held rows.
  absl::StatusOr<ResidentRows> Find(const std::string& name,
                                    const std::vector<Range>& chunks);

  // Copies the rows of `chunks` (context positions, in order) into k and v
  // ([batch, total, kv_heads, head_dim], converted to their dtype, on every
  // core). NOT_FOUND for an unknown context, FAILED_PRECONDITION if this
  // worker does not hold some of the positions.
  absl::Status Copy(const std::string& name, const std::vector<Range>& chunks,
                    const TypedView& k, const TypedView& v);

 private:
  struct Buffers {
    TypedTensor k;  // [batch, capacity, kv_heads, head_dim]
    TypedTensor v;
  };
  struct Context {
    Layout layout;
    DType dtype = DType::kFloat32;
    std::shared_ptr<Buffers> buffers;
    HeldPositions held;  // whose rows lie in the buffers
  };

  // Bytes of one row (K or V) of `context`, its buffers' rows per batch
  // (0 before it has any), and their bytes.
  static int64_t RowBytes(const Context& context);
  static int64_t CapacityOf(const Context& context);
  static int64_t BytesOf(const Context& context);
  // Context `name`; NOT_FOUND if there is none.
  absl::StatusOr<const Context*> Lookup(const std::string& name) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Bytes of every context's buffers.
  int64_t HeldBytes() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Makes room for `rows` rows in `context`: exactly that many for a new
  // context, an eighth more when its buffers must grow.
  absl::Status Reserve(Context& context, int64_t rows)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  const int64_t capacity_;
  absl::Mutex mutex_;
  std::map<std::string, Context> contexts_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace ringattn

#endif  // RINGATTN_WORKER_CONTEXT_STORE_H_
