// Service-level objectives over a run's MetricsSummary: "ttft-p99=2s,tpot-p99=100ms".
//
// A term names a latency (ttft, tpot, itl, e2e — the summary's ttft_ms, tpot_ms, itl_ms and
// e2el_ms, defined in metrics.h), a statistic (p50, p90, p99) and an upper limit with its unit
// (s or ms). A run meets an SLO when it completed at least one request and every term's value
// is at most its limit.
//
// All functions are pure and thread-safe.
#ifndef KVPAGE_SIM_SLO_H_
#define KVPAGE_SIM_SLO_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "sim/metrics.h"

namespace kvpage::sim {

struct SloTerm {
  std::string name;                             // "ttft-p99"
  LatencyStats MetricsSummary::*metric = nullptr;  // &MetricsSummary::ttft_ms, ...
  double LatencyStats::*stat = nullptr;            // &LatencyStats::p99, ...
  double limit_ms = 0;                          // > 0

  // The term's value in `summary`, in ms.
  double ValueMs(const MetricsSummary& summary) const { return (summary.*metric).*stat; }
};

// Parses comma-separated "METRIC-STAT=VALUE UNIT" terms, e.g. "ttft-p99=2s,tpot-p99=100ms".
// InvalidArgument naming the bad term (and the accepted names) for: an empty list or term, a
// term without '=' or value, an unknown metric or statistic, a value that is not a positive
// finite number, a missing or unknown unit, a term given twice.
absl::StatusOr<std::vector<SloTerm>> ParseSlo(absl::string_view text);

// "ttft-p99 <= 2 s, tpot-p99 <= 100 ms".
std::string SloToString(const std::vector<SloTerm>& terms);

// Whether `summary` meets every term (and completed > 0: an empty run meets nothing).
bool MeetsSlo(const MetricsSummary& summary, const std::vector<SloTerm>& terms);

// max over terms of value / limit: below 1 means met with room to spare. 0 for no terms.
double WorstSloRatio(const std::vector<double>& values_ms, const std::vector<SloTerm>& terms);

}  // namespace kvpage::sim

#endif  // KVPAGE_SIM_SLO_H_
