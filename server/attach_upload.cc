#include "server/attach_upload.h"

#include <cstdint>
#include <memory>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "proto/grpc_status.h"

namespace ringattn {
namespace {

// Reads the chunks that follow the ticket of attached stream `stream` into
// `upload`, counting them in `response`; the status the stream ends with
// (SharedUpload::StreamError's).
absl::Status ReadChunks(SharedUpload& upload, int stream,
                        grpc::ServerContext* context,
                        grpc::ServerReader<v1::AttachUploadRequest>* reader,
                        v1::AttachUploadResponse* response) {
  v1::AttachUploadRequest request;
  int64_t index = 0;
  while (reader->Read(&request)) {
    ++index;
    if (!request.has_chunk()) {
      return upload.StreamError(
          stream, absl::InvalidArgumentError(absl::StrCat(
                      "message ", index,
                      " after the ticket is not a tensor chunk; send the "
                      "ticket once, then chunks")));
    }
    const int64_t bytes = static_cast<int64_t>(request.chunk().data().size());
    RINGATTN_RETURN_IF_ERROR(
        upload.Take(stream, *request.mutable_chunk(), index));
    response->set_chunks(response->chunks() + 1);
    response->set_bytes(response->bytes() + bytes);
  }
  if (context->IsCancelled()) {
    return upload.StreamError(
        stream,
        absl::CancelledError(
            "the client cancelled or broke the stream before it half-closed"));
  }
  return absl::OkStatus();
}

}  // namespace

grpc::Status RunAttachUpload(
    RequestRegistry<SharedUpload>& uploads, grpc::ServerContext* context,
    grpc::ServerReader<v1::AttachUploadRequest>* reader,
    v1::AttachUploadResponse* response) {
  v1::AttachUploadRequest first;
  if (!reader->Read(&first) || !first.has_ticket()) {
    return ToGrpcStatus(absl::InvalidArgumentError(
        "the first message of AttachUpload must be the ticket (request id "
        "and token from the call's initial metadata)"));
  }
  const std::string& request_id = first.ticket().request_id();
  std::shared_ptr<SharedUpload> upload = uploads.Find(request_id);
  if (upload == nullptr) {
    return ToGrpcStatus(absl::NotFoundError(absl::StrCat(
        "request '", request_id,
        "' is not taking chunks over attached streams: it has finished or "
        "failed, never existed, or its header did not set upload_streams > "
        "1; attach only after its call's initial metadata "
        "arrived")));
  }
  absl::StatusOr<int> stream = upload->Attach(first.ticket().token(), context);
  if (!stream.ok()) return ToGrpcStatus(stream.status());
  // Tells the client that the stream has joined the request.
  reader->SendInitialMetadata();
  const absl::Status status =
      ReadChunks(*upload, *stream, context, reader, response);
  upload->Detach(*stream, status);
  return ToGrpcStatus(status);
}

}  // namespace ringattn
