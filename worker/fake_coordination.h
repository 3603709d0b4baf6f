#ifndef RINGATTN_WORKER_FAKE_COORDINATION_H_
#define RINGATTN_WORKER_FAKE_COORDINATION_H_

// An in-process stand-in for the coordinator's Coordination service, for
// tests: the rendezvous store (StoreGet waits until every key exists or the
// call's deadline passes) and registration (ranks handed out in arrival order;
// Restart() forgets every worker, as a restarted coordinator would).
// Thread-safe.

#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ringattn/v1/worker.grpc.pb.h"

namespace ringattn {

class FakeCoordination final : public v1::Coordination::Service {
 public:
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

  // Forgets every registered worker and starts a new epoch.
  void Restart();

  // Blocks until `count` Register calls have succeeded in total or `timeout`
  // passed; returns whether they had.
  bool AwaitRegistrations(int count, absl::Duration timeout);
  // Blocks until `count` heartbeats from registered workers arrived in the
  // current epoch or `timeout` passed; returns whether they had.
  bool AwaitHeartbeats(int count, absl::Duration timeout);
  // The address the last registration advertised.
  std::string last_address() const;

 private:
  mutable absl::Mutex mutex_;
  std::map<std::string, std::string> store_ ABSL_GUARDED_BY(mutex_);
  std::map<std::string, int> ranks_ ABSL_GUARDED_BY(mutex_);  // by address
  int64_t epoch_ ABSL_GUARDED_BY(mutex_) = 1;
  int registrations_ ABSL_GUARDED_BY(mutex_) = 0;
  int heartbeats_ ABSL_GUARDED_BY(mutex_) = 0;
  std::string last_address_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace ringattn

#endif  // RINGATTN_WORKER_FAKE_COORDINATION_H_
