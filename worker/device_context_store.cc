#include "worker/device_context_store.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/dtype.h"
#include "core/status_macros.h"
#include "worker/compute_dtype.h"
#include "worker/executor_memory_pool.h"
#include "worker/pinned_host_regions.h"

namespace ringattn {
namespace {

// Spare rows a new context gets beyond its first piece, as a fraction of it
// (at least kLeastSpareRows), so that appends rarely reallocate.
constexpr int64_t kCreateSpareDivisor = 64;
constexpr int64_t kLeastSpareRows = 256;

// `tensor` in `dtype`, converted on the host if it is in another.
TypedTensor InDType(TypedTensor tensor, DType dtype) {
  if (tensor.dtype() == dtype) return tensor;
  TypedTensor converted(dtype, tensor.view().shape());
  ConvertDType(tensor.dtype(), tensor.view().data(), dtype,
               converted.view().data(), tensor.view().shape().NumElements());
  return converted;
}

}  // namespace

DeviceContextStore::DeviceContextStore(int device, int64_t capacity_bytes)
    : device_(device), capacity_(capacity_bytes) {}

int64_t DeviceContextStore::RowBytes(const Context& context) {
  return context.layout.kv_heads * context.layout.head_dim * 2;
}

int64_t DeviceContextStore::BytesOf(const Context& context) {
  return context.buffers ? 2 * context.layout.batch *
                               context.buffers->capacity * RowBytes(context)
                         : 0;
}

int64_t DeviceContextStore::HeldBytes() const {
  int64_t bytes = 0;
  for (const auto& [name, context] : contexts_) bytes += BytesOf(context);
  return bytes;
}

absl::Status DeviceContextStore::Reserve(const std::string& name,
                                         Context& context, int64_t rows) {
  const int64_t held = context.buffers ? context.buffers->capacity : 0;
  if (rows <= held) return absl::OkStatus();
  const int64_t capacity =
      context.buffers
          ? GrownCapacity(rows)
          : rows + std::max(kLeastSpareRows, rows / kCreateSpareDivisor);
  const int64_t pitch = RowBytes(context);
  const int64_t batch = context.layout.batch;
  const int64_t new_bytes = 2 * batch * capacity * pitch;
  RINGATTN_RETURN_IF_ERROR(
      CheckContextRoom("this worker's device memory for contexts", HeldBytes(),
                       capacity_, new_bytes - BytesOf(context)));
  auto buffers = std::make_shared<Buffers>();
  buffers->capacity = capacity;
  for (DeviceBuffer* buffer : {&buffers->k, &buffers->v}) {
    absl::StatusOr<DeviceBuffer> allocated =
        DeviceBuffer::Allocate(static_cast<size_t>(new_bytes / 2));
    if (!allocated.ok()) {
      // What the executors' pool keeps between requests is the device's too.
      ReleaseKeptExecutorMemory(device_);
      allocated = DeviceBuffer::Allocate(static_cast<size_t>(new_bytes / 2));
    }
    if (!allocated.ok()) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "cuda:", device_, " cannot hold ", new_bytes, " bytes for context '",
          name, "' (", allocated.status().message(),
          "); delete contexts or add workers"));
    }
    *buffer = *std::move(allocated);
  }
  if (context.held.rows() > 0) {
    const size_t width = static_cast<size_t>(context.held.rows() * pitch);
    for (const auto& [to, from] :
         {std::make_pair(&buffers->k, &context.buffers->k),
          std::make_pair(&buffers->v, &context.buffers->v)}) {
      RINGATTN_RETURN_IF_ERROR(CudaStatus(
          cudaMemcpy2DAsync(to->as<char>(), capacity * pitch, from->as<char>(),
                            held * pitch, width, batch,
                            cudaMemcpyDeviceToDevice, stream_.get()),
          "moving a context to larger buffers"));
    }
    RINGATTN_RETURN_IF_ERROR(
        CudaStatus(cudaStreamSynchronize(stream_.get()), "moving a context"));
  }
  context.buffers = std::move(buffers);
  return absl::OkStatus();
}

absl::StatusOr<int64_t> DeviceContextStore::Add(const std::string& name,
                                                bool create,
                                                const Layout& layout,
                                                Range positions, TypedTensor k,
                                                TypedTensor v) {
  absl::MutexLock lock(&mutex_);
  auto found = contexts_.find(name);
  const bool exists = found != contexts_.end();
  RINGATTN_RETURN_IF_ERROR(CheckAddition(
      name, create, exists, exists ? found->second.layout : Layout{}, layout));
  if (exists) {
    RINGATTN_RETURN_IF_ERROR(found->second.held.CheckAppend(name, positions));
  }
  RINGATTN_RETURN_IF_ERROR(UseCudaDevice(device_));
  if (stream_.get() == nullptr) {
    absl::StatusOr<CudaStream> stream = CudaStream::Create();
    if (!stream.ok()) return stream.status();
    stream_ = *std::move(stream);
  }
  Context fresh;
  if (!exists) {
    fresh.layout = layout;
    fresh.dtype = ComputeDTypeFor(k.dtype());
  }
  Context& context = exists ? found->second : fresh;
  const int64_t count = positions.size();
  const int64_t at = context.held.rows();
  RINGATTN_RETURN_IF_ERROR(Reserve(name, context, at + count));
  if (count > 0) {
    const DType host = HostDTypeOf(context.dtype);
    const int64_t pitch = RowBytes(context);
    const int64_t capacity = context.buffers->capacity;
    const TypedTensor rows[] = {InDType(std::move(k), host),
                                InDType(std::move(v), host)};
    const DeviceBuffer* targets[] = {&context.buffers->k, &context.buffers->v};
    // Batch by batch, each within the page locks of a context piece.
    const size_t batch_bytes = static_cast<size_t>(count * pitch);
    for (int i = 0; i < 2; ++i) {
      for (int64_t b = 0; b < layout.batch; ++b) {
        RINGATTN_RETURN_IF_ERROR(CopyInPinnedPieces(
            targets[i]->as<char>() + (b * capacity + at) * pitch,
            rows[i].view().data() + b * batch_bytes, batch_bytes,
            b * batch_bytes, cudaMemcpyHostToDevice, stream_.get(),
            "copying context rows to the device"));
      }
    }
    RINGATTN_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream_.get()),
                                        "copying context rows"));
    context.held.Append(positions);
  }
  const int64_t bytes = BytesOf(context);
  if (!exists) contexts_.emplace(name, std::move(fresh));
  CountAddition();
  return bytes;
}

void DeviceContextStore::Drop(const std::string& name, int64_t keep_length) {
  absl::MutexLock lock(&mutex_);
  auto found = contexts_.find(name);
  if (found == contexts_.end()) return;
  if (keep_length <= 0) {
    contexts_.erase(found);
    return;
  }
  found->second.held.DropFrom(keep_length);
}

int64_t DeviceContextStore::bytes_in_use() {
  absl::MutexLock lock(&mutex_);
  return HeldBytes();
}

absl::StatusOr<DType> DeviceContextStore::HeldDType(const std::string& name) {
  absl::StatusOr<DeviceDType> dtype = DTypeOf(name);
  if (!dtype.ok()) return dtype.status();
  return HostDTypeOf(*dtype);
}

absl::StatusOr<DeviceDType> DeviceContextStore::DTypeOf(
    const std::string& name) {
  absl::MutexLock lock(&mutex_);
  auto found = contexts_.find(name);
  if (found == contexts_.end()) {
    return absl::NotFoundError(
        absl::StrCat("context '", name, "' is not held by this worker"));
  }
  return found->second.dtype;
}

absl::StatusOr<ResidentKv> DeviceContextStore::Find(
    const std::string& name, const std::vector<Range>& chunks) {
  absl::MutexLock lock(&mutex_);
  auto found = contexts_.find(name);
  if (found == contexts_.end()) {
    return absl::NotFoundError(
        absl::StrCat("context '", name, "' is not held by this worker"));
  }
  const Context& context = found->second;
  absl::StatusOr<Range> rows = context.held.RowsOf(name, chunks);
  if (!rows.ok()) return rows.status();
  ResidentKv kv;
  kv.dtype = context.dtype;
  kv.rows = rows->size();
  if (context.buffers) {
    const int64_t offset = rows->begin * RowBytes(context);
    kv.k = context.buffers->k.as<char>() + offset;
    kv.v = context.buffers->v.as<char>() + offset;
    kv.batch_stride = context.buffers->capacity * context.layout.kv_heads *
                      context.layout.head_dim;
    kv.keep_alive = context.buffers;
  }
  return kv;
}

}  // namespace ringattn
