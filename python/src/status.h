// absl::Status to Python exceptions, for every binding of the module.
//
//   InvalidArgument, OutOfRange  -> ValueError
//   NotFound                     -> KeyError
//   ResourceExhausted            -> MemoryError
//   anything else                -> RuntimeError
// The exception carries the status message unchanged. The GIL must be held.
#ifndef KVPAGE_PYTHON_STATUS_H_
#define KVPAGE_PYTHON_STATUS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kvpage::python {

// REQUIRES: !status.ok(). Raises (throws nanobind::python_error) and never returns.
[[noreturn]] void RaiseStatus(const absl::Status& status);

inline void ThrowIfError(const absl::Status& status) {
  if (!status.ok()) RaiseStatus(status);
}

template <typename T>
T ValueOrThrow(absl::StatusOr<T> value) {
  if (!value.ok()) RaiseStatus(value.status());
  return *std::move(value);
}

}  // namespace kvpage::python

#endif  // KVPAGE_PYTHON_STATUS_H_
