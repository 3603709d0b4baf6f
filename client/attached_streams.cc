#include "client/attached_streams.h"

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
// or download ended before the stream did: the coordinator cancelled it
// (CANCELLED), or that part of the request was over when it came (NOT_FOUND,
// FAILED_PRECONDITION). The Attend call then ends with the reason on its own.
bool EndedWithTheRequest(const absl::Status& status) {
  return absl::IsCancelled(status) || absl::IsNotFound(status) ||
         absl::IsFailedPrecondition(status);
}

}  // namespace

SharedChunks::SharedChunks(ChunkSource* source, int streams, Report report)
    : report_(std::move(report)),
      total_bytes_(source->total_bytes()),
      source_(source),
      indexed_(source->chunk_count() >= 0),
      in_flight_(static_cast<size_t>(streams), 0) {
  if (!indexed_) return;
  const int64_t count = source->chunk_count();
  for (int s = 0; s < streams; ++s) {
    runs_.push_back({count * s / streams, count * (s + 1) / streams});
  }
}

bool SharedChunks::Next(int stream, v1::TensorChunk* chunk) {
  int64_t index;
  {
    absl::MutexLock lock(&mutex_);
    Written(stream);
    if (!indexed_) {
      const bool more = source_->Next(chunk);
      if (more) in_flight_[stream] = static_cast<int64_t>(chunk->data().size());
      return more;
    }
    index = TakeIndex(stream);
    if (index < 0) return false;
  }
  source_->Fill(index, chunk);
  absl::MutexLock lock(&mutex_);
  in_flight_[stream] = static_cast<int64_t>(chunk->data().size());
  return true;
}

void SharedChunks::Written(int stream) {
  bytes_done_ += in_flight_[stream];
  in_flight_[stream] = 0;
  if (report_) report_(bytes_done_, total_bytes_);
}

int64_t SharedChunks::TakeIndex(int stream) {
  Run& own = runs_[stream];
  if (own.next < own.end) return own.next++;
  Run* longest = nullptr;
  for (Run& run : runs_) {
    if (longest == nullptr ||
        run.end - run.next > longest->end - longest->next) {
      longest = &run;
    }
  }
  if (longest->next == longest->end) return -1;
  return --longest->end;
}

AttachedStreams::AttachedStreams(
    const std::vector<std::unique_ptr<v1::Attention::Stub>>& stubs, int streams,
    const char* kind, const Prepare& prepare, Work work,
    std::function<void()> on_failure)
    : stubs_(stubs),
      kind_(kind),
      work_(std::move(work)),
      on_failure_(std::move(on_failure)),
      statuses_(static_cast<size_t>(streams)) {
  for (int i = 0; i < streams; ++i) {
    contexts_.push_back(std::make_unique<grpc::ClientContext>());
    prepare(contexts_.back().get());
  }
  for (int i = 1; i <= streams; ++i)
    threads_.emplace_back([this, i] { Run(i); });
}

AttachedStreams::~AttachedStreams() {
  CancelAll();
  for (std::thread& thread : threads_) thread.join();
}

void AttachedStreams::TakeTicket(
    const std::multimap<grpc::string_ref, grpc::string_ref>& metadata) {
  const auto request_id = metadata.find(kRequestIdKey);
  const auto token = metadata.find(kUploadTokenKey);
  absl::MutexLock lock(&mutex_);
  if (ticket_.has_value()) return;
  if (request_id == metadata.end() || token == metadata.end()) {
    ticket_ = absl::FailedPreconditionError(
        "the server handed out no ticket for the attached streams; it may "
        "predate them: send with upload_streams and download_streams = 1");
    return;
  }
  v1::UploadTicket ticket;
  ticket.set_request_id(
      std::string(request_id->second.data(), request_id->second.size()));
  ticket.set_token(std::string(token->second.data(), token->second.size()));
  ticket_ = std::move(ticket);
}

absl::Status AttachedStreams::Finish(const absl::Status& status) {
  {
    absl::MutexLock lock(&mutex_);
    if (!ticket_.has_value()) {
      ticket_ = absl::CancelledError(
          "the Attend call ended before it handed out a ticket");
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
    if (!stream.ok() && !EndedWithTheRequest(stream)) return stream;
  }
  if (!status.ok()) return status;
  for (const absl::Status& stream : statuses_) {
    if (!stream.ok()) return stream;
  }
  return absl::OkStatus();
}

void AttachedStreams::Run(int stream) {
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
  absl::Status status = ticket.ok()
                            ? work_(stream, *stubs_[stream - 1],
                                    contexts_[stream - 1].get(), *ticket)
                            : ticket.status();
  if (!status.ok()) {
    status = absl::Status(status.code(),
                          absl::StrCat("attached ", kind_, " stream ", stream,
                                       ": ", status.message()));
  }
  {
    absl::MutexLock lock(&mutex_);
    statuses_[stream - 1] = status;
  }
  if (!status.ok() && !EndedWithTheRequest(status)) on_failure_();
}

AttachedStreams::Work AttachedStreams::Upload(SharedChunks* chunks) {
  return
      [chunks](int stream, v1::Attention::Stub& stub,
               grpc::ClientContext* context, const v1::UploadTicket& ticket) {
        v1::AttachUploadResponse response;
        std::unique_ptr<grpc::ClientWriter<v1::AttachUploadRequest>> writer =
            stub.AttachUpload(context, &response);
        v1::AttachUploadRequest request;
        *request.mutable_ticket() = ticket;
        bool open = writer->Write(request);
        while (open && chunks->Next(stream, request.mutable_chunk())) {
          open = writer->Write(request);
        }
        if (open) writer->WritesDone();
        return FromGrpcStatus(writer->Finish());
      };
}

AttachedStreams::Work AttachedStreams::Download(
    std::function<absl::Status(const v1::AttendResponse&)> take) {
  return [take = std::move(take)](int, v1::Attention::Stub& stub,
                                  grpc::ClientContext* context,
                                  const v1::UploadTicket& ticket) {
    std::unique_ptr<grpc::ClientReader<v1::AttendResponse>> reader =
        stub.AttachDownload(context, ticket);
    v1::AttendResponse response;
    absl::Status taken;
    while (taken.ok() && reader->Read(&response)) taken = take(response);
    if (!taken.ok()) {
      context->TryCancel();
      while (reader->Read(&response)) {
      }
      reader->Finish();
      return taken;
    }
    return FromGrpcStatus(reader->Finish());
  };
}

void AttachedStreams::CancelAll() {
  {
    absl::MutexLock lock(&mutex_);
    if (!ticket_.has_value()) {
      ticket_ = absl::CancelledError("the Attend call was cancelled");
    }
  }
  for (const auto& context : contexts_) context->TryCancel();
}

}  // namespace ringattn
