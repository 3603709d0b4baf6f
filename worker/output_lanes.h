#ifndef RINGATTN_WORKER_OUTPUT_LANES_H_
#define RINGATTN_WORKER_OUTPUT_LANES_H_

// OutputLanes: the AttachRows streams of one Execute stream that, their rows
// stored, wait to carry part of its output back (worker.proto). The Execute
// stream starts them with its OutputDealer once it has computed, or ends them
// with its error; a lane that joins after either is answered at once. The
// attached streams of a StoreContext stream wait here for its outcome.
// Thread-safe.

#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "worker/output_dealer.h"

namespace ringattn {

class OutputLanes {
 public:
  // A stream waiting for output. Exactly one of the two is called, once,
  // outside the lanes' lock, unless Leave took it back.
  class Lane {
   public:
    virtual ~Lane() = default;
    virtual void Start(std::shared_ptr<OutputDealer> dealer) = 0;
    virtual void End(absl::Status status) = 0;
  };

  OutputLanes() = default;
  OutputLanes(const OutputLanes&) = delete;
  OutputLanes& operator=(const OutputLanes&) = delete;

  // Keeps `lane` until Start or End, or answers it now if one came.
  void Join(Lane* lane);

  // Takes back a lane that still waits; false if it was answered (or is
  // being answered).
  bool Leave(Lane* lane);

  // Starts the lanes waiting and those that join later with `dealer`,
  // unless End came first.
  void Start(std::shared_ptr<OutputDealer> dealer);

  // Ends the lanes waiting and those that join later with `status` (an
  // error, or OK where no output follows: a context piece was stored),
  // unless Start came first.
  void End(absl::Status status);

 private:
  // The lanes to answer now, once Start or End has come.
  std::vector<Lane*> TakeWaiting() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Answers `lanes` as Start or End said.
  void Answer(const std::vector<Lane*>& lanes,
              const std::shared_ptr<OutputDealer>& dealer,
              const absl::Status& status);

  absl::Mutex mutex_;
  std::vector<Lane*> waiting_ ABSL_GUARDED_BY(mutex_);
  bool answered_ ABSL_GUARDED_BY(mutex_) = false;
  std::shared_ptr<OutputDealer> dealer_ ABSL_GUARDED_BY(mutex_);
  absl::Status status_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace ringattn

#endif  // RINGATTN_WORKER_OUTPUT_LANES_H_
