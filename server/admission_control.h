#ifndef RINGATTN_SERVER_ADMISSION_CONTROL_H_
#define RINGATTN_SERVER_ADMISSION_CONTROL_H_

// AdmissionControl: bounds the bytes that requests in flight may hold. A
// request that does not fit now waits in line (first come, first served) until
// earlier ones finish or its deadline passes; one that could never fit is
// refused at once. Thread-safe.

#include <cstdint>
#include <list>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ringattn {

class AdmissionControl {
 public:
  AdmissionControl(int64_t budget_bytes, int max_requests)
      : budget_(budget_bytes), max_requests_(max_requests) {}

  // Holds `bytes` of the budget until destroyed. Move-only.
  class Ticket {
   public:
    Ticket() = default;
    Ticket(Ticket&& other) noexcept;
    Ticket& operator=(Ticket&& other) noexcept;
    ~Ticket();

   private:
    friend class AdmissionControl;
    Ticket(AdmissionControl* owner, int64_t bytes)
        : owner_(owner), bytes_(bytes) {}
    AdmissionControl* owner_ = nullptr;
    int64_t bytes_ = 0;
  };

  // A ticket for `bytes`; RESOURCE_EXHAUSTED if `bytes` exceeds the whole
  // budget, DEADLINE_EXCEEDED if the wait outlasts `deadline`.
  absl::StatusOr<Ticket> Admit(int64_t bytes, absl::Time deadline);

  int64_t in_use();
  int64_t waiting();

 private:
  void Release(int64_t bytes);

  const int64_t budget_;
  const int max_requests_;
  absl::Mutex mutex_;
  int64_t in_use_ ABSL_GUARDED_BY(mutex_) = 0;
  int running_ ABSL_GUARDED_BY(mutex_) = 0;
  uint64_t next_number_ ABSL_GUARDED_BY(mutex_) = 0;
  std::list<uint64_t> line_
      ABSL_GUARDED_BY(mutex_);  // waiting, in arrival order
};

}  // namespace ringattn

#endif  // RINGATTN_SERVER_ADMISSION_CONTROL_H_
