// kvpage_step_counter: runs steady decode steps of the scheduler benchmark's server so that
// callgrind can count what one step costs, exactly and without the timing noise of a shared
// machine. Instructions and simulated cache misses per request settle differences of a few
// percent that wall-clock runs on a noisy VM cannot (docs/benchmarks.md).
//
//   scripts/count_step.sh [model] [requests] [steps]      # runs this under callgrind
//   build/bin/kvpage_step_counter qwen3-8b 1024 64 [caching 0|1]
//
// The prefill and a few warm-up steps run with callgrind's instrumentation off; only the
// measured steps (Schedule, the fake model's tokens, Update) are counted. Without valgrind's
// headers (or outside valgrind) the program just runs the steps.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "decode_server.h"
#include "internal/step_phases.h"

#if defined(__has_include)
#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#endif
#endif
#ifndef CALLGRIND_START_INSTRUMENTATION
#define CALLGRIND_START_INSTRUMENTATION
#define CALLGRIND_STOP_INSTRUMENTATION
#endif

int main(int argc, char** argv) {
  const char* model = argc > 1 ? argv[1] : "qwen3-8b";
  const int requests = argc > 2 ? std::atoi(argv[2]) : 1024;
  const int steps = argc > 3 ? std::atoi(argv[3]) : 64;
  const bool caching = argc > 4 ? std::atoi(argv[4]) != 0 : true;
  if (requests < 1 || steps < 1 || steps > 4096) {
    std::fprintf(stderr, "usage: %s [model] [requests >= 1] [steps 1..4096] [prefix caching 0|1]\n",
                 argv[0]);
    return 2;
  }
  kvpage_bench::DecodeServer server(model, requests, caching);
  // Warm-up: the first steps after the prefill touch memory for the first time.
  for (int i = 0; i < 16 && server.error().empty(); ++i) server.Apply(server.scheduler().Schedule());
  if (!server.error().empty()) {
    std::fprintf(stderr, "error: %s\n", server.error().c_str());
    return 1;
  }
  kvpage::ResetStepPhases();
  CALLGRIND_START_INSTRUMENTATION;
  for (int i = 0; i < steps; ++i) {
    const kvpage::SchedulerOutput& out = server.scheduler().Schedule();
    if (static_cast<int>(out.requests.size()) != requests || !server.Apply(out)) {
      std::fprintf(stderr, "step %d: not every request decoded: %s\n", i, server.error().c_str());
      return 1;
    }
  }
  CALLGRIND_STOP_INSTRUMENTATION;
  std::printf("%s: %d steady decode steps of %d requests (prefix caching %s)\n", model, steps,
              requests, caching ? "on" : "off");
  // How much of the process sits in transparent huge pages (kvpage asks for them for its
  // large arrays, src/internal/huge_page_allocator.h); Linux only.
  std::ifstream smaps("/proc/self/smaps_rollup");
  for (std::string line; std::getline(smaps, line);) {
    if (line.rfind("Rss:", 0) == 0 || line.rfind("AnonHugePages:", 0) == 0) {
      std::printf("memory %s\n", line.c_str());
    }
  }
  if (kvpage::StepPhasesEnabled()) {
    // Built with KVPAGE_STEP_PHASES: wall time per step of each phase.
    const kvpage::StepPhaseTotals totals = kvpage::ReadStepPhases();
    for (int p = 0; p < kvpage::kNumStepPhases; ++p) {
      const std::string name(kvpage::StepPhaseName(static_cast<kvpage::StepPhase>(p)));
      std::printf("phase %-26s %8.2f us per step\n", name.c_str(),
                  static_cast<double>(totals.nanos[p]) / 1e3 / steps);
    }
  }
  return 0;
}
