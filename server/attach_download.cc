#include "server/attach_download.h"

#include <memory>

#include "absl/strings/str_cat.h"
#include "proto/grpc_status.h"

namespace ringattn {

grpc::Status RunAttachDownload(RequestRegistry<SharedDownload>& downloads,
                               grpc::ServerContext* context,
                               const v1::UploadTicket& ticket,
                               grpc::ServerWriter<v1::AttendResponse>* writer) {
  std::shared_ptr<SharedDownload> download =
      downloads.Find(ticket.request_id());
  if (download == nullptr) {
    return ToGrpcStatus(absl::NotFoundError(absl::StrCat(
        "request '", ticket.request_id(),
        "' is not sending output over attached streams: it has finished or "
        "failed, never existed, or its header did not set download_streams "
        "> 1; attach only after its call's initial metadata "
        "arrived")));
  }
  return ToGrpcStatus(download->Serve(ticket.token(), context, writer));
}

}  // namespace ringattn
