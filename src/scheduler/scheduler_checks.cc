// Checks the scheduler makes beyond its main flow: what Create's max_model_len probe reports
// when the memory backing refuses, and the drafts a model output may propose.
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

absl::Status Scheduler::Impl::CheckDraftCounts(const SchedulerOutput& output,
                                               const ModelOutput& result) const {
  if (result.draft_offsets.empty()) return absl::OkStatus();  // (CheckCsr: no drafts)
  for (size_t i = 0; i + 1 < result.draft_offsets.size(); ++i) {
    const int64_t drafts = int64_t{result.draft_offsets[i + 1]} - result.draft_offsets[i];
    if (drafts > config.num_speculative_tokens) {
      return absl::InvalidArgumentError(absl::StrCat(
          "request ", output.requests[i].id.value, " proposes ", drafts,
          " draft tokens, more than num_speculative_tokens ", config.num_speculative_tokens));
    }
  }
  return absl::OkStatus();
}

}  // namespace kvpage
