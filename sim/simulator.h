// The simulator's event loop: replays a request trace through kvpage's real Scheduler and
// KvCacheManager on a virtual clock that a CostModel advances by one step's GPU time.
//
// One run (Simulate) owns one Scheduler. Each iteration adds every request that has arrived by
// the clock, asks the scheduler for a step, prices the step with the cost model, advances the
// clock by that time, "samples" one deterministic token per request that finished its known
// tokens, and feeds the step back to the scheduler. When nothing is running or waiting the
// clock jumps to the next arrival. Every output token of a step is stamped with the clock at
// the step's end. Nothing reads wall time except `wall_seconds`, so a run is bit-reproducible
// for a given trace, configuration and seed. The loop is one Replica (replica.h) on the clock
// of RunOnOneClock, the loop SimulateFleet (fleet.h) runs with many.
//
// Request admission rules (docs/simulator.md, "Event loop"):
//   * a prompt the scheduler refuses because it leaves no room for one output token under
//     max_model_len is dropped and counted in SimResult::dropped_requests (vLLM answers such
//     requests with an error instead of serving them);
//   * a request that reaches max_model_len while generating finishes early (the scheduler's
//     kMaxModelLen) and is counted in SimResult::truncated_requests; its record holds the tokens
//     it did generate;
//   * a request that can never run — nothing is running, nothing was preempted, no host-tier
//     copy is in flight, and the scheduler still schedules nothing — makes the run fail with
//     ResourceExhausted naming the request and its length: the KV budget is too small for it,
//     and waiting longer cannot help.
//
// Host tier (scheduler.kv.host_cache with a budget): each replica has one PCIe link, a FIFO
// that copies a step's TierTransfers at `pcie_gbps`, both directions in turn (docs/simulator.md,
// "Host tier"). A step whose transfers hold write-back saves starts its forward pass when they
// have finished on the link; write-through saves and loads run beside the forward passes. A
// transfer is completed (Scheduler::CompleteTransfers) at the first step boundary at or after
// its last copy ends; a replica with nothing to run but copies in flight waits for them.
//
// Thread-compatible: Simulate touches no shared state; runs may proceed in parallel.
#ifndef KVPAGE_SIM_SIMULATOR_H_
#define KVPAGE_SIM_SIMULATOR_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/optional.h"
#include "kvpage/catalog.h"
#include "kvpage/model_spec.h"
#include "kvpage/scheduler.h"
#include "sim/cost_model.h"
#include "sim/hardware_calibration.h"
#include "sim/metrics.h"
#include "sim/trace.h"

namespace kvpage::sim {

// The longest max_model_len a run takes, set or the model's: a request's token ids (4 bytes a
// token) are built and kept while it runs, so no request may reach more than this (64 MiB of
// ids). A longer prompt is dropped as any prompt past max_model_len.
inline constexpr int64_t kMaxRequestTokens = int64_t{1} << 24;

// InvalidArgument: `max_model_len` is above kMaxRequestTokens.
absl::Status MaxModelLenError(int64_t max_model_len);

// How far a run has got; passed to SimConfig::progress.
struct SimProgress {
  int64_t finished = 0;       // requests finished or dropped
  int64_t total = 0;          // requests in the trace
  double simulated_s = 0;     // virtual clock
};

struct SimConfig {
  ModelSpec model;
  GpuSpec gpu;
  // The scheduler and, in `scheduler.kv`, the KV cache: `kv.mode` picks kvpage or vLLM
  // accounting, `kv.kv_budget_bytes` is required. `kv.hash_seed`, when unset, is set to `seed`
  // so block hashes (and thus the run) do not depend on a random root.
  SchedulerConfig scheduler;
  RooflineOptions cost;
  // The GPU calibration the default cost model uses. Unset: the bundled calibration whose GPU
  // name matches `gpu.name`, else the roofline (CreateDefaultCostModel). `kvpage sim` sets it
  // from the hardware file `--gpu` names, bundled or a user's own.
  absl::optional<GpuCalibration> calibration;
  // Used instead of the default cost model (above) when not null; must outlive Simulate.
  const CostModel* cost_model = nullptr;
  // Sampled token ids: SplitMix64 of (seed, request index, output position) mod vocab.
  uint64_t seed = 0;
  // >= 2 and at most model.vocab_size (when known); kvpage sim sets min(100,000, the model's).
  int32_t vocab_size = kDefaultTraceVocabSize;
  // Keep every output token's time (ITL statistics). Off saves 8 bytes per output token.
  bool record_token_times = true;
  // Keep one StepRecord per step (the per-step CSV). Peaks, means and counters are computed
  // either way.
  bool record_steps = true;
  // Check the scheduler's and the manager's invariants after every step (slow; tests).
  bool check_invariants = false;
  // The host tier's link, in GB/s (10^9 bytes per second), when scheduler.kv.host_cache has a
  // budget. The default is a conservative round figure, not a measurement: half the 64 GB/s
  // per direction of a PCIe Gen5 x16 link (an H100's), since KV blocks move as many small
  // per-layer pieces and saves and loads share the one modelled link.
  double pcie_gbps = kDefaultPcieGbps;
  static constexpr double kDefaultPcieGbps = 32;
  // Called about every `progress_interval_steps` steps and once at the end, from the
  // simulating thread. May be empty.
  std::function<void(const SimProgress&)> progress;
  int64_t progress_interval_steps = 1024;

  // InvalidArgument naming the field (scheduler and KV fields are checked by Scheduler::Create,
  // but for scheduler.max_model_len above kMaxRequestTokens).
  absl::Status Validate() const;
};

// One KV pool's occupancy over the run: bytes in blocks held by requests over the KV budget.
// Cached free blocks (prefix cache) are not counted as used.
struct PoolUsageStats {
  std::string name;          // "total", or "<group kinds>" per pool (e.g. "full_attention")
  double peak = 0;           // max over steps, sampled after each step's allocation
  double mean = 0;           // time-weighted mean over steps (idle gaps excluded)
};

struct SimPrefixCache {
  int64_t queried_tokens = 0;  // prompt tokens of every simulated request
  int64_t hit_tokens = 0;      // first-admission hits (see below)
  double hit_rate = 0;         // hit_tokens / queried_tokens, 0 when nothing was queried
};

// The host tier over a run (SimResult::host_tier). Hits count first admissions, as
// SimPrefixCache does (the scheduler's SchedulerStats::prefix_hit_tokens and host_hit_tokens).
struct SimHostTier {
  int64_t budget_bytes = 0;
  HostTierPolicy policy = HostTierPolicy::kWriteThrough;
  double pcie_gbps = 0;
  int64_t device_hit_tokens = 0;  // prefix hits the device cache served
  int64_t host_hit_tokens = 0;    // prefix hits loaded back from the host tier first
  HostCacheStats stats;           // the manager's counters at the end of the run
  double bytes_per_s = 0;         // (saved + loaded bytes) / simulated seconds
  double link_busy_s = 0;         // time the link spent copying
  double save_wait_s = 0;         // time forward passes waited for write-back saves
};

// "write-through" or "write-back".
absl::string_view HostTierPolicyName(HostTierPolicy policy);

struct SimResult {
  MetricsSummary summary;
  std::vector<RequestRecord> requests;  // finished requests, in trace order
  std::vector<StepRecord> steps;        // when SimConfig::record_steps
  std::vector<std::string> pool_names;  // one per StepRecord::kv_usage entry
  // "total" first, then one entry per pool in pool order.
  std::vector<PoolUsageStats> kv_usage;
  // Bytes the pools have mapped (taken from the budget in chunks, kvpage mode; the whole
  // budget in vLLM mode) over the budget. Mapped but unused memory holds clean or cached blocks
  // that only the pool owning the chunk can use.
  PoolUsageStats kv_mapped;
  // Per request, the tokens served by the prefix cache the first time it was scheduled
  // (num_computed_tokens of its first, non-resumed step). The manager's own counters are kept
  // apart below: they count every lookup, including repeated ones of requests whose admission
  // failed and re-admissions after preemption.
  SimPrefixCache prefix_cache;
  int64_t manager_queried_tokens = 0;
  int64_t manager_hit_tokens = 0;
  // Set when the run had a host tier (scheduler.kv.host_cache.budget_bytes > 0).
  absl::optional<SimHostTier> host_tier;
  int32_t max_concurrency = 0;   // most running requests in any step
  int64_t preemptions = 0;
  int64_t num_steps = 0;         // steps that scheduled at least one token
  int64_t dropped_requests = 0;  // prompts too long for max_model_len
  int64_t truncated_requests = 0;  // finished at max_model_len before output_len
  int64_t kv_budget_bytes = 0;
  int32_t block_size = 0;        // the cache's block size (vLLM mode may enlarge it)
  int64_t max_model_len = 0;     // in effect: lowered when the KV budget cannot hold the model's
  double simulated_seconds = 0;  // virtual clock at the end of the run
  double wall_seconds = 0;       // host time Simulate took (the only non-deterministic field)
};

// Replays `trace` (arrival_s non-decreasing, as the readers return it).
// Errors: InvalidArgument for a bad config (a max_model_len in effect above kMaxRequestTokens
// included) or an unsorted trace; the scheduler's and cost
// model's creation errors; ResourceExhausted for a request that can never run (see above);
// Internal if the scheduler rejects a step the loop built (a bug).
absl::StatusOr<SimResult> Simulate(const std::vector<TraceRequest>& trace,
                                   const SimConfig& config);

// Everything the CLI's --output-json writes for one run: SummaryToJson's fields, then
// "preemptions", "prefix_cache" {queried_tokens, hit_tokens, hit_rate}, with a host tier
// "host_tier" (HostTierToJson), "kv_usage"
// {pool: {peak, mean}}, "kv_mapped" {peak, mean}, "max_concurrency", "num_steps", "dropped_requests",
// "truncated_requests", "kv_budget_bytes", "block_size", "max_model_len", "simulated_seconds",
// "wall_seconds". Pretty-printed with 2 spaces; keys in that fixed order.
std::string SimResultToJson(const SimResult& result);

// {"budget_bytes", "policy", "pcie_gbps", "device_hit_tokens", "host_hit_tokens", "saves",
// "loads", "saved_bytes", "loaded_bytes", "evictions", "failed_transfers", "bytes_per_s",
// "link_busy_s", "save_wait_s"}: one JSON object, keys in that order, for SimResultToJson and
// the fleet's JSON.
std::string HostTierToJson(const SimHostTier& host);

}  // namespace kvpage::sim

#endif  // KVPAGE_SIM_SIMULATOR_H_
