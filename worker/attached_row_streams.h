#ifndef RINGATTN_WORKER_ATTACHED_ROW_STREAMS_H_
#define RINGATTN_WORKER_ATTACHED_ROW_STREAMS_H_

// AttachedRowStreams: where AttachRows streams find the Execute (or
// StoreContext) stream whose header named their key: its shard or context
// piece (ShardIntake) for their rows and the lanes (OutputLanes) its output,
// or its outcome, goes back on. A stream that comes before that header waits
// for it without holding a thread; one whose key was closed (the stream ran
// or ended) is refused. Thread-safe.

#include <cstddef>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "worker/output_lanes.h"
#include "worker/shard_intake.h"

namespace ringattn {

// The initial metadata of an AttachRows stream that names its Execute
// stream's rows_key (worker.proto).
inline constexpr char kRowsKeyMetadata[] = "ringattn-rows-key";

// What an attached stream joins.
struct AttachedShard {
  std::shared_ptr<ShardIntake> intake;
  std::shared_ptr<OutputLanes> lanes;
};

class AttachedRowStreams {
 public:
  // An AttachRows stream waiting for its shard. Exactly one of the two is
  // called, once, outside the registry's lock, unless Forget took it back.
  class Waiter {
   public:
    virtual ~Waiter() = default;
    virtual void Attach(AttachedShard shard) = 0;
    virtual void Refuse(absl::Status status) = 0;
  };

  AttachedRowStreams() = default;
  AttachedRowStreams(const AttachedRowStreams&) = delete;
  AttachedRowStreams& operator=(const AttachedRowStreams&) = delete;

  // Opens `key` to attached streams and hands `shard` to those waiting.
  // INVALID_ARGUMENT if the key is open or was closed already.
  absl::Status Open(const std::string& key, AttachedShard shard);

  // Closes `key` (opened or not): waiting and later streams are refused with
  // FAILED_PRECONDITION. Streams already attached keep their shard, whose
  // owner closes it.
  void Close(const std::string& key);

  // Attaches `waiter` now if `key` is open, refuses it if closed, otherwise
  // keeps it until Open or Close.
  void Await(const std::string& key, Waiter* waiter);

  // Takes back a waiter that still waits; false if it was answered (or is
  // being answered).
  bool Forget(const std::string& key, Waiter* waiter);

 private:
  struct Entry {
    AttachedShard shard;  // null until opened
    std::vector<Waiter*> waiting;
  };
  // Remembers `key` as closed, forgetting the oldest beyond a bound.
  void RememberClosed(const std::string& key)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  static absl::Status Closed(const std::string& key);

  absl::Mutex mutex_;
  std::map<std::string, Entry> entries_ ABSL_GUARDED_BY(mutex_);
  std::set<std::string> closed_ ABSL_GUARDED_BY(mutex_);
  std::deque<std::string> closed_order_ ABSL_GUARDED_BY(mutex_);
};

// A stream's claim on the rows_key its header names, for Execute and
// StoreContext streams alike: Open hands attached streams the stream's shard,
// and Close refuses those that wait or come later, also for a key that never
// opened (its header was refused), so that they hear it at once instead of at
// their deadline. Closes on destruction. Not thread-safe.
class RowsKeyClaim {
 public:
  explicit RowsKeyClaim(AttachedRowStreams& streams) : streams_(streams) {}
  ~RowsKeyClaim() { Close(); }
  RowsKeyClaim(const RowsKeyClaim&) = delete;
  RowsKeyClaim& operator=(const RowsKeyClaim&) = delete;

  // Takes `key` (none if empty) for this stream to open and close.
  void Take(std::string key) { key_ = std::move(key); }
  bool taken() const { return !key_.empty(); }
  // Opens the key taken with `shard`. The registry's error if the key is
  // open or closed already; it is then not this stream's to close.
  absl::Status Open(AttachedShard shard);
  // Refuses waiting and later attached streams. Idempotent.
  void Close();

 private:
  AttachedRowStreams& streams_;
  std::string key_;
};

}  // namespace ringattn

#endif  // RINGATTN_WORKER_ATTACHED_ROW_STREAMS_H_
