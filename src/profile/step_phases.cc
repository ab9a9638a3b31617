#include "profile/step_phases.h"

namespace kvpage {

absl::string_view StepPhaseName(StepPhase phase) {
  switch (phase) {
    case StepPhase::kReleaseWindows: return "Schedule: window releases";
    case StepPhase::kScheduleRunning: return "Schedule: running pass";
    case StepPhase::kAllocateDecodeStep: return "  AllocateDecodeStep";
    case StepPhase::kBuildOutput: return "Schedule: output";
    case StepPhase::kUpdate: return "Update";
    case StepPhase::kAppendDecodeTokens: return "  AppendDecodeTokens (general steps)";
    case StepPhase::kCompleteBlocks: return "  completed blocks";
    case StepPhase::kCount: break;
  }
  return "unknown";
}

#if KVPAGE_STEP_PHASES
namespace internal {
StepPhaseTotals& MutableStepPhases() {
  static StepPhaseTotals totals;
  return totals;
}
}  // namespace internal
bool StepPhasesEnabled() { return true; }
StepPhaseTotals ReadStepPhases() { return internal::MutableStepPhases(); }
void ResetStepPhases() { internal::MutableStepPhases() = {}; }
#else
bool StepPhasesEnabled() { return false; }
StepPhaseTotals ReadStepPhases() { return {}; }
void ResetStepPhases() {}
#endif

}  // namespace kvpage
