#include "server/upload_registry.h"

#include <utility>

namespace ringattn {

void UploadRegistry::Add(std::shared_ptr<SharedUpload> upload) {
  absl::MutexLock lock(&mutex_);
  const std::string id = upload->request_id();
  uploads_[id] = std::move(upload);
}

void UploadRegistry::Remove(const std::string& request_id) {
  absl::MutexLock lock(&mutex_);
  uploads_.erase(request_id);
}

std::shared_ptr<SharedUpload> UploadRegistry::Find(
    const std::string& request_id) {
  absl::MutexLock lock(&mutex_);
  auto found = uploads_.find(request_id);
  return found == uploads_.end() ? nullptr : found->second;
}

}  // namespace ringattn
