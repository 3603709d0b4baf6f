#ifndef RINGATTN_SERVER_ATTACH_UPLOAD_H_
#define RINGATTN_SERVER_ATTACH_UPLOAD_H_

// AttachUpload: one more upload stream of an Attend request. It reads the
// ticket, joins the request's SharedUpload, and hands it every chunk that
// follows; the request routes them with its own.

#include "grpcpp/grpcpp.h"
#include "ringattn/v1/attention.grpc.pb.h"
#include "server/request_registry.h"
#include "server/shared_upload.h"

namespace ringattn {

// Runs the whole call on `reader`; returns the status to end it with.
grpc::Status RunAttachUpload(
    RequestRegistry<SharedUpload>& uploads, grpc::ServerContext* context,
    grpc::ServerReader<v1::AttachUploadRequest>* reader,
    v1::AttachUploadResponse* response);

}  // namespace ringattn

#endif  // RINGATTN_SERVER_ATTACH_UPLOAD_H_
