#ifndef RINGATTN_SERVER_UPLOAD_REGISTRY_H_
#define RINGATTN_SERVER_UPLOAD_REGISTRY_H_

// UploadRegistry: the Attend requests that are taking chunks over attached
// streams right now, by request id, so that an AttachUpload call finds the
// upload its ticket names. Thread-safe.

#include <map>
#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "server/shared_upload.h"

namespace ringattn {

class UploadRegistry {
 public:
  // Makes `upload` findable by its request id until Remove.
  void Add(std::shared_ptr<SharedUpload> upload);
  void Remove(const std::string& request_id);
  // The upload of request `request_id`, or null if it is not taking chunks.
  std::shared_ptr<SharedUpload> Find(const std::string& request_id);

 private:
  absl::Mutex mutex_;
  std::map<std::string, std::shared_ptr<SharedUpload>> uploads_
      ABSL_GUARDED_BY(mutex_);
};

}  // namespace ringattn

#endif  // RINGATTN_SERVER_UPLOAD_REGISTRY_H_
