// Status propagation macros. Debian's Abseil (20220623) ships no public equivalent.
#ifndef KVPAGE_INTERNAL_STATUS_MACROS_H_
#define KVPAGE_INTERNAL_STATUS_MACROS_H_

#include <cassert>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define KVPAGE_CONCAT_INNER_(a, b) a##b
#define KVPAGE_CONCAT_(a, b) KVPAGE_CONCAT_INNER_(a, b)

// Evaluates `expr` (an absl::Status) and returns it from the enclosing function if not OK.
#define KVPAGE_RETURN_IF_ERROR(expr)                    \
  do {                                                  \
    ::absl::Status kvpage_status_ = (expr);             \
    if (!kvpage_status_.ok()) return kvpage_status_;    \
  } while (false)

// `lhs` is a declaration or an lvalue; `rexpr` yields an absl::StatusOr<T>.
#define KVPAGE_ASSIGN_OR_RETURN(lhs, rexpr) \
  KVPAGE_ASSIGN_OR_RETURN_IMPL_(KVPAGE_CONCAT_(kvpage_statusor_, __LINE__), lhs, rexpr)

#define KVPAGE_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                  \
  if (!statusor.ok()) return std::move(statusor).status();  \
  lhs = *std::move(statusor)

// Programmer errors (broken invariants, API misuse that a caller cannot handle) abort in
// debug builds; release builds compile the check away.
#define KVPAGE_DCHECK(cond) assert(cond)

#endif  // KVPAGE_INTERNAL_STATUS_MACROS_H_
