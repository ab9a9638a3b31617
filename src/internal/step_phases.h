// Step phases: where the wall time of the scheduler's decode step goes, for people tuning it.
//
// Built with `cmake -DKVPAGE_STEP_PHASES=ON` (scripts/step_phases.sh does it in a build
// directory of its own), the scheduler and the KV cache manager add the wall time of each
// phase below to process-wide totals; otherwise nothing is recorded, the calls below cost
// nothing, and StepPhasesEnabled() is false. The totals are not synchronised: read them from
// the thread that drives the scheduler.
#ifndef KVPAGE_INTERNAL_STEP_PHASES_H_
#define KVPAGE_INTERNAL_STEP_PHASES_H_

#include <array>
#include <cstdint>

#include "absl/strings/string_view.h"

namespace kvpage {

enum class StepPhase : uint8_t {
  kReleaseWindows,      // Schedule(): freeing the blocks sliding windows have moved past
  kScheduleRunning,     // Schedule(): the pass over running requests, AllocateDecodeStep included
  kAllocateDecodeStep,  // KvCacheManager::AllocateDecodeStep
  kBuildOutput,         // Schedule(): the device-ready rows and the per-request output
  kUpdate,              // Update(), the appends of sampled tokens included
  kAppendDecodeTokens,  // KvCacheManager::AppendDecodeTokens (Update of a step that is not
                        // one sample each; a steady step appends through a DecodeAppender)
  kCompleteBlocks,      // AppendDecodeTokens or DecodeAppender::Finish: moving completed
                        // blocks out of the tails, hashing them
  kCount,
};
inline constexpr int kNumStepPhases = static_cast<int>(StepPhase::kCount);

absl::string_view StepPhaseName(StepPhase phase);

struct StepPhaseTotals {
  std::array<int64_t, kNumStepPhases> nanos{};  // wall time, summed over calls
  std::array<int64_t, kNumStepPhases> calls{};
};

bool StepPhasesEnabled();
StepPhaseTotals ReadStepPhases();
void ResetStepPhases();

}  // namespace kvpage

#endif  // KVPAGE_INTERNAL_STEP_PHASES_H_
