#ifndef RINGATTN_WORKER_CANCELLABLE_STORE_H_
#define RINGATTN_WORKER_CANCELLABLE_STORE_H_

// CancellableStore: a rendezvous store whose waits give up soon after a flag
// is raised, so that a rank whose request was cancelled (its peer died while
// the ring was being connected, say) stops waiting for that peer at once
// instead of at the ring timeout, holding an execution slot meanwhile. It
// waits on the inner store in slices of kCancelCheckInterval and looks at the
// flag between them. Thread-compatible.

#include <atomic>
#include <chrono>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "gloo/rendezvous/store.h"
#include "worker/forwarding_store.h"

namespace ringattn {

// Whether the cancel flag `flag` (null: none, never raised) is raised.
inline bool Raised(const std::atomic<bool>* flag) {
  return flag != nullptr && *flag;
}

// How often a CancellableStore wait looks at its flag.
inline constexpr absl::Duration kCancelCheckInterval = absl::Milliseconds(100);

class CancellableStore final : public ForwardingStore {
 public:
  // `inner` must outlive this; `cancelled` may be null (never cancelled).
  CancellableStore(gloo::rendezvous::Store& inner,
                   const std::atomic<bool>* cancelled)
      : ForwardingStore(inner), cancelled_(cancelled) {}

  // Waits for `key` as wait() does, then reads it.
  std::vector<char> get(const std::string& key) override;
  // As the inner store's waits, but throws gloo::IoException saying
  // "cancelled" soon after the flag is raised.
  using ForwardingStore::wait;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  const std::atomic<bool>* const cancelled_;
};

}  // namespace ringattn

#endif  // RINGATTN_WORKER_CANCELLABLE_STORE_H_
