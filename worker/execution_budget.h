#ifndef RINGATTN_WORKER_EXECUTION_BUDGET_H_
#define RINGATTN_WORKER_EXECUTION_BUDGET_H_

// ExecutionBudget: admission control of a worker. It bounds how many requests
// execute at once and how much memory they hold together; a request that does
// not fit is turned away with RESOURCE_EXHAUSTED instead of queueing or
// running out of memory. Thread-safe.

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace ringattn {

class ExecutionBudget {
 public:
  // What one admitted execution holds: its place among the concurrent
  // executions and the memory it reserved. Returned to the budget when
  // destroyed. Movable, not copyable; not thread-safe.
  class Ticket {
   public:
    Ticket() = default;
    Ticket(Ticket&& other) noexcept;
    Ticket& operator=(Ticket&& other) noexcept;
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;
    ~Ticket();

    // Reserves `bytes` more for this execution; RESOURCE_EXHAUSTED, saying
    // how much was asked for and how much is free, if they do not fit.
    absl::Status Reserve(int64_t bytes);
    int64_t reserved_bytes() const { return bytes_; }

   private:
    friend class ExecutionBudget;
    explicit Ticket(ExecutionBudget* budget) : budget_(budget) {}
    void Return();

    ExecutionBudget* budget_ = nullptr;
    int64_t bytes_ = 0;
  };

  // At most `max_executions` at once, holding at most `memory_bytes`.
  ExecutionBudget(int max_executions, int64_t memory_bytes);
  ExecutionBudget(const ExecutionBudget&) = delete;
  ExecutionBudget& operator=(const ExecutionBudget&) = delete;

  // A ticket for one more execution, or RESOURCE_EXHAUSTED if
  // max_executions are running. Every ticket must be destroyed before the
  // budget.
  absl::StatusOr<Ticket> Admit();

  int executions() const;
  int64_t reserved_bytes() const;

 private:
  const int max_executions_;
  const int64_t memory_bytes_;
  mutable absl::Mutex mutex_;
  int executions_ ABSL_GUARDED_BY(mutex_) = 0;
  int64_t reserved_bytes_ ABSL_GUARDED_BY(mutex_) = 0;
};

}  // namespace ringattn

#endif  // RINGATTN_WORKER_EXECUTION_BUDGET_H_
