// The one translation unit that includes the cuDNN frontend (slow to compile;
// see DESIGN.md, "Examples worth following"). The frontend reports most
// failures as error values but throws from some paths, so every call into it
// sits inside a try block: no exception leaves this file.

#include "kernels/cuda/cudnn_attention.h"

#include <cudnn.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <exception>
#include <list>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cudnn_frontend.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/empty_rows.h"

namespace ringattn {
namespace {

namespace fe = cudnn_frontend;

// Ids of the graph's operands in the variant pack.
constexpr int64_t kQ = 1;
constexpr int64_t kK = 2;
constexpr int64_t kV = 3;
constexpr int64_t kO = 4;
constexpr int64_t kStats = 5;

// What cuDNN is asked to compute: the caller's block less any leading query
// rows that see no key (cuDNN does not take causal blocks with more queries
// than keys), with the LSE rows still strided as in the caller's layout.
struct Block {
  DeviceAttentionArgs args;
  int64_t lse_batch_stride = 0;  // floats between batches of args.lse
};

// Everything a plan depends on: shapes, strides, dtype, scale and masking;
// not the pointers.
using PlanKey = std::array<int64_t, 19>;

PlanKey KeyOf(const Block& block) {
  const DeviceAttentionArgs& a = block.args;
  uint32_t scale_bits = 0;
  std::memcpy(&scale_bits, &a.scale, sizeof(scale_bits));
  return {static_cast<int64_t>(a.dtype),
          a.batch,
          a.q_len,
          a.kv_len,
          a.q_heads,
          a.kv_heads,
          a.head_dim,
          a.q.batch_stride,
          a.q.seq_stride,
          a.k.batch_stride,
          a.k.seq_stride,
          a.v.batch_stride,
          a.v.seq_stride,
          a.o.batch_stride,
          a.o.seq_stride,
          a.lse != nullptr ? 1 : 0,
          block.lse_batch_stride,
          a.causal ? 1 : 0,
          scale_bits};
}

// A built graph with its chosen plan, or why cuDNN refused the key.
struct Plan {
  absl::Status status;
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace_bytes = 0;
};

absl::Status Refused(fe::error_t error, const char* step) {
  return absl::UnimplementedError(
      absl::StrCat("cuDNN does not take this attention block (", step,
                   "): ", error.get_message()));
}

// cuDNN's dims and strides, in its [B, H, S, D] order, of a [B, S, H, D]
// tensor of `heads` x `dim` rows.
template <typename T>
std::pair<std::vector<int64_t>, std::vector<int64_t>> Layout(
    const DeviceTensor<T>& tensor, int64_t batch, int64_t seq, int64_t heads,
    int64_t dim) {
  return {{batch, heads, seq, dim},
          {tensor.batch_stride, dim, tensor.seq_stride, 1}};
}

template <typename T>
fe::graph::Tensor_attributes Input(const char* name, int64_t uid,
                                   const DeviceTensor<T>& tensor, int64_t batch,
                                   int64_t seq, int64_t heads, int64_t dim) {
  auto [dims, strides] = Layout(tensor, batch, seq, heads, dim);
  return fe::graph::Tensor_attributes()
      .set_name(name)
      .set_uid(uid)
      .set_dim(dims)
      .set_stride(strides);
}

// Builds the SDPA graph of `block` and its plan; fills `plan` on success.
absl::Status BuildGraph(cudnnHandle_t handle, const Block& block, Plan& plan) {
  const DeviceAttentionArgs& a = block.args;
  const fe::DataType_t io_type = a.dtype == DeviceDType::kBFloat16
                                     ? fe::DataType_t::BFLOAT16
                                     : fe::DataType_t::HALF;
  auto graph = std::make_shared<fe::graph::Graph>();
  graph->set_io_data_type(io_type)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  auto q = graph->tensor(
      Input("Q", kQ, a.q, a.batch, a.q_len, a.q_heads, a.head_dim));
  auto k = graph->tensor(
      Input("K", kK, a.k, a.batch, a.kv_len, a.kv_heads, a.head_dim));
  auto v = graph->tensor(
      Input("V", kV, a.v, a.batch, a.kv_len, a.kv_heads, a.head_dim));
  auto options = fe::graph::SDPA_attributes()
                     .set_name("attention")
                     .set_generate_stats(a.lse != nullptr)
                     .set_attn_scale(a.scale);
  if (a.causal) options.set_causal_mask_bottom_right(true);
  auto [o, stats] = graph->sdpa(q, k, v, options);
  auto [o_dims, o_strides] =
      Layout(a.o, a.batch, a.q_len, a.q_heads, a.head_dim);
  o->set_output(true).set_uid(kO).set_dim(o_dims).set_stride(o_strides);
  if (a.lse != nullptr) {
    // LSE rows in [B, S, H] order: strides B, H, S = (lse_batch_stride, 1, H).
    stats->set_output(true)
        .set_uid(kStats)
        .set_data_type(fe::DataType_t::FLOAT)
        .set_dim({a.batch, a.q_heads, a.q_len, 1})
        .set_stride({block.lse_batch_stride, 1, a.q_heads, 1});
  }

  if (auto e = graph->validate(); e.is_bad()) return Refused(e, "validate");
  if (auto e = graph->build_operation_graph(handle); e.is_bad()) {
    return Refused(e, "build_operation_graph");
  }
  if (auto e = graph->create_execution_plans({fe::HeurMode_t::A}); e.is_bad()) {
    return Refused(e, "create_execution_plans");
  }
  if (auto e = graph->check_support(handle); e.is_bad()) {
    return Refused(e, "check_support");
  }
  if (auto e =
          graph->build_plans(handle, fe::BuildPlanPolicy_t::HEURISTICS_CHOICE);
      e.is_bad()) {
    return Refused(e, "build_plans");
  }
  int64_t workspace_bytes = 0;
  if (auto e = graph->get_workspace_size(workspace_bytes); e.is_bad()) {
    return Refused(e, "get_workspace_size");
  }
  plan.graph = std::move(graph);
  plan.workspace_bytes = workspace_bytes;
  return absl::OkStatus();
}

Plan BuildPlan(cudnnHandle_t handle, const Block& block) {
  Plan plan;
  try {
    plan.status = BuildGraph(handle, block, plan);
  } catch (const std::exception& e) {
    plan.status = absl::UnimplementedError(absl::StrCat(
        "cuDNN does not take this attention block (frontend threw): ",
        e.what()));
  }
  if (!plan.status.ok()) plan.graph.reset();
  return plan;
}

bool Aligned16(const void* pointer) {
  return reinterpret_cast<uintptr_t>(pointer) % 16 == 0;
}

// `tensor` moved on by `rows` sequence positions of 16-bit elements.
template <typename T>
DeviceTensor<T> SkipRows(DeviceTensor<T> tensor, int64_t rows) {
  using Byte = std::conditional_t<std::is_const_v<T>, const char, char>;
  tensor.data = static_cast<Byte*>(tensor.data) + rows * tensor.seq_stride * 2;
  return tensor;
}

// Leading rows of `args` that see no key: all of them without keys, and
// under causal masking those before the last kv_len.
int64_t EmptyRows(const DeviceAttentionArgs& args) {
  return args.causal || args.kv_len == 0
             ? std::max<int64_t>(0, args.q_len - args.kv_len)
             : 0;
}

// What cuDNN computes of `args`: the block less its `empty_rows` leading rows.
Block TrimmedBlock(const DeviceAttentionArgs& args, int64_t empty_rows) {
  Block block;
  block.args = args;
  block.args.q_len = args.q_len - empty_rows;
  block.args.q = SkipRows(args.q, empty_rows);
  block.args.o = SkipRows(args.o, empty_rows);
  if (args.lse != nullptr) {
    block.args.lse = args.lse + empty_rows * args.q_heads;
  }
  block.lse_batch_stride = args.q_len * args.q_heads;
  return block;
}

// Keys seen once without a plan that a CudnnAttention remembers; it forgets
// them all when there are more.
constexpr size_t kMostSightings = 1024;

struct HandleDeleter {
  void operator()(cudnnHandle_t handle) const { cudnnDestroy(handle); }
};
using HandlePtr =
    std::unique_ptr<std::remove_pointer_t<cudnnHandle_t>, HandleDeleter>;

}  // namespace

class CudnnAttention::Impl {
 public:
  Impl(HandlePtr handle, int max_plans)
      : handle_(std::move(handle)), max_plans_(max_plans) {}

  absl::Status Forward(const DeviceAttentionArgs& args, cudaStream_t stream) {
    if (const char* problem = FindAttentionArgsProblem(args)) {
      return absl::InvalidArgumentError(problem);
    }
    if (args.work.tile_count > 0) {
      return absl::UnimplementedError(
          "cuDNN attention takes whole blocks, not work lists");
    }
    if (args.batch == 0 || args.q_len == 0) return absl::OkStatus();
    const int64_t empty_rows = EmptyRows(args);
    if (empty_rows == args.q_len) {
      return CudaStatus(LaunchMarkRowsEmpty(args, empty_rows, stream),
                        "marking rows that see no key");
    }
    const Block block = TrimmedBlock(args, empty_rows);
    // The backend reads rows with 16-byte vector loads and does not check
    // the pointers itself.
    if (!Aligned16(block.args.q.data) || !Aligned16(block.args.k.data) ||
        !Aligned16(block.args.v.data) || !Aligned16(block.args.o.data)) {
      return absl::UnimplementedError(
          "cuDNN attention needs 16-byte aligned Q, K, V and O rows");
    }

    absl::StatusOr<const Plan*> found = FindPlan(block, stream);
    if (!found.ok()) return found.status();
    const Plan& plan = **found;
    if (!plan.status.ok()) return plan.status;

    if (empty_rows > 0) {
      if (absl::Status s =
              CudaStatus(LaunchMarkRowsEmpty(args, empty_rows, stream),
                         "marking rows that see no key");
          !s.ok()) {
        return s;
      }
    }
    if (plan.workspace_bytes > static_cast<int64_t>(workspace_.bytes())) {
      // Freeing the old buffer waits for the device, so work still using it
      // finishes first.
      workspace_ = DeviceBuffer();
      absl::StatusOr<DeviceBuffer> grown =
          DeviceBuffer::Allocate(static_cast<size_t>(plan.workspace_bytes));
      if (!grown.ok()) return grown.status();
      workspace_ = *std::move(grown);
    }
    if (cudnnStatus_t s = cudnnSetStream(handle_.get(), stream);
        s != CUDNN_STATUS_SUCCESS) {
      return absl::InternalError(
          absl::StrCat("cudnnSetStream: ", cudnnGetErrorString(s)));
    }
    std::unordered_map<int64_t, void*> pack = {
        {kQ, const_cast<void*>(block.args.q.data)},
        {kK, const_cast<void*>(block.args.k.data)},
        {kV, const_cast<void*>(block.args.v.data)},
        {kO, block.args.o.data}};
    if (block.args.lse != nullptr) pack[kStats] = block.args.lse;
    try {
      if (auto e =
              plan.graph->execute(handle_.get(), pack, workspace_.as<void>());
          e.is_bad()) {
        return absl::InternalError(
            absl::StrCat("cuDNN attention failed to run: ", e.get_message()));
      }
    } catch (const std::exception& e) {
      return absl::InternalError(
          absl::StrCat("cuDNN attention threw while running: ", e.what()));
    }
    return absl::OkStatus();
  }

  bool WorthRunning(const DeviceAttentionArgs& args) {
    if (FindAttentionArgsProblem(args) != nullptr || args.work.tile_count > 0 ||
        args.batch == 0 || args.q_len == 0) {
      return true;
    }
    const int64_t empty_rows = EmptyRows(args);
    if (empty_rows == args.q_len) return true;
    const PlanKey key = KeyOf(TrimmedBlock(args, empty_rows));
    if (plans_.count(key) > 0) return true;
    const double flops = 4.0 * static_cast<double>(args.batch) *
                         static_cast<double>(args.q_len) *
                         static_cast<double>(args.kv_len) *
                         static_cast<double>(args.q_heads * args.head_dim);
    if (flops < kMinPlanFlops) return false;
    if (sightings_.erase(key) > 0) return true;
    if (sightings_.size() >= kMostSightings) sightings_.clear();
    sightings_.insert(key);
    return false;
  }

  int64_t cached_plans() const { return static_cast<int64_t>(plans_.size()); }
  int64_t built_plans() const { return built_plans_; }

 private:
  struct Entry {
    Plan plan;
    std::list<PlanKey>::iterator use;  // its place in recent_
  };

  // The plan of `block`, built now if the cache lacks it; the least recently
  // used plan is dropped once the cache is full, after the work already on
  // `stream` (which may still run its kernel) is done.
  absl::StatusOr<const Plan*> FindPlan(const Block& block,
                                       cudaStream_t stream) {
    const PlanKey key = KeyOf(block);
    if (auto found = plans_.find(key); found != plans_.end()) {
      recent_.splice(recent_.begin(), recent_, found->second.use);
      return &found->second.plan;
    }
    if (static_cast<int>(plans_.size()) >= max_plans_) {
      if (absl::Status s = CudaStatus(cudaStreamSynchronize(stream),
                                      "finishing work before dropping a plan");
          !s.ok()) {
        return s;
      }
      plans_.erase(recent_.back());
      recent_.pop_back();
    }
    recent_.push_front(key);
    Entry& entry = plans_[key];
    entry.plan = BuildPlan(handle_.get(), block);
    entry.use = recent_.begin();
    ++built_plans_;
    return &entry.plan;
  }

  HandlePtr handle_;
  const int max_plans_;
  std::map<PlanKey, Entry> plans_;
  std::list<PlanKey> recent_;    // the cached keys, most recently used first
  std::set<PlanKey> sightings_;  // keys seen once, without a plan
  int64_t built_plans_ = 0;
  DeviceBuffer workspace_;
};

absl::StatusOr<std::unique_ptr<CudnnAttention>> CudnnAttention::Create(
    int max_plans) {
  if (max_plans < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CudnnAttention needs room for at least one plan, got ", max_plans));
  }
  cudnnHandle_t handle = nullptr;
  if (cudnnStatus_t s = cudnnCreate(&handle); s != CUDNN_STATUS_SUCCESS) {
    char detail[256] = {};
    cudnnGetLastErrorString(detail, sizeof(detail));
    return absl::UnavailableError(absl::StrCat(
        "cudnnCreate: ", cudnnGetErrorString(s), " (", detail, ")"));
  }
  return std::unique_ptr<CudnnAttention>(
      new CudnnAttention(std::make_unique<Impl>(HandlePtr(handle), max_plans)));
}

CudnnAttention::CudnnAttention(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}

CudnnAttention::~CudnnAttention() = default;

absl::Status CudnnAttention::Forward(const DeviceAttentionArgs& args,
                                     cudaStream_t stream) {
  return impl_->Forward(args, stream);
}

bool CudnnAttention::WorthRunning(const DeviceAttentionArgs& args) {
  return impl_->WorthRunning(args);
}

int64_t CudnnAttention::cached_plans() const { return impl_->cached_plans(); }

int64_t CudnnAttention::built_plans() const { return impl_->built_plans(); }

int64_t CudnnAttention::LibraryVersion() {
  return static_cast<int64_t>(cudnnGetVersion());
}

}  // namespace ringattn
