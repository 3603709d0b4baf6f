#include "server/ring_warm_up.h"

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/dtype.h"
#include "server/attention_service.h"
#include "spdlog/spdlog.h"

namespace ringattn {
namespace {

// One tiny request as a client would stream it: its header, then Q, K and V
// whole in one chunk each, all values 1/8 in bf16. The output is counted and
// dropped.
class WarmUpStream final : public RequestStream {
 public:
  explicit WarmUpStream(const v1::AttentionSpec& spec) {
    v1::AttendRequest header;
    *header.mutable_header() = spec;
    messages_.push_back(std::move(header));
    const uint16_t eighth = FloatToBFloat16(0.125f);
    for (const v1::TensorName tensor : {v1::Q, v1::K, v1::V}) {
      const bool query = tensor == v1::Q;
      const int64_t tokens = query ? spec.q_len() : spec.kv_len();
      const int64_t heads = query ? spec.q_heads() : spec.kv_heads();
      std::vector<uint16_t> values(
          static_cast<size_t>(tokens * heads * spec.head_dim()), eighth);
      v1::AttendRequest message;
      v1::TensorChunk* chunk = message.mutable_chunk();
      chunk->set_tensor(tensor);
      chunk->set_token_count(tokens);
      chunk->set_data(values.data(), values.size() * sizeof(uint16_t));
      messages_.push_back(std::move(message));
    }
  }

  bool Read(v1::AttendRequest* request) override {
    if (next_ == messages_.size()) return false;
    *request = std::move(messages_[next_++]);
    return true;
  }
  bool Write(const v1::AttendResponse& response) override {
    if (response.has_output()) rows_ += response.output().token_count();
    return true;
  }
  bool WriteLast(const v1::AttendResponse& response) override {
    return Write(response);
  }
  void SendInitialMetadata() override {}
  const std::string& context_name() const override { return none_; }
  int64_t append_length() const override { return 0; }

  int64_t rows() const { return rows_; }

 private:
  std::vector<v1::AttendRequest> messages_;
  size_t next_ = 0;
  int64_t rows_ = 0;
  const std::string none_;
};

v1::AttentionSpec WarmUpSpec(int64_t workers, v1::Strategy strategy) {
  v1::AttentionSpec spec;
  spec.set_batch(1);
  // Two rows per worker: every rank holds a block, so every link carries one.
  spec.set_kv_len(2 * workers);
  spec.set_q_len(strategy == v1::BROADCAST_Q ? 1 : 2 * workers);
  spec.set_q_heads(1);
  spec.set_kv_heads(1);
  spec.set_head_dim(128);
  spec.set_wire_dtype(v1::BF16);
  spec.set_output_dtype(v1::BF16);
  spec.set_strategy(strategy);
  if (strategy == v1::BROADCAST_Q) {
    spec.set_partial_merge(v1::MERGE_ON_WORKERS);
  }
  return spec;
}

}  // namespace

RingWarmUp::RingWarmUp(const CoordinatorState& state)
    : state_(state), metrics_(state.metrics) {
  DeclareCoordinatorMetrics(own_metrics_);
  state_.metrics = &own_metrics_;
  state_.warm_up = true;
  metrics_->Declare("ringattn_ring_warm_ups_total",
                    "Warm-ups that had a newly formed cluster make its ring "
                    "communicators, one per kept slot, by result: ok or "
                    "failed.",
                    Metrics::Kind::kCounter);
}

RingWarmUp::~RingWarmUp() {
  std::thread thread;
  {
    absl::MutexLock lock(&mutex_);
    thread.swap(thread_);
  }
  if (thread.joinable()) thread.join();
}

void RingWarmUp::Poll() {
  absl::StatusOr<Cluster::Membership> membership =
      state_.cluster->ReadyMembership();
  if (!membership.ok() || membership->members.size() < 2) return;
  absl::MutexLock lock(&mutex_);
  if (running_ || membership->epoch == last_epoch_) return;
  last_epoch_ = membership->epoch;
  if (state_.communicator_keys->Reusable(membership->epoch)) return;
  if (thread_.joinable()) thread_.join();  // finished: running_ is false
  running_ = true;
  thread_ = std::thread(&RingWarmUp::Run, this, membership->epoch);
}

void RingWarmUp::Run(int64_t epoch) {
  spdlog::info(
      "warming up the ring of epoch {} ({} workers, {} kept "
      "communicators)",
      epoch, state_.cluster->world_size(), state_.communicator_keys->slots());
  const auto start = std::chrono::steady_clock::now();
  // The rings run at once, so that the NCCL set-ups overlap; each takes a
  // slot not made yet (CoordinatorState::warm_up).
  std::vector<grpc::Status> rings(
      static_cast<size_t>(state_.communicator_keys->slots()));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < rings.size(); ++i) {
    threads.emplace_back([this, epoch, i, &rings] {
      rings[i] = RunOne(epoch, v1::PASS_KV, static_cast<int>(i));
    });
  }
  for (std::thread& thread : threads) thread.join();
  grpc::Status status;
  for (const grpc::Status& ring : rings) {
    if (status.ok()) status = ring;
  }
  if (status.ok()) status = RunOne(epoch, v1::BROADCAST_Q, 0);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  if (status.ok()) {
    spdlog::info("ring of epoch {} warm in {:.3f} s", epoch, seconds);
  } else {
    spdlog::warn(
        "warming up the ring of epoch {} failed after {:.3f} s ({}); the "
        "first request will make the communicator itself",
        epoch, seconds, status.error_message());
  }
  metrics_->Add("ringattn_ring_warm_ups_total",
                {{"result", status.ok() ? "ok" : "failed"}}, 1);
  absl::MutexLock lock(&mutex_);
  running_ = false;
}

grpc::Status RingWarmUp::RunOne(int64_t epoch, v1::Strategy strategy,
                                int index) {
  const v1::AttentionSpec spec =
      WarmUpSpec(state_.cluster->world_size(), strategy);
  WarmUpStream stream(spec);
  grpc::ServerContext context;
  const grpc::Status status =
      RunAttendCall(state_, &context, &stream,
                    absl::StrCat("warm-up-", epoch, "-",
                                 v1::Strategy_Name(strategy), "-", index));
  if (status.ok() && stream.rows() != spec.q_len()) {
    return grpc::Status(grpc::StatusCode::INTERNAL,
                        absl::StrCat("the workers returned ", stream.rows(),
                                     " of ", spec.q_len(), " output rows"));
  }
  return status;
}

}  // namespace ringattn
