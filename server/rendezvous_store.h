#ifndef RINGATTN_SERVER_RENDEZVOUS_STORE_H_
#define RINGATTN_SERVER_RENDEZVOUS_STORE_H_

// RendezvousStore: the key-value store workers use to find each other for a
// request's ring (Gloo's rendezvous; later the NCCL unique id). Get waits until
// the keys exist. Keys of a finished request are erased by prefix. Thread-safe.

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ringattn {

class RendezvousStore {
 public:
  void Set(const std::string& key, const std::string& value);
  // The values of `keys` in order, once all exist; DEADLINE_EXCEEDED naming a
  // missing key if `deadline` passes first.
  absl::StatusOr<std::vector<std::string>> Get(
      const std::vector<std::string>& keys, absl::Time deadline);
  // Forgets every key that starts with `prefix`.
  void EraseWithPrefix(const std::string& prefix);
  size_t size();

 private:
  absl::Mutex mutex_;
  std::map<std::string, std::string> values_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace ringattn

#endif  // RINGATTN_SERVER_RENDEZVOUS_STORE_H_
