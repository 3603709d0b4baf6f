#ifndef RINGATTN_WORKER_MEMBERSHIP_H_
#define RINGATTN_WORKER_MEMBERSHIP_H_

// Membership: keeps a worker registered with the coordinator. It registers
// (retrying with exponential backoff until the coordinator answers), then
// sends a heartbeat every interval; when a heartbeat says the coordinator has
// forgotten the worker (it restarted), it registers again. Run() blocks until
// Stop(); Stop() may be called from any thread. Not copyable.

#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/client_context.h"
#include "ringattn/v1/worker.grpc.pb.h"

namespace ringattn {

struct MembershipOptions {
  absl::Duration heartbeat_interval = absl::Seconds(1);
  absl::Duration rpc_timeout = absl::Seconds(5);
  absl::Duration first_backoff = absl::Milliseconds(100);
  absl::Duration most_backoff = absl::Seconds(5);
};

class Membership {
 public:
  // Registers `self` with the coordinator behind `stub`.
  Membership(std::shared_ptr<v1::Coordination::StubInterface> stub,
             v1::RegisterRequest self, const MembershipOptions& options);
  Membership(const Membership&) = delete;
  Membership& operator=(const Membership&) = delete;

  // Registers and heartbeats until Stop(); logs each change of state.
  void Run();

  // Makes Run() return soon, cancelling an RPC in flight. Thread-safe.
  void Stop();

 private:
  // Waits `duration` or until Stop(); true if stopped.
  bool WaitOrStop(absl::Duration duration);
  // Prepares `context` for one RPC; false if stopped.
  bool Begin(grpc::ClientContext& context);
  // Ends the RPC Begin() prepared; true if stopped meanwhile.
  bool End();

  const std::shared_ptr<v1::Coordination::StubInterface> stub_;
  const v1::RegisterRequest self_;
  const MembershipOptions options_;

  absl::Mutex mutex_;
  bool stopped_ ABSL_GUARDED_BY(mutex_) = false;
  grpc::ClientContext* in_flight_ ABSL_GUARDED_BY(mutex_) = nullptr;
};

}  // namespace ringattn

#endif  // RINGATTN_WORKER_MEMBERSHIP_H_
