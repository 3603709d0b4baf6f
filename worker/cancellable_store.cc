#include "worker/cancellable_store.h"

#include <algorithm>
#include <exception>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "gloo/common/error.h"

namespace ringattn {

std::vector<char> CancellableStore::get(const std::string& key) {
  wait({key});
  return inner().get(key);
}

void CancellableStore::wait(const std::vector<std::string>& keys,
                            const std::chrono::milliseconds& timeout) {
  const absl::Time deadline = absl::Now() + absl::FromChrono(timeout);
  for (;;) {
    if (Raised(cancelled_)) {
      throw gloo::IoException(absl::StrCat("cancelled while waiting for '",
                                           absl::StrJoin(keys, "', '"), "'"));
    }
    const absl::Time start = absl::Now();
    const absl::Duration left = deadline - start;
    const absl::Duration slice =
        std::clamp(left, absl::Milliseconds(1), kCancelCheckInterval);
    try {
      inner().wait(keys, absl::ToChronoMilliseconds(slice));
      return;
    } catch (const std::exception&) {
      // The whole wait's time is up, or the store failed well before the
      // slice's time did: the caller's to handle. Otherwise the slice ran out.
      if (left <= kCancelCheckInterval || absl::Now() - start < slice / 2) {
        throw;
      }
    }
  }
}

}  // namespace ringattn
