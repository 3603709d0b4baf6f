#ifndef RINGATTN_SERVER_REQUEST_REGISTRY_H_
#define RINGATTN_SERVER_REQUEST_REGISTRY_H_

// RequestRegistry: the Attend requests whose attached streams may join right
// now (SharedUpload for AttachUpload, SharedDownload for AttachDownload), by
// request id, so that an attaching call finds what its ticket names.
// Thread-safe.

#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/synchronization/mutex.h"

namespace ringattn {

// `Shared` has `const std::string& request_id() const`.
template <typename Shared>
class RequestRegistry {
 public:
  // Makes `shared` findable by its request id until Remove.
  void Add(std::shared_ptr<Shared> shared) {
    absl::MutexLock lock(&mutex_);
    const std::string id = shared->request_id();
    entries_[id] = std::move(shared);
  }
  void Remove(const std::string& request_id) {
    absl::MutexLock lock(&mutex_);
    entries_.erase(request_id);
  }
  // What request `request_id` registered, or null.
  std::shared_ptr<Shared> Find(const std::string& request_id) {
    absl::MutexLock lock(&mutex_);
    auto found = entries_.find(request_id);
    return found == entries_.end() ? nullptr : found->second;
  }

 private:
  absl::Mutex mutex_;
  std::map<std::string, std::shared_ptr<Shared>> entries_
      ABSL_GUARDED_BY(mutex_);
};

}  // namespace ringattn

#endif  // RINGATTN_SERVER_REQUEST_REGISTRY_H_
