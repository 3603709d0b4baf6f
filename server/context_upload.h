#ifndef RINGATTN_SERVER_CONTEXT_UPLOAD_H_
#define RINGATTN_SERVER_CONTEXT_UPLOAD_H_

// ContextUpload: one CreateContext or AppendContext call. The new tokens are
// cut into one run per worker so every worker stays within one token of an even
// share; each chunk's rows go straight to the worker that will hold them,
// from the call's own stream and the AttachUpload streams its header
// announced (upload_streams), which `request_id` names. The
// context changes only if every worker stored its part: otherwise the parts
// already stored are dropped again and the context is as it was before the
// call.

#include "grpcpp/grpcpp.h"
#include "ringattn/v1/attention.grpc.pb.h"
#include "server/attend_call.h"
#include "server/context_registry.h"

namespace ringattn {

grpc::Status RunContextUpload(const CoordinatorState& state,
                              grpc::ServerContext* context,
                              grpc::ServerReader<v1::ContextUpload>* reader,
                              bool create, const std::string& request_id,
                              v1::ContextInfo* response);

// OK if the workers holding `context` are still the cluster's members;
// FAILED_PRECONDITION naming the rank whose worker left otherwise.
absl::Status CheckContextMembers(const ResidentContext& context,
                                 const std::vector<Cluster::Member>& members);

// Drops context `name` (or, with keep_length > 0, its positions from
// keep_length on) on every live worker, best effort. An undo of a query's
// append passes the context's undone appends, this one included
// (ResidentContext::undone_appends).
void DropOnWorkers(const CoordinatorState& state, const std::string& name,
                   int64_t keep_length, int64_t undone_appends = 0);

}  // namespace ringattn

#endif  // RINGATTN_SERVER_CONTEXT_UPLOAD_H_
