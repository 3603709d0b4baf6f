#include "server/context_upload.h"

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/dtype.h"
#include "core/status_macros.h"
#include "proto/grpc_status.h"
#include "proto/spec_conversion.h"
#include "ringattn/v1/worker.grpc.pb.h"
#include "server/context_append.h"
#include "server/shared_upload.h"
#include "spdlog/spdlog.h"

namespace ringattn {
namespace {

class Upload {
 public:
  Upload(const CoordinatorState& state, grpc::ServerContext* context,
         grpc::ServerReader<v1::ContextUpload>* reader, bool create,
         std::string request_id)
      : state_(state),
        context_(context),
        reader_(reader),
        create_(create),
        request_id_(std::move(request_id)) {}

  absl::StatusOr<v1::ContextInfo> Run();

 private:
  absl::Status ReadHeader();
  absl::Status Start();
  // Routes the chunks of this call's own stream and, with upload_streams
  // > 1, of its attached streams.
  absl::Status ReadChunks();

  const CoordinatorState& state_;
  grpc::ServerContext* const context_;
  grpc::ServerReader<v1::ContextUpload>* const reader_;
  const bool create_;
  const std::string request_id_;

  v1::ContextHeader header_;
  DType dtype_ = DType::kFloat32;
  ResidentContext before_;
  std::unique_ptr<ContextAppend> append_;
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
  return CheckStreamCount("upload_streams", header_.upload_streams());
}

absl::Status Upload::ReadChunks() {
  std::shared_ptr<SharedUpload> shared;
  if (header_.upload_streams() > 1) {
    shared = std::make_shared<SharedUpload>(
        request_id_, NewUploadToken(), header_.upload_streams() - 1,
        absl::Now() + state_.options.ring_timeout, context_,
        [this](v1::TensorChunk& chunk, int64_t index) {
          return append_->Route(chunk, index);
        });
    state_.uploads->Add(shared);
    context_->AddInitialMetadata(kRequestIdKey, request_id_);
    context_->AddInitialMetadata(kUploadTokenKey, shared->token());
    reader_->SendInitialMetadata();
  }
  absl::Cleanup close = [&] {
    if (shared == nullptr) return;
    state_.uploads->Remove(request_id_);
    shared->Close();
  };
  v1::ContextUpload message;
  for (int64_t index = 1; reader_->Read(&message); ++index) {
    if (!message.has_chunk()) {
      return absl::InvalidArgumentError(
          absl::StrCat("message ", index,
                       " is not a tensor chunk (send the header once, first)"));
    }
    RINGATTN_RETURN_IF_ERROR(
        shared != nullptr ? shared->Take(0, *message.mutable_chunk(), index)
                          : append_->Route(*message.mutable_chunk(), index));
  }
  if (shared != nullptr) {
    // An attached stream's failure cancels this call: it comes first.
    RINGATTN_RETURN_IF_ERROR(shared->AwaitAttachedStreams());
  }
  if (context_->IsCancelled()) {
    return absl::CancelledError("the client went away during the upload");
  }
  return absl::OkStatus();
}

absl::Status Upload::Start() {
  absl::StatusOr<std::vector<Cluster::Member>> members =
      state_.cluster->ReadyMembers();
  if (!members.ok()) return members.status();
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
    before_.chunks.assign(members->size(), {});
    before_.worker_bytes.assign(members->size(), 0);
    before_.worker_dtypes.assign(members->size(), v1::DTYPE_UNSPECIFIED);
    for (const Cluster::Member& member : *members) {
      before_.addresses.push_back(member.address);
    }
  } else {
    RINGATTN_RETURN_IF_ERROR(CheckContextMembers(before_, *members));
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
  absl::StatusOr<std::unique_ptr<ContextAppend>> append = ContextAppend::Start(
      *members, before_, create_, header_.length(), dtype_,
      context_->deadline(), state_.options.row_streams_min_bytes);
  if (!append.ok()) return append.status();
  append_ = std::move(*append);
  if (const int streams = append_->row_streams(); streams > 0) {
    spdlog::info("context '{}': rows go over {} more streams", header_.name(),
                 streams);
    state_.metrics->Add("ringattn_worker_row_streams_total", {},
                        static_cast<double>(streams));
  }
  return absl::OkStatus();
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
  absl::Status status = Start();
  if (status.ok()) status = ReadChunks();
  if (status.ok()) status = append_->CheckComplete();
  if (status.ok()) status = append_->Finish();
  if (!status.ok()) {
    // Workers that stored their part drop it again.
    append_.reset();
    DropOnWorkers(state_, header_.name(), create_ ? 0 : before_.length);
    return status;
  }
  committed = append_->after();
  spdlog::info("context '{}': {} tokens ({} bytes over {} workers)",
               committed->name, committed->length, committed->bytes,
               committed->addresses.size());
  return committed->Info();
}

}  // namespace

absl::Status CheckContextMembers(const ResidentContext& context,
                                 const std::vector<Cluster::Member>& members) {
  for (const Cluster::Member& member : members) {
    if (context.addresses[member.rank] != member.address) {
      return absl::FailedPreconditionError(absl::StrCat(
          "context '", context.name, "' lost its part on rank ", member.rank,
          " when worker ", context.addresses[member.rank],
          " left the cluster; delete the context and create it again"));
    }
  }
  return absl::OkStatus();
}

void DropOnWorkers(const CoordinatorState& state, const std::string& name,
                   int64_t keep_length, int64_t undone_appends) {
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
    request.set_undone_appends(undone_appends);
    v1::DropContextResponse response;
    member.stub->DropContext(&context, request, &response);
  }
}

grpc::Status RunContextUpload(const CoordinatorState& state,
                              grpc::ServerContext* context,
                              grpc::ServerReader<v1::ContextUpload>* reader,
                              bool create, const std::string& request_id,
                              v1::ContextInfo* response) {
  Upload upload(state, context, reader, create, request_id);
  absl::StatusOr<v1::ContextInfo> info = upload.Run();
  if (!info.ok()) {
    spdlog::info("context upload failed: {}", info.status().ToString());
    return ToGrpcStatus(info.status());
  }
  *response = *info;
  return grpc::Status::OK;
}

}  // namespace ringattn
