#ifndef RINGATTN_WORKER_GRPC_STORE_H_
#define RINGATTN_WORKER_GRPC_STORE_H_

// GrpcStore: the key-value store of Gloo's rendezvous, kept by the coordinator
// and reached through its Coordination service (StoreSet / StoreGet). Workers
// on different hosts meet there. It implements Gloo's Store interface, and so
// reports failures the Gloo way, by throwing gloo::IoException; the Gloo
// communicator catches them. Thread-safe: it holds no state besides the stub.

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "gloo/rendezvous/store.h"
#include "ringattn/v1/worker.grpc.pb.h"

namespace ringattn {

class GrpcStore final : public gloo::rendezvous::Store {
 public:
  // Every call is bounded by `timeout`, except wait() given its own.
  GrpcStore(std::shared_ptr<v1::Coordination::StubInterface> stub,
            absl::Duration timeout);

  GrpcStore(const GrpcStore&) = delete;
  GrpcStore& operator=(const GrpcStore&) = delete;

  // Stores `data` under `key`. Throws gloo::IoException if the coordinator
  // does not acknowledge it in time.
  void set(const std::string& key, const std::vector<char>& data) override;

  // The value of `key`, waiting (at most the timeout) until some rank sets it.
  // Throws gloo::IoException on timeout or failure.
  std::vector<char> get(const std::string& key) override;

  // Returns once every key in `keys` exists; throws gloo::IoException naming
  // the keys if that takes longer than `timeout` (zero: the store's timeout).
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  // The values of `keys`, waiting at most `timeout` for all of them to exist.
  std::vector<std::vector<char>> Fetch(const std::vector<std::string>& keys,
                                       absl::Duration timeout);

  const std::shared_ptr<v1::Coordination::StubInterface> stub_;
  const absl::Duration timeout_;
};

}  // namespace ringattn

#endif  // RINGATTN_WORKER_GRPC_STORE_H_
