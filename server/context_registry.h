#ifndef RINGATTN_SERVER_CONTEXT_REGISTRY_H_
#define RINGATTN_SERVER_CONTEXT_REGISTRY_H_

// ContextRegistry: the resident contexts of the cluster as the coordinator
// knows them: shape, length, which positions each worker holds, and which
// workers those are (a context whose worker left is lost). An upload holds its
// context exclusively until it commits or aborts; queries read committed
// snapshots. Thread-safe.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "core/range.h"
#include "ringattn/v1/attention.pb.h"

namespace ringattn {

struct ResidentContext {
  std::string name;
  int64_t batch = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t length = 0;
  int64_t bytes = 0;  // over all workers
  std::vector<std::vector<Range>>
      chunks;                            // positions each rank holds, in order
  std::vector<std::string> addresses;    // the worker of each rank
  std::vector<int64_t> worker_bytes;     // what each rank holds
  std::vector<v1::DType> worker_dtypes;  // the dtype each rank holds it in
  // Appends undone so far (queries that appended and failed): every append
  // tells the workers this count, and every undo raises it, so that a worker
  // refuses rows of an undone append that reach it after the undo.
  int64_t undone_appends = 0;

  // The listing's view, with a part per rank.
  v1::ContextInfo Info() const;
};

class ContextRegistry {
 public:
  // Starts an upload to `name`: for `create` a new context (ALREADY_EXISTS if
  // the name is taken), else an append (NOT_FOUND if unknown). ABORTED if
  // another upload to `name` is in progress. Returns the context as it stands.
  absl::StatusOr<ResidentContext> BeginUpload(const std::string& name,
                                              bool create);
  // Ends the upload: with a value, that is the context now; without, nothing
  // changed (a create leaves no context).
  void EndUpload(const std::string& name,
                 std::optional<ResidentContext> committed);

  // The committed context `name`; NOT_FOUND naming it otherwise.
  absl::StatusOr<ResidentContext> Find(const std::string& name);
  // Forgets `name`; NOT_FOUND if unknown, ABORTED while an upload runs.
  absl::StatusOr<ResidentContext> Remove(const std::string& name);
  std::vector<ResidentContext> List();

 private:
  struct Entry {
    std::optional<ResidentContext> committed;
    bool uploading = false;
  };
  absl::Mutex mutex_;
  std::map<std::string, Entry> entries_ ABSL_GUARDED_BY(mutex_);
};

// Positions [length, length + count) cut into one run per worker (`held[w]`
// positions before). All of them go to worker `last` (the holder of position
// length - 1; -1 if none), extending its last run, while it then holds at most
// `slack` positions above an even share; otherwise they are spread so that
// every worker holds within one position of the same number. A slack keeps
// decode steps from cutting the context into one-row runs that alternate
// between workers (every run is a separate block of attention on a worker).
std::vector<Range> BalancedRuns(const std::vector<int64_t>& held,
                                int64_t length, int64_t count,
                                int64_t last = -1, int64_t slack = 0);

}  // namespace ringattn

#endif  // RINGATTN_SERVER_CONTEXT_REGISTRY_H_
