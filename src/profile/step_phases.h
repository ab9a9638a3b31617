// KVPAGE_STEP_PHASE(phase): adds the wall time from here to the end of the scope to the phase's
// total when built with KVPAGE_STEP_PHASES (see src/internal/step_phases.h); nothing otherwise.
#ifndef KVPAGE_PROFILE_STEP_PHASES_H_
#define KVPAGE_PROFILE_STEP_PHASES_H_

#include "internal/step_phases.h"

#if KVPAGE_STEP_PHASES
#include <chrono>

namespace kvpage::internal {

StepPhaseTotals& MutableStepPhases();

class ScopedStepPhase {
 public:
  explicit ScopedStepPhase(StepPhase phase)
      : phase_(static_cast<int>(phase)), start_(std::chrono::steady_clock::now()) {}
  ~ScopedStepPhase() {
    StepPhaseTotals& totals = MutableStepPhases();
    totals.nanos[phase_] += std::chrono::duration_cast<std::chrono::nanoseconds>(
                                std::chrono::steady_clock::now() - start_)
                                .count();
    ++totals.calls[phase_];
  }
  ScopedStepPhase(const ScopedStepPhase&) = delete;
  ScopedStepPhase& operator=(const ScopedStepPhase&) = delete;

 private:
  int phase_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace kvpage::internal

#define KVPAGE_STEP_PHASE_CONCAT2(a, b) a##b
#define KVPAGE_STEP_PHASE_CONCAT(a, b) KVPAGE_STEP_PHASE_CONCAT2(a, b)
#define KVPAGE_STEP_PHASE(phase)                                                   \
  ::kvpage::internal::ScopedStepPhase KVPAGE_STEP_PHASE_CONCAT(kvpage_step_phase_, \
                                                               __LINE__)(phase)
#else
#define KVPAGE_STEP_PHASE(phase) static_cast<void>(0)
#endif

#endif  // KVPAGE_PROFILE_STEP_PHASES_H_
