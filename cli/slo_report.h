// What `kvpage plan --slo` prints: the frontier of simulations it ran, one replica search per
// (tp, router) pair, and the answer — the fewest GPUs that met the SLO.
#ifndef KVPAGE_CLI_SLO_REPORT_H_
#define KVPAGE_CLI_SLO_REPORT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "sim/fleet.h"
#include "sim/slo.h"
#include "sim/slo_search.h"

namespace kvpage::cli {

// One replica search: a tensor-parallel degree and a router.
struct SloSearch {
  int32_t tp = 1;
  sim::RouterKind router = sim::RouterKind::kRoundRobin;
  absl::Status status;               // the search's error; OK when it ran to the end
  sim::ReplicaSearchResult result;   // probes run (also those before an error)
};

// What the searches were about, for the report's title and JSON.
struct SloRunInfo {
  std::string model;
  std::string gpu;
  std::string trace;        // file name
  int64_t requests = 0;     // replayed
  double trace_seconds = 0; // last arrival − first arrival
  std::vector<sim::SloTerm> slo;
  int32_t max_replicas = 0; // the bound of every search
};

struct SloAnswer {
  size_t search = 0;      // index into the searches
  int32_t replicas = 0;
  int64_t gpus = 0;       // replicas × tp
};

// The fewest GPUs (replicas × tp) over searches that found a count. Ties go to the most
// headroom (the smallest worst value / limit over the SLO terms at that count), then the
// smaller tp, then the search listed first. nullopt when no search met the SLO.
std::optional<SloAnswer> PickSloAnswer(const std::vector<SloSearch>& searches,
                                       const std::vector<sim::SloTerm>& slo);

// One line per simulation (sorted by tp, router as listed, replicas): tp, router, replicas,
// GPUs, each SLO term's value in ms, met; then each search's outcome and the answer.
std::string SloFrontierTable(const SloRunInfo& info, const std::vector<SloSearch>& searches,
                             const std::optional<SloAnswer>& answer);

// {"model", "gpu", "trace", "requests", "trace_seconds", "max_replicas",
//  "slo": [{"metric", "limit_ms"}],
//  "searches": [{"tp", "router", "fewest_replicas" (null if none), "gpus" (null), "error"
//                (null), "probes": [{"replicas", "gpus", "completed", "met",
//                "values_ms": {metric: ms}}]}],
//  "answer": {"tp", "router", "replicas", "gpus", "values_ms"} or null}. Pretty-printed.
std::string SloFrontierJson(const SloRunInfo& info, const std::vector<SloSearch>& searches,
                            const std::optional<SloAnswer>& answer);

}  // namespace kvpage::cli

#endif  // KVPAGE_CLI_SLO_REPORT_H_
