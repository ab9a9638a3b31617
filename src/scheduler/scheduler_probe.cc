// What Scheduler::Create's max_model_len probe reports when the memory backing refuses.
#include "absl/strings/str_cat.h"
#include "scheduler/scheduler_impl.h"

namespace kvpage {

absl::Status Scheduler::Impl::ProbeBackingStatus() const {
  const absl::Status status = kv->backing_status();
  if (status.ok()) return status;
  return absl::Status(status.code(),
                      absl::StrCat("the KV cache's memory backing refused to map memory while "
                                   "probing max_model_len: ", status.message()));
}

}  // namespace kvpage
