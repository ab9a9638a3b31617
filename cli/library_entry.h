// `kvpage plan` and `kvpage sim` as functions: the same flags, parsed by the same code, giving
// the plans and simulation results the commands print, without printing them. The Python
// module (python/) calls these, so Python and the CLI agree for the same arguments.
#ifndef KVPAGE_CLI_LIBRARY_ENTRY_H_
#define KVPAGE_CLI_LIBRARY_ENTRY_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kvpage/planner.h"
#include "sim/fleet.h"
#include "sim/simulator.h"

namespace kvpage::cli {

// The plans `kvpage plan <args> --format json` prints, one per (model, policy).
// InvalidArgument for a bad flag, --help, --plot, --host-cache-gib or --slo (not offered
// here); the planner's and the catalog's errors otherwise (NotFound for an unknown model or GPU).
absl::StatusOr<std::vector<Plan>> PlansForArgs(const std::vector<std::string>& args);

// One `kvpage sim` run: one result per allocator, and the JSON `--output-json -` prints.
struct SimRun {
  std::vector<std::string> allocators;
  std::vector<sim::SimResult> results;
  std::string json;
};

// `kvpage sim <args> --output-json -` without the progress bar. InvalidArgument for a bad
// flag, --help, --output-dir or a fleet (--replicas, --router, --overlap-weight; not offered
// here); the simulator's errors otherwise.
absl::StatusOr<SimRun> SimulateForArgs(const std::vector<std::string>& args);

// One fleet run of `kvpage sim` (--replicas, --router, --overlap-weight): the result and the
// JSON `--output-json -` prints.
struct FleetSimRun {
  sim::FleetResult result;
  std::string json;
  size_t num_requests = 0;  // in the trace
};

// `kvpage sim <args> --output-json -` for a fleet, without the progress bar. InvalidArgument
// for a bad flag, --help, --output-dir or --compare-allocators; the simulator's errors
// otherwise.
absl::StatusOr<FleetSimRun> SimulateFleetForArgs(const std::vector<std::string>& args);

// `kvpage plan --trace FILE --slo S <args> --format json` without the progress line: the JSON
// it prints (its "answer" null when no search met the SLO). InvalidArgument for a bad flag,
// --help, --plot or --format; the model's, GPU's and trace's errors otherwise.
absl::StatusOr<std::string> SloPlanJsonForArgs(const std::vector<std::string>& args);

}  // namespace kvpage::cli

#endif  // KVPAGE_CLI_LIBRARY_ENTRY_H_
