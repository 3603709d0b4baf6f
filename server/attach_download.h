#ifndef RINGATTN_SERVER_ATTACH_DOWNLOAD_H_
#define RINGATTN_SERVER_ATTACH_DOWNLOAD_H_

// AttachDownload: one more output stream of an Attend request. It finds the
// request's SharedDownload by the ticket and writes the output chunks dealt
// to it until the output is all out.

#include "grpcpp/grpcpp.h"
#include "ringattn/v1/attention.grpc.pb.h"
#include "server/request_registry.h"
#include "server/shared_download.h"

namespace ringattn {

// Runs the whole call on `writer`; returns the status to end it with.
grpc::Status RunAttachDownload(RequestRegistry<SharedDownload>& downloads,
                               grpc::ServerContext* context,
                               const v1::UploadTicket& ticket,
                               grpc::ServerWriter<v1::AttendResponse>* writer);

}  // namespace ringattn

#endif  // RINGATTN_SERVER_ATTACH_DOWNLOAD_H_
