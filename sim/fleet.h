// A fleet of replicas behind a router, on one virtual clock (`kvpage sim --replicas N`).
//
// Every replica is a full copy of the single-replica simulation (simulator.h): its own real
// Scheduler and KvCacheManager, its own cost model and its own timeline. A request is routed
// once, at its arrival time, by a Router that sees the replicas as they are at that instant;
// each replica then steps on its own clock. One replica with any router reproduces Simulate
// exactly.
//
// Thread-compatible: SimulateFleet touches no shared state; runs may proceed in parallel.
#ifndef KVPAGE_SIM_FLEET_H_
#define KVPAGE_SIM_FLEET_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "sim/metrics.h"
#include "sim/simulator.h"
#include "sim/trace.h"

namespace kvpage::sim {

enum class RouterKind : uint8_t {
  kRoundRobin,   // request i goes to replica i mod N
  kLeastLoaded,  // fewest outstanding tokens (prompt tokens still to prefill + output tokens
                 // still to generate); ties to the lowest index
  kPrefixAware,  // longest cached prefix in the replicas' real prefix caches, ties by load
  kKvEvents,     // scores only from the replicas' published KV events (wire bytes), plus load;
                 // it skips host-tier events: like prefix-aware, it sees device caches
};

// "round-robin", "least-loaded", "prefix-aware", "kv-events".
absl::string_view RouterKindName(RouterKind kind);
// InvalidArgument naming `text` and listing the names above.
absl::StatusOr<RouterKind> ParseRouterKind(absl::string_view text);

struct FleetConfig {
  SimConfig replica;       // every replica's configuration (model, GPU, scheduler, cost, seed)
  int32_t replicas = 1;    // data-parallel replicas, 1..kMaxReplicas
  RouterKind router = RouterKind::kRoundRobin;
  // kv-events and prefix-aware: weight of a cached block against a block of load, as in
  // Dynamo's KV router cost (overlap weight 1 by default).
  double overlap_weight = 1.0;

  static constexpr int32_t kMaxReplicas = 4096;
  absl::Status Validate() const;
};

struct ReplicaStats {
  SimResult result;        // the replica's own run (its requests only)
  double busy_s = 0;       // sum of its step times
  int64_t routed = 0;      // requests routed to it
};

struct FleetResult {
  MetricsSummary summary;               // over every request of the fleet
  std::vector<RequestRecord> requests;  // every finished request, in trace order
  std::vector<ReplicaStats> replicas;
  SimPrefixCache prefix_cache;          // fleet-wide first-admission hits
  // With a host tier: every replica's, summed (budget, hits, counters, bytes, link and wait
  // times); bytes_per_s over the fleet's simulated seconds.
  absl::optional<SimHostTier> host_tier;
  double load_imbalance = 0;            // max / mean busy time over replicas (1 = balanced)
  int64_t event_bytes = 0;              // kv-events: payload bytes the replicas published
  double event_bytes_per_s = 0;         // event_bytes / simulated seconds
  double simulated_seconds = 0;
  double wall_seconds = 0;
};

// Errors: InvalidArgument for a bad config; any replica's Simulate error, naming the replica.
absl::StatusOr<FleetResult> SimulateFleet(const std::vector<TraceRequest>& trace,
                                          const FleetConfig& config);

// What `kvpage sim --replicas N --output-json` writes: SummaryToJson's fields (over every
// request), then "router", "replicas", "overlap_weight", "prefix_cache" {queried_tokens,
// hit_tokens, hit_rate}, with a host tier "host_tier" (HostTierToJson), "load_imbalance", "event_bytes", "event_bytes_per_s", "preemptions",
// "dropped_requests", "truncated_requests", "simulated_seconds", "wall_seconds", and
// "per_replica": one object per replica {"routed", "completed", "busy_s", "hit_rate",
// "kv_usage_peak", "preemptions", "num_steps"}. Pretty-printed with 2 spaces; keys in that
// fixed order.
std::string FleetResultToJson(const FleetResult& result, const FleetConfig& config);

}  // namespace kvpage::sim

#endif  // KVPAGE_SIM_FLEET_H_
