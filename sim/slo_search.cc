#include "sim/slo_search.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kvpage::sim {
namespace {

constexpr int32_t kMaxSearchReplicas = 4096;  // FleetConfig::kMaxReplicas

}  // namespace

absl::Status ReplicaSearchOptions::Validate() const {
  if (max_replicas < 1 || max_replicas > kMaxSearchReplicas) {
    return absl::InvalidArgumentError(absl::StrCat("max_replicas must be in [1, ",
                                                   kMaxSearchReplicas, "], got ", max_replicas));
  }
  return absl::OkStatus();
}

absl::StatusOr<ReplicaSearchResult> SearchFewestReplicas(const ReplicaProbe& probe,
                                                         const ReplicaSearchOptions& options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  ReplicaSearchResult result;
  // Runs one count; true when it met the SLO.
  auto run = [&](int32_t replicas) -> absl::StatusOr<bool> {
    absl::StatusOr<ProbeOutcome> outcome = probe(replicas);
    if (!outcome.ok()) {
      return absl::Status(outcome.status().code(), absl::StrCat("at ", replicas, " replicas: ",
                                                                outcome.status().message()));
    }
    const bool met = outcome->met;
    result.probes.push_back({replicas, *std::move(outcome)});
    return met;
  };

  // Doubling: `failed` is the largest count known to miss (0: none yet), `met` the first hit.
  int32_t failed = 0, met = 0;
  for (int32_t r = 1; met == 0;) {
    absl::StatusOr<bool> ok = run(r);
    if (!ok.ok()) return ok.status();
    if (*ok) {
      met = r;
    } else {
      failed = r;
      if (r == options.max_replicas) return result;  // the bound missed too: no answer
      r = static_cast<int32_t>(std::min<int64_t>(int64_t{2} * r, options.max_replicas));
    }
  }
  // Bisection: every count <= failed misses, every count >= met meets (monotone probe).
  while (met - failed > 1) {
    const int32_t mid = failed + (met - failed) / 2;
    absl::StatusOr<bool> ok = run(mid);
    if (!ok.ok()) return ok.status();
    (*ok ? met : failed) = mid;
  }
  result.fewest = met;
  return result;
}

}  // namespace kvpage::sim
