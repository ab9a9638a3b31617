// The fewest replicas that meet an SLO, found with few simulations.
//
// SearchFewestReplicas assumes the probe is monotone in the replica count (if r replicas meet
// the SLO, so do r + 1) and runs it at 1, 2, 4, … (doubling, capped at max_replicas) until a
// count meets it, then bisects between the last count that failed and the first that met:
// about 2·log2(answer) probes instead of one per count. A probe that never meets stops at
// max_replicas and reports that no count up to it did, rather than growing forever.
//
// Example (met from 5 on, max_replicas 64): probes 1, 2, 4, 8 (met), then 6 (met), 5 (met):
// the answer is 5.
//
// The probe is injected (a fleet simulation in `kvpage plan --slo`, any function in tests).
// SearchFewestReplicas calls it from the calling thread only, one count at a time; searches of
// different probes may run in parallel (see parallel_for.h).
#ifndef KVPAGE_SIM_SLO_SEARCH_H_
#define KVPAGE_SIM_SLO_SEARCH_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kvpage::sim {

// What one simulation at a replica count gave.
struct ProbeOutcome {
  bool met = false;                // every SLO term within its limit
  std::vector<double> values_ms;  // one per SLO term, in the SLO's order
  int64_t completed = 0;          // requests the run finished (informational)
};

// Runs the system with `replicas` replicas. An error ends the search with that error.
using ReplicaProbe = std::function<absl::StatusOr<ProbeOutcome>(int32_t replicas)>;

struct ReplicaSearchOptions {
  int32_t max_replicas = 256;  // the largest count tried, >= 1

  // InvalidArgument naming max_replicas unless it is in [1, 4096].
  absl::Status Validate() const;
};

struct ReplicaProbeRecord {
  int32_t replicas = 0;
  ProbeOutcome outcome;
};

struct ReplicaSearchResult {
  std::vector<ReplicaProbeRecord> probes;  // in the order they ran
  // The fewest replicas that met; unset when max_replicas did not meet either.
  std::optional<int32_t> fewest;
};

// Errors: InvalidArgument for bad options; the probe's error, prefixed with the replica count.
absl::StatusOr<ReplicaSearchResult> SearchFewestReplicas(const ReplicaProbe& probe,
                                                         const ReplicaSearchOptions& options);

}  // namespace kvpage::sim

#endif  // KVPAGE_SIM_SLO_SEARCH_H_
