#include "server/context_upload.h"

#include <memory>
#include <optional>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/dtype.h"
#include "core/status_macros.h"
#include "proto/grpc_status.h"
#include "proto/spec_conversion.h"
#include "ringattn/v1/worker.grpc.pb.h"
#include "server/row_coverage.h"
#include "spdlog/spdlog.h"

namespace ringattn {
namespace {

// One worker's StoreContext stream for this upload.
struct StoreLink {
  Cluster::Member member;
  grpc::ClientContext context;
  v1::StoreContextResponse response;
  std::unique_ptr<grpc::ClientWriter<v1::StoreContextRequest>> writer;
};

class Upload {
 public:
  Upload(const CoordinatorState& state, grpc::ServerContext* context,
         grpc::ServerReader<v1::ContextUpload>* reader, bool create)
      : state_(state), context_(context), reader_(reader), create_(create) {}

  absl::StatusOr<v1::ContextInfo> Run();

 private:
  absl::Status ReadHeader();
  absl::Status OpenWorkers();
  absl::Status RouteChunk(const v1::TensorChunk& chunk, int64_t index);
  absl::Status FinishWorkers();
  absl::Status WorkerError(const StoreLink& link, const grpc::Status& status);

  const CoordinatorState& state_;
  grpc::ServerContext* const context_;
  grpc::ServerReader<v1::ContextUpload>* const reader_;
  const bool create_;

  v1::ContextHeader header_;
  DType dtype_ = DType::kFloat32;
  ResidentContext before_;
  std::vector<Range> runs_;  // new positions per rank
  std::vector<std::unique_ptr<StoreLink>> links_;
  std::vector<RowCoverage> coverage_;  // K batches, then V batches
  AdmissionControl::Ticket ticket_;
};

absl::Status Upload::ReadHeader() {
  v1::ContextUpload message;
  if (!reader_->Read(&message) || !message.has_header()) {
    return absl::InvalidArgumentError(
        "the first message must be the header (a ContextHeader)");
  }
  header_ = message.header();
  if (header_.name().empty()) {
    return absl::InvalidArgumentError("field 'name' must not be empty");
  }
  if (header_.length() < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "field 'length' (tokens this upload adds) must be >= 1, got ",
        header_.length()));
  }
  absl::StatusOr<DType> dtype = DTypeFromProto(header_.wire_dtype());
  if (!dtype.ok()) return dtype.status();
  dtype_ = *dtype;
  return absl::OkStatus();
}

absl::Status Upload::WorkerError(const StoreLink& link,
                                 const grpc::Status& status) {
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
    state_.cluster->MarkDead(link.member.rank, link.member.address);
    return absl::UnavailableError(
        absl::StrCat("worker ", link.member.rank, " (", link.member.address,
                     ") failed during the upload: ", status.error_message()));
  }
  return absl::Status(
      static_cast<absl::StatusCode>(status.error_code()),
      absl::StrCat("worker ", link.member.rank, ": ", status.error_message()));
}

absl::Status Upload::OpenWorkers() {
  absl::StatusOr<std::vector<Cluster::Member>> members =
      state_.cluster->ReadyMembers();
  if (!members.ok()) return members.status();
  const int64_t p = static_cast<int64_t>(members->size());
  if (create_) {
    auto positive = [](const char* field, int64_t value) -> absl::Status {
      if (value >= 1) return absl::OkStatus();
      return absl::InvalidArgumentError(
          absl::StrCat("field '", field, "' must be >= 1, got ", value));
    };
    RINGATTN_RETURN_IF_ERROR(positive("batch", header_.batch()));
    RINGATTN_RETURN_IF_ERROR(positive("kv_heads", header_.kv_heads()));
    if (header_.head_dim() < 1 || header_.head_dim() > kMaxHeadDim) {
      return absl::InvalidArgumentError(
          absl::StrCat("field 'head_dim' must be in [1, ", kMaxHeadDim,
                       "], got ", header_.head_dim()));
    }
    before_.batch = header_.batch();
    before_.kv_heads = header_.kv_heads();
    before_.head_dim = header_.head_dim();
    before_.chunks.assign(static_cast<size_t>(p), {});
    for (const Cluster::Member& member : *members) {
      before_.addresses.push_back(member.address);
    }
  } else {
    for (const Cluster::Member& member : *members) {
      if (before_.addresses[member.rank] != member.address) {
        return absl::FailedPreconditionError(absl::StrCat(
            "context '", before_.name, "' lost its part on rank ", member.rank,
            " when worker ", before_.addresses[member.rank],
            " left the cluster; delete the context and create it again"));
      }
    }
  }
  const int64_t bytes = 2 * before_.batch * header_.length() *
                        before_.kv_heads * before_.head_dim * DTypeSize(dtype_);
  if (bytes > state_.options.max_request_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the upload sends ", bytes, " bytes of K and V but the limit is ",
        state_.options.max_request_bytes,
        " bytes (--max_request_bytes); upload in smaller appends"));
  }
  absl::StatusOr<AdmissionControl::Ticket> ticket =
      state_.admission->Admit(bytes, absl::FromChrono(context_->deadline()));
  if (!ticket.ok()) return ticket.status();
  ticket_ = std::move(*ticket);

  std::vector<int64_t> held;
  for (const std::vector<Range>& chunks : before_.chunks) {
    int64_t rows = 0;
    for (const Range& chunk : chunks) rows += chunk.size();
    held.push_back(rows);
  }
  runs_ = BalancedRuns(held, before_.length, header_.length());
  for (int b = 0; b < 2 * before_.batch; ++b) {
    coverage_.emplace_back(header_.length());
  }
  for (const Cluster::Member& member : *members) {
    auto link = std::make_unique<StoreLink>();
    link->member = member;
    link->context.set_deadline(context_->deadline());
    link->writer = member.stub->StoreContext(&link->context, &link->response);
    v1::StoreContextRequest request;
    v1::StoreContextHeader* h = request.mutable_header();
    h->set_name(header_.name());
    h->set_create(create_);
    h->set_batch(before_.batch);
    h->set_kv_heads(before_.kv_heads);
    h->set_head_dim(before_.head_dim);
    h->set_wire_dtype(header_.wire_dtype());
    h->set_first_position(runs_[member.rank].begin);
    h->set_count(runs_[member.rank].size());
    if (!link->writer->Write(request)) {
      return WorkerError(*link, link->writer->Finish());
    }
    links_.push_back(std::move(link));
  }
  return absl::OkStatus();
}

absl::Status Upload::RouteChunk(const v1::TensorChunk& chunk, int64_t index) {
  if (chunk.tensor() != v1::K && chunk.tensor() != v1::V) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk ", index,
                     ": a context holds K and V; field 'tensor' must be "
                     "K or V"));
  }
  const char* name = chunk.tensor() == v1::K ? "K" : "V";
  if (chunk.batch() < 0 || chunk.batch() >= before_.batch) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk ", index, ": tensor ", name, " batch ",
                     chunk.batch(), " is outside [0, ", before_.batch, ")"));
  }
  const int64_t begin = chunk.token_offset();
  const int64_t count = chunk.token_count();
  if (count < 1 || begin < 0 || begin + count > header_.length()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk ", index, ": tensor ", name, " tokens [", begin, ", ",
        begin + count, ") are not inside [0, ", header_.length(),
        ") (this upload adds ", header_.length(), " tokens)"));
  }
  const int64_t row_bytes =
      before_.kv_heads * before_.head_dim * DTypeSize(dtype_);
  if (static_cast<int64_t>(chunk.data().size()) != count * row_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk ", index, ": tensor ", name, " carries ", chunk.data().size(),
        " bytes but ", count, " tokens x ", before_.kv_heads, " heads x ",
        before_.head_dim, " dims of ", DTypeName(dtype_), " need ",
        count * row_bytes));
  }
  RowCoverage& coverage =
      coverage_[(chunk.tensor() == v1::K ? 0 : before_.batch) + chunk.batch()];
  if (std::optional<Range> twice = coverage.Mark(begin, begin + count)) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk ", index, ": tensor ", name, " batch ",
                     chunk.batch(), " tokens [", twice->begin, ", ", twice->end,
                     ") were already sent (duplicate or overlapping chunk)"));
  }
  const Range positions{before_.length + begin, before_.length + begin + count};
  for (const auto& link : links_) {
    const Range part = positions.Intersect(runs_[link->member.rank]);
    if (part.empty()) continue;
    v1::StoreContextRequest request;
    v1::ShardRows* rows = request.mutable_rows();
    rows->set_tensor(chunk.tensor());
    rows->set_batch(chunk.batch());
    rows->set_first_position(part.begin);
    rows->set_count(part.size());
    rows->set_data(chunk.data().substr(
        (part.begin - positions.begin) * row_bytes, part.size() * row_bytes));
    if (!link->writer->Write(request)) {
      return WorkerError(*link, link->writer->Finish());
    }
  }
  return absl::OkStatus();
}

absl::Status Upload::FinishWorkers() {
  absl::Status first = absl::OkStatus();
  for (const auto& link : links_) {
    link->writer->WritesDone();
    const grpc::Status status = link->writer->Finish();
    if (!status.ok() && first.ok()) first = WorkerError(*link, status);
  }
  return first;
}

absl::StatusOr<v1::ContextInfo> Upload::Run() {
  RINGATTN_RETURN_IF_ERROR(ReadHeader());
  absl::StatusOr<ResidentContext> before =
      state_.contexts->BeginUpload(header_.name(), create_);
  if (!before.ok()) return before.status();
  before_ = std::move(*before);
  std::optional<ResidentContext> committed;
  absl::Cleanup end_upload = [&] {
    state_.contexts->EndUpload(header_.name(), std::move(committed));
  };
  absl::Status status = OpenWorkers();
  v1::ContextUpload message;
  for (int64_t index = 1; status.ok() && reader_->Read(&message); ++index) {
    status = message.has_chunk() ? RouteChunk(message.chunk(), index)
                                 : absl::InvalidArgumentError(absl::StrCat(
                                       "message ", index,
                                       " is not a tensor chunk (send the "
                                       "header once, first)"));
  }
  if (status.ok() && context_->IsCancelled()) {
    status = absl::CancelledError("the client went away during the upload");
  }
  for (size_t i = 0; status.ok() && i < coverage_.size(); ++i) {
    if (std::optional<Range> missing = coverage_[i].FirstMissing()) {
      status = absl::InvalidArgumentError(absl::StrCat(
          "tensor ", i < static_cast<size_t>(before_.batch) ? "K" : "V",
          " batch ", i % before_.batch, " is missing tokens [", missing->begin,
          ", ", missing->end, "); send every token row exactly once"));
    }
  }
  if (status.ok()) {
    status = FinishWorkers();
  } else {
    for (const auto& link : links_) link->context.TryCancel();
  }
  if (!status.ok()) {
    // Workers that stored their part drop it again.
    DropOnWorkers(state_, header_.name(), create_ ? 0 : before_.length);
    return status;
  }
  ResidentContext after = before_;
  after.name = header_.name();
  after.length += header_.length();
  after.bytes = 0;
  for (const auto& link : links_) {
    const Range run = runs_[link->member.rank];
    std::vector<Range>& chunks = after.chunks[link->member.rank];
    if (!run.empty()) {
      if (!chunks.empty() && chunks.back().end == run.begin) {
        chunks.back().end = run.end;
      } else {
        chunks.push_back(run);
      }
    }
    after.bytes += link->response.bytes();
  }
  committed = after;
  spdlog::info("context '{}': {} tokens ({} bytes over {} workers)", after.name,
               after.length, after.bytes, links_.size());
  return after.Info();
}

}  // namespace

void DropOnWorkers(const CoordinatorState& state, const std::string& name,
                   int64_t keep_length) {
  absl::StatusOr<std::vector<Cluster::Member>> members =
      state.cluster->ReadyMembers();
  if (!members.ok()) return;
  for (const Cluster::Member& member : *members) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(5));
    v1::DropContextRequest request;
    request.set_name(name);
    request.set_keep_length(keep_length);
    v1::DropContextResponse response;
    member.stub->DropContext(&context, request, &response);
  }
}

grpc::Status RunContextUpload(const CoordinatorState& state,
                              grpc::ServerContext* context,
                              grpc::ServerReader<v1::ContextUpload>* reader,
                              bool create, v1::ContextInfo* response) {
  Upload upload(state, context, reader, create);
  absl::StatusOr<v1::ContextInfo> info = upload.Run();
  if (!info.ok()) {
    spdlog::info("context upload failed: {}", info.status().ToString());
    return ToGrpcStatus(info.status());
  }
  *response = *info;
  return grpc::Status::OK;
}

}  // namespace ringattn
