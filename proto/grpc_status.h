#ifndef RINGATTN_PROTO_GRPC_STATUS_H_
#define RINGATTN_PROTO_GRPC_STATUS_H_

// Conversions between absl::Status (inside the code) and grpc::Status (on the
// wire); the code and the message carry over unchanged.

#include "absl/status/status.h"
#include "grpcpp/grpcpp.h"

namespace ringattn {

// Trailing metadata of an Attend or Query call the coordinator ended with
// UNAVAILABLE having changed nothing (a query's new rows taken back), so that
// the client may send it again; the client carries the mark on to its
// absl::Status as the payload kUnchangedPayload.
inline constexpr char kUnchangedKey[] = "ringattn-unchanged";
inline constexpr char kUnchangedPayload[] = "ringattn.dev/unchanged";

inline grpc::Status ToGrpcStatus(const absl::Status& status) {
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

inline absl::Status FromGrpcStatus(const grpc::Status& status) {
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

}  // namespace ringattn

#endif  // RINGATTN_PROTO_GRPC_STATUS_H_
