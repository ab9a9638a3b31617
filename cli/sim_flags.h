// `kvpage sim`'s flags: their registration (and so the order of --help), and what they
// become: the simulator's configuration, the trace and the fleet. Every bad value is an
// InvalidArgument whose message names the flag and the value.
#ifndef KVPAGE_CLI_SIM_FLAGS_H_
#define KVPAGE_CLI_SIM_FLAGS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cli/flags.h"
#include "kvpage/vllm_version.h"
#include "sim/fleet.h"
#include "sim/simulator.h"
#include "sim/trace.h"

namespace kvpage::cli {

// Every flag of `kvpage sim`, with its default.
struct SimFlags {
  std::string model;
  std::string gpu;
  std::string trace;
  std::string trace_format = "auto";
  double kv_budget_gib = 0;
  double gpu_memory_utilization = 0.9;
  int64_t block_size = 16;
  int64_t max_num_batched_tokens = 8192;
  int64_t max_num_seqs = 256;
  int64_t max_model_len = 0;
  bool enable_chunked_prefill = false;
  bool no_enable_chunked_prefill = false;
  int64_t long_prefill_token_threshold = 0;
  std::string scheduling_policy = "fcfs";
  bool enable_prefix_caching = false;
  bool no_enable_prefix_caching = false;
  std::string kv_cache_dtype = "auto";
  int64_t tp = 1;
  std::string allocator = "kvpage";
  std::string vllm_version{VllmVersionName(kCurrentVllmVersion)};
  int64_t kv_chunk_mib = 2;
  bool compare_allocators = false;
  int64_t max_requests = 0;
  double request_rate = 0;
  std::string arrival = "poisson";
  int64_t synthetic = 0;
  int64_t prompt_len = 1024;
  int64_t output_len = 128;
  double shared_prefix_fraction = 0;
  int64_t num_prefix_groups = 1;
  std::string output_json;
  std::string output_dir;
  int64_t seed = 0;
  bool no_progress = false;
  int64_t replicas = 1;
  std::string router = "round-robin";
  double overlap_weight = 1.0;
  double host_cache_gib = 0;
  std::string host_policy = "write-through";
  double pcie_gbps = sim::SimConfig::kDefaultPcieGbps;
};

// Registers every flag of `kvpage sim` in fs, writing to f (which must outlive fs.Parse).
void RegisterSimFlags(FlagSet& fs, SimFlags& f);

// --allocator against --compare-allocators, before the configuration is made.
absl::Status CheckAllocatorFlags(const SimFlags& f, const FlagSet& fs);

// The simulator configuration common to both allocators: the model, the GPU and its
// calibration, the scheduler's limits, the KV cache and its budget, the host tier.
absl::StatusOr<sim::SimConfig> MakeSimConfig(const SimFlags& f, const FlagSet& fs);

// What vllm accounting (--allocator vllm or --compare-allocators) cannot take: a host tier,
// a block size vLLM refuses.
absl::Status CheckVllmAccounting(const SimFlags& f, const sim::SimConfig& base);

// The requests to replay: --trace (a bare name may be a bundled trace) or --synthetic, cut to
// --max-requests; prompt tokens drawn below vocab_size.
absl::StatusOr<std::vector<sim::TraceRequest>> LoadSimTrace(const SimFlags& f, const FlagSet& fs,
                                                            int32_t vocab_size);

// --replicas, --router and --overlap-weight around `base`.
absl::StatusOr<sim::FleetConfig> MakeFleetConfig(const SimFlags& f, const sim::SimConfig& base);

}  // namespace kvpage::cli

#endif  // KVPAGE_CLI_SIM_FLAGS_H_
