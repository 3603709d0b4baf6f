#ifndef RINGATTN_CORE_STATUS_MACROS_H_
#define RINGATTN_CORE_STATUS_MACROS_H_

// Early return on error for code that passes absl::Status along.

#include "absl/status/status.h"

// Evaluates `expr` (an absl::Status) once and returns it from the enclosing
// function if it is not OK.
#define RINGATTN_RETURN_IF_ERROR(expr)                   \
  do {                                                   \
    ::absl::Status ringattn_status_ = (expr);            \
    if (!ringattn_status_.ok()) return ringattn_status_; \
  } while (0)

#endif  // RINGATTN_CORE_STATUS_MACROS_H_
