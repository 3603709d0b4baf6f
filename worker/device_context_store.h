#ifndef RINGATTN_WORKER_DEVICE_CONTEXT_STORE_H_
#define RINGATTN_WORKER_DEVICE_CONTEXT_STORE_H_

// DeviceContextStore: the resident contexts of a GPU worker, in device memory
// in a 16-bit compute dtype, so that a query reads them where they lie: no
// host copy and no upload per query. A context is one K and one V buffer
// [batch, capacity, kv_heads, head_dim] whose first rows are the positions
// this worker holds, in position order; so pieces must come in order, each
// after every position held (as the coordinator's uploads and appends send
// them). A piece is converted to the context's dtype on the host and copied
// into spare capacity; when there is none, the buffers are reallocated an
// eighth larger than needed (one device copy). A reader holds the buffers it
// reads (ResidentKv), so neither growth nor Drop frees memory under a running
// query. Capacity is accounted against a fixed budget. Thread-safe; an Add
// holds the store while it copies.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "core/range.h"
#include "core/typed_tensor.h"
#include "kernels/cuda/attention_args.h"
#include "kernels/cuda/device_buffer.h"
#include "worker/device.h"
#include "worker/held_positions.h"
#include "worker/resident_contexts.h"

namespace ringattn {

// Rows of a resident context in device memory, as a query reads them: K and
// V [batch, rows, kv_heads, head_dim] with batches `batch_stride` elements
// apart. Keeps the memory alive while it exists.
struct ResidentKv {
  DeviceDType dtype = DeviceDType::kBFloat16;
  const void* k = nullptr;
  const void* v = nullptr;
  int64_t rows = 0;
  int64_t batch_stride = 0;
  std::shared_ptr<const void> keep_alive;
};

class DeviceContextStore final : public ResidentContexts {
 public:
  // Contexts on CUDA device `device`, at most `capacity_bytes` of them.
  DeviceContextStore(int device, int64_t capacity_bytes);

  DeviceContextStore(const DeviceContextStore&) = delete;
  DeviceContextStore& operator=(const DeviceContextStore&) = delete;

  // ResidentContexts::Add, and INVALID_ARGUMENT for positions not after every
  // one held; INTERNAL for a failing CUDA call. A context is held in the
  // compute dtype of the wire dtype it was created with (fp16 for fp16, bf16
  // otherwise); later pieces are converted to it.
  absl::StatusOr<int64_t> Add(const std::string& name, bool create,
                              const Layout& layout, Range positions,
                              TypedTensor k, TypedTensor v) override;
  void Drop(const std::string& name, int64_t keep_length = 0) override;
  int64_t bytes_in_use() override;
  // The host dtype of the same bits as DTypeOf's.
  absl::StatusOr<DType> HeldDType(const std::string& name) override;

  // The dtype context `name` is held in; NOT_FOUND for an unknown context.
  absl::StatusOr<DeviceDType> DTypeOf(const std::string& name);

  // The rows of `chunks` (context positions, in order), which must be held
  // here as one run of rows (a query's chunks of this worker are).
  // NOT_FOUND for an unknown context, FAILED_PRECONDITION if some position
  // is not held here or the chunks skip held rows.
  absl::StatusOr<ResidentKv> Find(const std::string& name,
                                  const std::vector<Range>& chunks);

 private:
  struct Buffers {
    DeviceBuffer k;
    DeviceBuffer v;
    int64_t capacity = 0;  // rows per batch
  };
  struct Context {
    Layout layout;
    DeviceDType dtype = DeviceDType::kBFloat16;
    std::shared_ptr<Buffers> buffers;
    HeldPositions held;  // whose rows lie in the buffers
  };

  // Bytes of one row (K or V) of `context`, and of its buffers.
  static int64_t RowBytes(const Context& context);
  static int64_t BytesOf(const Context& context);
  // Bytes of every context's buffers.
  int64_t HeldBytes() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Makes room for `rows` rows in `context` (reallocating its buffers with
  // room to spare when they are too small).
  absl::Status Reserve(const std::string& name, Context& context, int64_t rows)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  const int device_;
  const int64_t capacity_;
  absl::Mutex mutex_;
  CudaStream stream_ ABSL_GUARDED_BY(mutex_);
  std::map<std::string, Context> contexts_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace ringattn

#endif  // RINGATTN_WORKER_DEVICE_CONTEXT_STORE_H_
