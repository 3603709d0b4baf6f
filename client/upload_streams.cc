#include "client/upload_streams.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "proto/grpc_status.h"

namespace ringattn {
namespace {

// Initial metadata keys of the ticket (attention.proto, upload_streams).
constexpr char kRequestIdKey[] = "ringattn-request-id";
constexpr char kUploadTokenKey[] = "ringattn-upload-token";

// Whether an attached stream's `status` only says that the request's upload
// ended before the stream did: the coordinator cancelled it (CANCELLED), or
// the upload was over when it came (NOT_FOUND, FAILED_PRECONDITION). The
// Attend call then ends with the reason on its own.
bool EndedWithTheUpload(const absl::Status& status) {
  return absl::IsCancelled(status) || absl::IsNotFound(status) ||
         absl::IsFailedPrecondition(status);
}

}  // namespace

SharedChunks::SharedChunks(ChunkSource* source, int streams, Report report)
    : report_(std::move(report)),
      total_bytes_(source->total_bytes()),
      source_(source),
      in_flight_(static_cast<size_t>(streams), 0) {}

bool SharedChunks::Next(int stream, v1::TensorChunk* chunk) {
  absl::MutexLock lock(&mutex_);
  bytes_done_ += in_flight_[stream];
  in_flight_[stream] = 0;
  const bool more = source_->Next(chunk);
  if (more) in_flight_[stream] = static_cast<int64_t>(chunk->data().size());
  if (report_) report_(bytes_done_, total_bytes_);
  return more;
}

AttachedUploads::AttachedUploads(
    const std::vector<std::unique_ptr<v1::Attention::Stub>>& stubs,
    SharedChunks* chunks, const Prepare& prepare,
    std::function<void()> on_failure)
    : stubs_(stubs),
      chunks_(chunks),
      on_failure_(std::move(on_failure)),
      statuses_(stubs_.size()) {
  const int streams = static_cast<int>(stubs_.size());
  for (int i = 0; i < streams; ++i) {
    contexts_.push_back(std::make_unique<grpc::ClientContext>());
    prepare(contexts_.back().get());
  }
  for (int i = 1; i <= streams; ++i)
    threads_.emplace_back([this, i] { Run(i); });
}

AttachedUploads::~AttachedUploads() {
  CancelAll();
  for (std::thread& thread : threads_) thread.join();
}

void AttachedUploads::TakeTicket(
    const std::multimap<grpc::string_ref, grpc::string_ref>& metadata) {
  const auto request_id = metadata.find(kRequestIdKey);
  const auto token = metadata.find(kUploadTokenKey);
  absl::MutexLock lock(&mutex_);
  if (ticket_.has_value()) return;
  if (request_id == metadata.end() || token == metadata.end()) {
    ticket_ = absl::FailedPreconditionError(
        "the server handed out no upload ticket for the attached streams; it "
        "may predate AttachUpload: send with upload_streams = 1");
    return;
  }
  v1::UploadTicket ticket;
  ticket.set_request_id(
      std::string(request_id->second.data(), request_id->second.size()));
  ticket.set_token(std::string(token->second.data(), token->second.size()));
  ticket_ = std::move(ticket);
}

absl::Status AttachedUploads::Finish(const absl::Status& status) {
  {
    absl::MutexLock lock(&mutex_);
    if (!ticket_.has_value()) {
      ticket_ = absl::CancelledError(
          "the Attend call ended before it handed out an upload ticket");
    }
  }
  if (!status.ok()) CancelAll();
  for (std::thread& thread : threads_) thread.join();
  threads_.clear();
  absl::MutexLock lock(&mutex_);
  const auto explains = [](const absl::Status& s) {
    return !s.ok() && !absl::IsCancelled(s);
  };
  // A server that hands out no ticket explains the rest (rows missing).
  if (explains(ticket_->status())) return ticket_->status();
  if (explains(status)) return status;
  for (const absl::Status& stream : statuses_) {
    if (!stream.ok() && !EndedWithTheUpload(stream)) return stream;
  }
  if (!status.ok()) return status;
  for (const absl::Status& stream : statuses_) {
    if (!stream.ok()) return stream;
  }
  return absl::OkStatus();
}

void AttachedUploads::Run(int stream) {
  absl::StatusOr<v1::UploadTicket> ticket;
  {
    absl::MutexLock lock(&mutex_);
    mutex_.Await(absl::Condition(
        +[](std::optional<absl::StatusOr<v1::UploadTicket>>* t) {
          return t->has_value();
        },
        &ticket_));
    ticket = *ticket_;
  }
  absl::Status status = ticket.ok() ? Upload(stream, *ticket) : ticket.status();
  if (!status.ok()) {
    status = absl::Status(status.code(),
                          absl::StrCat("attached upload stream ", stream, ": ",
                                       status.message()));
  }
  {
    absl::MutexLock lock(&mutex_);
    statuses_[stream - 1] = status;
  }
  if (!status.ok() && !EndedWithTheUpload(status)) on_failure_();
}

absl::Status AttachedUploads::Upload(int stream,
                                     const v1::UploadTicket& ticket) {
  grpc::ClientContext* context = contexts_[stream - 1].get();
  v1::AttachUploadResponse response;
  std::unique_ptr<grpc::ClientWriter<v1::AttachUploadRequest>> writer =
      stubs_[stream - 1]->AttachUpload(context, &response);
  v1::AttachUploadRequest request;
  *request.mutable_ticket() = ticket;
  bool open = writer->Write(request);
  while (open && chunks_->Next(stream, request.mutable_chunk())) {
    open = writer->Write(request);
  }
  if (open) writer->WritesDone();
  return FromGrpcStatus(writer->Finish());
}

void AttachedUploads::CancelAll() {
  {
    absl::MutexLock lock(&mutex_);
    if (!ticket_.has_value()) {
      ticket_ = absl::CancelledError("the Attend call was cancelled");
    }
  }
  for (const auto& context : contexts_) context->TryCancel();
}

}  // namespace ringattn
