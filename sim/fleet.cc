// A fleet of replicas behind a router on one virtual clock (see fleet.h, docs/simulator.md,
// "Fleet").
#include "sim/fleet.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "internal/status_macros.h"
#include "kvpage/kv_event_wire.h"
#include "nlohmann/json.hpp"
#include "sim/replica.h"
#include "sim/router.h"

namespace kvpage::sim {
namespace {

constexpr RouterKind kRouterKinds[] = {RouterKind::kRoundRobin, RouterKind::kLeastLoaded,
                                       RouterKind::kPrefixAware, RouterKind::kKvEvents};

// Tokens per block of the cache's first attention group: what routers hash and count in.
int32_t HashBlockSize(const KvCacheManager& kv) {
  for (int32_t g = 0; g < kv.num_groups(); ++g) {
    if (kv.group_block_size(GroupId(g)) > 0) return kv.group_block_size(GroupId(g));
  }
  return kv.config().block_size;
}

// The group a kv-events router indexes: the first that holds whole prefixes (full attention
// or MLA), else group 0.
int32_t IndexedGroup(const std::vector<KvEventGroupInfo>& groups) {
  for (size_t g = 0; g < groups.size(); ++g) {
    if (groups[g].kind == "full_attention" || groups[g].kind == "mla_attention") {
      return static_cast<int32_t>(g);
    }
  }
  return 0;
}

// Adds one replica's host tier into the fleet's sum (bytes_per_s is set afterwards).
void AddHostTier(const SimHostTier& one, absl::optional<SimHostTier>& sum) {
  if (!sum.has_value()) {
    sum = SimHostTier{.policy = one.policy, .pcie_gbps = one.pcie_gbps};
  }
  sum->budget_bytes += one.budget_bytes;
  sum->device_hit_tokens += one.device_hit_tokens;
  sum->host_hit_tokens += one.host_hit_tokens;
  HostCacheStats& s = sum->stats;
  s.budget_bytes += one.stats.budget_bytes;
  s.mapped_bytes += one.stats.mapped_bytes;
  s.ready_blocks += one.stats.ready_blocks;
  s.saving_blocks += one.stats.saving_blocks;
  s.saves += one.stats.saves;
  s.loads += one.stats.loads;
  s.failed_transfers += one.stats.failed_transfers;
  s.evictions += one.stats.evictions;
  s.loaded_tokens += one.stats.loaded_tokens;
  s.saved_bytes += one.stats.saved_bytes;
  s.loaded_bytes += one.stats.loaded_bytes;
  sum->link_busy_s += one.link_busy_s;
  sum->save_wait_s += one.save_wait_s;
}

// Everything after the run: per-replica results, then the fleet's sums over them.
absl::StatusOr<FleetResult> Collect(std::vector<std::unique_ptr<Replica>>& replicas,
                                    const std::vector<int64_t>& routed) {
  FleetResult fleet;
  double busy_max = 0;
  double busy_sum = 0;
  for (size_t r = 0; r < replicas.size(); ++r) {
    ReplicaStats stats;
    KVPAGE_ASSIGN_OR_RETURN(stats.result, replicas[r]->TakeResult());
    stats.busy_s = replicas[r]->busy_s();
    stats.routed = routed[r];
    busy_max = std::max(busy_max, stats.busy_s);
    busy_sum += stats.busy_s;
    const SimResult& one = stats.result;
    fleet.requests.insert(fleet.requests.end(), one.requests.begin(), one.requests.end());
    fleet.prefix_cache.queried_tokens += one.prefix_cache.queried_tokens;
    fleet.prefix_cache.hit_tokens += one.prefix_cache.hit_tokens;
    fleet.simulated_seconds = std::max(fleet.simulated_seconds, one.simulated_seconds);
    if (one.host_tier.has_value()) AddHostTier(*one.host_tier, fleet.host_tier);
    fleet.replicas.push_back(std::move(stats));
  }
  if (fleet.host_tier.has_value() && fleet.simulated_seconds > 0) {
    fleet.host_tier->bytes_per_s =
        static_cast<double>(fleet.host_tier->stats.saved_bytes +
                            fleet.host_tier->stats.loaded_bytes) /
        fleet.simulated_seconds;
  }
  std::sort(fleet.requests.begin(), fleet.requests.end(),
            [](const RequestRecord& a, const RequestRecord& b) { return a.index < b.index; });
  if (fleet.prefix_cache.queried_tokens > 0) {
    fleet.prefix_cache.hit_rate = static_cast<double>(fleet.prefix_cache.hit_tokens) /
                                  static_cast<double>(fleet.prefix_cache.queried_tokens);
  }
  const double busy_mean = busy_sum / static_cast<double>(replicas.size());
  fleet.load_imbalance = busy_mean > 0 ? busy_max / busy_mean : 0.0;
  KVPAGE_ASSIGN_OR_RETURN(fleet.summary, Summarize(fleet.requests));
  return fleet;
}

}  // namespace

absl::string_view RouterKindName(RouterKind kind) {
  switch (kind) {
    case RouterKind::kRoundRobin:
      return "round-robin";
    case RouterKind::kLeastLoaded:
      return "least-loaded";
    case RouterKind::kPrefixAware:
      return "prefix-aware";
    case RouterKind::kKvEvents:
      return "kv-events";
  }
  return "unknown";
}

absl::StatusOr<RouterKind> ParseRouterKind(absl::string_view text) {
  for (RouterKind kind : kRouterKinds) {
    if (text == RouterKindName(kind)) return kind;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown router '", text, "'; expected round-robin, least-loaded, prefix-aware or kv-events"));
}

absl::Status FleetConfig::Validate() const {
  if (replicas < 1 || replicas > kMaxReplicas) {
    return absl::InvalidArgumentError(
        absl::StrCat("replicas must be in [1, ", kMaxReplicas, "], got ", replicas));
  }
  if (!std::isfinite(overlap_weight) || overlap_weight < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("overlap_weight must be finite and >= 0, got ", overlap_weight));
  }
  return replica.Validate();
}

absl::StatusOr<FleetResult> SimulateFleet(const std::vector<TraceRequest>& trace,
                                          const FleetConfig& config) {
  const auto wall_start = std::chrono::steady_clock::now();
  KVPAGE_RETURN_IF_ERROR(config.Validate());
  KVPAGE_RETURN_IF_ERROR(ValidateRun(trace, config.replica));
  std::unique_ptr<CostModel> owned_cost;
  KVPAGE_ASSIGN_OR_RETURN(const CostModel* cost, ResolveCostModel(config.replica, &owned_cost));
  SimConfig replica_config = config.replica;
  if (config.router == RouterKind::kKvEvents) {
    replica_config.scheduler.kv.enable_kv_events = true;
  }
  std::vector<std::unique_ptr<Replica>> replicas;
  std::vector<Replica*> views;
  for (int32_t r = 0; r < config.replicas; ++r) {
    absl::StatusOr<std::unique_ptr<Replica>> replica =
        Replica::Create(trace, replica_config, *cost);
    if (!replica.ok()) {
      return absl::Status(replica.status().code(),
                          absl::StrCat("replica ", r, ": ", replica.status().message()));
    }
    views.push_back(replica->get());
    replicas.push_back(*std::move(replica));
  }
  const KvCacheManager& kv = replicas[0]->kv_cache();
  const std::vector<KvEventGroupInfo> groups = KvEventGroupInfos(kv);
  KVPAGE_ASSIGN_OR_RETURN(std::unique_ptr<Router> router,
                          CreateRouter(config.router, config.replicas, config.overlap_weight,
                                       HashBlockSize(kv), IndexedGroup(groups)));
  std::vector<int64_t> routed(static_cast<size_t>(config.replicas), 0);
  int64_t event_bytes = 0;
  const auto route = [&](size_t pos, absl::Span<const int32_t> prompt) {
    const int32_t r = router->Pick({trace[pos].index, prompt}, views);
    ++routed[static_cast<size_t>(r)];
    return r;
  };
  const auto publish = [&](int32_t r) -> absl::Status {
    if (!router->wants_kv_events()) return absl::OkStatus();
    const std::vector<KvEvent> events = replicas[r]->DrainKvEvents();
    if (events.empty()) return absl::OkStatus();
    KvEventWireOptions options;
    options.data_parallel_rank = r;
    KVPAGE_ASSIGN_OR_RETURN(
        std::string payload,
        EncodeKvEventBatch(replicas[r]->clock_s(), events, groups, options));
    event_bytes += static_cast<int64_t>(payload.size());
    return router->Observe(r, payload);
  };
  KVPAGE_RETURN_IF_ERROR(
      RunOnOneClock(trace, views, replica_config, /*name_replicas=*/true, route, publish));

  KVPAGE_ASSIGN_OR_RETURN(FleetResult result, Collect(replicas, routed));
  result.event_bytes = event_bytes;
  if (result.simulated_seconds > 0) {
    result.event_bytes_per_s = static_cast<double>(event_bytes) / result.simulated_seconds;
  }
  result.wall_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  return result;
}

std::string FleetResultToJson(const FleetResult& r, const FleetConfig& config) {
  using ojson = nlohmann::ordered_json;
  ojson j = ojson::parse(SummaryToJson(r.summary));
  int64_t preemptions = 0, dropped = 0, truncated = 0;
  for (const ReplicaStats& s : r.replicas) {
    preemptions += s.result.preemptions;
    dropped += s.result.dropped_requests;
    truncated += s.result.truncated_requests;
  }
  j["router"] = std::string(RouterKindName(config.router));
  j["replicas"] = config.replicas;
  j["overlap_weight"] = config.overlap_weight;
  j["prefix_cache"] = ojson{{"queried_tokens", r.prefix_cache.queried_tokens},
                            {"hit_tokens", r.prefix_cache.hit_tokens},
                            {"hit_rate", r.prefix_cache.hit_rate}};
  if (r.host_tier.has_value()) j["host_tier"] = ojson::parse(HostTierToJson(*r.host_tier));
  j["load_imbalance"] = r.load_imbalance;
  j["event_bytes"] = r.event_bytes;
  j["event_bytes_per_s"] = r.event_bytes_per_s;
  j["preemptions"] = preemptions;
  j["dropped_requests"] = dropped;
  j["truncated_requests"] = truncated;
  j["simulated_seconds"] = r.simulated_seconds;
  j["wall_seconds"] = r.wall_seconds;
  ojson per_replica = ojson::array();
  for (const ReplicaStats& s : r.replicas) {
    per_replica.push_back(ojson{{"routed", s.routed},
                                {"completed", s.result.summary.completed},
                                {"busy_s", s.busy_s},
                                {"hit_rate", s.result.prefix_cache.hit_rate},
                                {"kv_usage_peak", s.result.kv_usage[0].peak},
                                {"preemptions", s.result.preemptions},
                                {"num_steps", s.result.num_steps}});
  }
  j["per_replica"] = std::move(per_replica);
  return j.dump(2) + "\n";
}

}  // namespace kvpage::sim
