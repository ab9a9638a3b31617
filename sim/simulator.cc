// The event loop of `kvpage sim` (see simulator.h and docs/simulator.md, "Event loop").
#include "sim/simulator.h"

#include <chrono>
#include <cmath>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "internal/status_macros.h"
#include "nlohmann/json.hpp"
#include "sim/replica.h"
#include "spdlog/spdlog.h"

namespace kvpage::sim {

absl::Status MaxModelLenError(int64_t max_model_len) {
  return absl::InvalidArgumentError(absl::StrCat(
      "max_model_len ", max_model_len, " is more than the simulator runs: at most ",
      kMaxRequestTokens, " tokens a request (each request's token ids are built and kept, and ",
      "the scheduler builds one request that long when it starts)"));
}

absl::Status SimConfig::Validate() const {
  if (vocab_size < 2) {
    return absl::InvalidArgumentError(absl::StrCat("vocab_size must be >= 2, got ", vocab_size));
  }
  if (model.vocab_size > 0 && vocab_size > model.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("vocab_size ", vocab_size,
                                                   " exceeds the model's vocab_size ",
                                                   model.vocab_size));
  }
  if (scheduler.max_model_len > kMaxRequestTokens) return MaxModelLenError(scheduler.max_model_len);
  if (progress_interval_steps < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("progress_interval_steps must be >= 1, got ", progress_interval_steps));
  }
  if (!std::isfinite(pcie_gbps) || pcie_gbps <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("pcie_gbps must be finite and > 0, got ", pcie_gbps));
  }
  if (cost_model == nullptr) KVPAGE_RETURN_IF_ERROR(cost.Validate());
  return absl::OkStatus();
}

absl::string_view HostTierPolicyName(HostTierPolicy policy) {
  return policy == HostTierPolicy::kWriteBack ? "write-back" : "write-through";
}

absl::StatusOr<SimResult> Simulate(const std::vector<TraceRequest>& trace,
                                   const SimConfig& config) {
  const auto wall_start = std::chrono::steady_clock::now();
  KVPAGE_RETURN_IF_ERROR(ValidateRun(trace, config));
  std::unique_ptr<CostModel> owned_cost;
  KVPAGE_ASSIGN_OR_RETURN(const CostModel* cost, ResolveCostModel(config, &owned_cost));
  KVPAGE_ASSIGN_OR_RETURN(std::unique_ptr<Replica> replica,
                          Replica::Create(trace, config, *cost));
  Replica* const replicas[] = {replica.get()};
  KVPAGE_RETURN_IF_ERROR(RunOnOneClock(
      trace, replicas, config, /*name_replicas=*/false,
      [](size_t, absl::Span<const int32_t>) { return 0; },
      [](int32_t) { return absl::OkStatus(); }));
  KVPAGE_ASSIGN_OR_RETURN(SimResult result, replica->TakeResult());
  if (result.dropped_requests > 0) {
    spdlog::debug("kvpage sim: dropped {} request(s) longer than max_model_len {}",
                  result.dropped_requests, result.max_model_len);
  }
  result.wall_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  return result;
}

std::string SimResultToJson(const SimResult& r) {
  using ojson = nlohmann::ordered_json;
  ojson j = ojson::parse(SummaryToJson(r.summary));
  j["preemptions"] = r.preemptions;
  j["prefix_cache"] = ojson{{"queried_tokens", r.prefix_cache.queried_tokens},
                            {"hit_tokens", r.prefix_cache.hit_tokens},
                            {"hit_rate", r.prefix_cache.hit_rate}};
  if (r.host_tier.has_value()) j["host_tier"] = ojson::parse(HostTierToJson(*r.host_tier));
  ojson usage = ojson::object();
  for (const PoolUsageStats& p : r.kv_usage) {
    usage[p.name] = ojson{{"peak", p.peak}, {"mean", p.mean}};
  }
  j["kv_usage"] = std::move(usage);
  j["kv_mapped"] = ojson{{"peak", r.kv_mapped.peak}, {"mean", r.kv_mapped.mean}};
  j["max_concurrency"] = r.max_concurrency;
  j["num_steps"] = r.num_steps;
  j["dropped_requests"] = r.dropped_requests;
  j["truncated_requests"] = r.truncated_requests;
  j["kv_budget_bytes"] = r.kv_budget_bytes;
  j["block_size"] = r.block_size;
  j["max_model_len"] = r.max_model_len;
  j["simulated_seconds"] = r.simulated_seconds;
  j["wall_seconds"] = r.wall_seconds;
  return j.dump(2) + "\n";
}

std::string HostTierToJson(const SimHostTier& h) {
  using ojson = nlohmann::ordered_json;
  const ojson j = {{"budget_bytes", h.budget_bytes},
                   {"policy", std::string(HostTierPolicyName(h.policy))},
                   {"pcie_gbps", h.pcie_gbps},
                   {"device_hit_tokens", h.device_hit_tokens},
                   {"host_hit_tokens", h.host_hit_tokens},
                   {"saves", h.stats.saves},
                   {"loads", h.stats.loads},
                   {"saved_bytes", h.stats.saved_bytes},
                   {"loaded_bytes", h.stats.loaded_bytes},
                   {"evictions", h.stats.evictions},
                   {"failed_transfers", h.stats.failed_transfers},
                   {"bytes_per_s", h.bytes_per_s},
                   {"link_busy_s", h.link_busy_s},
                   {"save_wait_s", h.save_wait_s}};
  return j.dump();
}

}  // namespace kvpage::sim
