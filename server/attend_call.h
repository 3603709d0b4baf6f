#ifndef RINGATTN_SERVER_ATTEND_CALL_H_
#define RINGATTN_SERVER_ATTEND_CALL_H_

// AttendCall: one Attend (or Query) request from header to summary. It checks
// the header, waits for admission, opens one Execute stream per worker, routes
// each uploaded chunk's rows to the workers that own them (nothing is gathered
// on the coordinator), starts the ring, and streams the output back in sequence
// order as the workers deliver it. Any worker failure cancels the others and
// fails the request with UNAVAILABLE. One object per call; not thread-safe
// itself.

#include <cstdint>
#include <string>

#include "grpcpp/grpcpp.h"
#include "ringattn/v1/attention.grpc.pb.h"
#include "server/admission_control.h"
#include "server/cluster.h"
#include "server/communicator_keys.h"
#include "server/context_registry.h"
#include "server/coordinator_options.h"
#include "server/metrics.h"
#include "server/rendezvous_store.h"
#include "server/request_registry.h"
#include "server/shared_download.h"
#include "server/shared_upload.h"

namespace ringattn {

// What a call shares with the rest of the coordinator; all must outlive the
// call.
struct CoordinatorState {
  CoordinatorOptions options;
  Cluster* cluster;
  RendezvousStore* store;
  Metrics* metrics;
  AdmissionControl* admission;
  ContextRegistry* contexts;
  CommunicatorKeys* communicator_keys;
  // Attend requests taking chunks over attached streams (AttachUpload).
  RequestRegistry<SharedUpload>* uploads;
  // Attend requests sending output over attached streams (AttachDownload).
  RequestRegistry<SharedDownload>* downloads;
  // The calls are the ring warm-up's: each takes a communicator slot whose
  // communicator the workers have yet to make, if one is free.
  bool warm_up = false;
};

// The client's side of an attention call: Attend's stream, or Query's, whose
// header also names the resident context that supplies K and V.
class RequestStream {
 public:
  virtual ~RequestStream() = default;
  // The next message as an Attend message; false at the end of the stream.
  virtual bool Read(v1::AttendRequest* request) = 0;
  virtual bool Write(const v1::AttendResponse& response) = 0;
  // Writes the call's last message, sent together with its status.
  virtual bool WriteLast(const v1::AttendResponse& response) = 0;
  // Sends the initial metadata added to the call's ServerContext so far,
  // ahead of any response.
  virtual void SendInitialMetadata() = 0;
  // The context a Query's header named (known once the header was read); empty
  // for Attend.
  virtual const std::string& context_name() const = 0;
  // New K/V tokens a Query appends to its context before it runs (0: none).
  virtual int64_t append_length() const = 0;
};

// Runs the whole call on `stream`; returns the status to end it with.
grpc::Status RunAttendCall(const CoordinatorState& state,
                           grpc::ServerContext* context, RequestStream* stream,
                           const std::string& request_id);

}  // namespace ringattn

#endif  // RINGATTN_SERVER_ATTEND_CALL_H_
