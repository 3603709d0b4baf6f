#ifndef RINGATTN_SERVER_COORDINATION_SERVICE_H_
#define RINGATTN_SERVER_COORDINATION_SERVICE_H_

// The coordinator's side of the worker API: registration, heartbeats and the
// rendezvous store. Unary calls; StoreGet waits (bounded by its deadline) for
// keys to appear. Thread-safe.

#include "ringattn/v1/worker.grpc.pb.h"
#include "server/cluster.h"
#include "server/rendezvous_store.h"

namespace ringattn {

class CoordinationService final : public v1::Coordination::Service {
 public:
  // Both must outlive the service.
  CoordinationService(Cluster* cluster, RendezvousStore* store)
      : cluster_(cluster), store_(store) {}

  grpc::Status Register(grpc::ServerContext* context,
                        const v1::RegisterRequest* request,
                        v1::RegisterResponse* response) override;
  grpc::Status Heartbeat(grpc::ServerContext* context,
                         const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse* response) override;
  grpc::Status StoreSet(grpc::ServerContext* context,
                        const v1::StoreSetRequest* request,
                        v1::StoreSetResponse* response) override;
  grpc::Status StoreGet(grpc::ServerContext* context,
                        const v1::StoreGetRequest* request,
                        v1::StoreGetResponse* response) override;

 private:
  Cluster* const cluster_;
  RendezvousStore* const store_;
};

}  // namespace ringattn

#endif  // RINGATTN_SERVER_COORDINATION_SERVICE_H_
