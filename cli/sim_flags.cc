// `kvpage sim`'s flags, and the configuration, trace and fleet they describe.
#include "cli/sim_flags.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cli/cli_util.h"
#include "kvpage/catalog.h"
#include "kvpage/planner.h"
#include "sim/hardware_calibration.h"

namespace kvpage::cli {
namespace {

// --model, --gpu, the trace and the KV budget.
void RegisterHardwareFlags(FlagSet& fs, SimFlags& f) {
  fs.String("model", &f.model,
            "Bundled model name or path to a config.json (required).\nBundled: " +
                absl::StrJoin(BundledModelNames(), ", ") + ".");
  fs.String("gpu", &f.gpu,
            "GPU for the cost model and the KV budget (required): " +
                absl::StrJoin(BundledGpuNames(), ", ") + " (aliases " +
                absl::StrJoin(BundledGpuAliases(), ", ") + ") or a\n"
                "hardware JSON file; its \"calibration\" object, when present, sets the step times.");
  fs.String("trace", &f.trace,
            "Trace file. A bare file name not found in the working directory is looked up in\n"
            "the bundled traces, share/kvpage/traces/ next to bin/ (e.g.\n"
            "mooncake_conversation_trace.jsonl; $KVPAGE_DATA_DIR overrides share/kvpage).");
  fs.String("trace-format", &f.trace_format,
            "mooncake, azure, lengths, or auto (default: .jsonl is mooncake; a CSV is azure\n"
            "when its header has ContextTokens, lengths when it has num_prefill_tokens).");
  fs.Double("kv-budget-gib", &f.kv_budget_gib,
            "KV budget in GiB (2^30 bytes, all GPUs together), up to 1e9; overrides\n"
            "--gpu-memory-utilization.");
  fs.Double("gpu-memory-utilization", &f.gpu_memory_utilization,
            "KV budget of each GPU = GPU memory x this - weights / tp (default 0.9;\n"
            "activations not modelled).");
}

// The scheduler's limits and switches, named as vLLM's engine arguments.
void RegisterSchedulerFlags(FlagSet& fs, SimFlags& f) {
  fs.Int("block-size", &f.block_size, "Tokens per KV block (default 16).");
  fs.Int("max-num-batched-tokens", &f.max_num_batched_tokens,
         "Token budget of one step (default 8192).");
  fs.Int("max-num-seqs", &f.max_num_seqs, "Running requests at most (default 256).");
  fs.Int("max-model-len", &f.max_model_len,
         "Longest request in tokens (default: the model's max_position_embeddings). Prompts\n"
         "that leave no room for one output token are dropped and counted; requests reaching\n"
         "it while generating stop early and are counted as truncated.");
  fs.Bool("enable-chunked-prefill", &f.enable_chunked_prefill, "Chunked prefill (default on).");
  fs.Bool("no-enable-chunked-prefill", &f.no_enable_chunked_prefill,
          "A prompt runs in one step (it must fit --max-num-batched-tokens).");
  fs.Int("long-prefill-token-threshold", &f.long_prefill_token_threshold,
         "At most this many prompt tokens per request and step (default 0: no cap).");
  fs.String("scheduling-policy", &f.scheduling_policy,
            "fcfs (default) or priority (trace requests all have priority 0).");
  fs.Bool("enable-prefix-caching", &f.enable_prefix_caching, "Prefix caching (default on).");
  fs.Bool("no-enable-prefix-caching", &f.no_enable_prefix_caching, "Prefix caching off.");
}

// How the KV cache is counted: dtype, tensor parallelism, the allocator followed.
void RegisterAccountingFlags(FlagSet& fs, SimFlags& f) {
  fs.String("kv-cache-dtype", &f.kv_cache_dtype,
            "auto (default: the model dtype), f32, f16, bf16, fp8 or q8_0.");
  fs.Int("tp", &f.tp,
         "Tensor-parallel degree, 1 to 1024: divides the cost model's FLOPs and bytes; each\n"
         "GPU holds num_kv_heads / tp KV heads (1 when fewer than tp, replicated as vLLM\n"
         "does; an MLA latent whole) and weights / tp (default 1; docs/capacity_planning.md).");
  fs.String("allocator", &f.allocator,
            "KV accounting: kvpage (default) or vllm (what the vLLM release --vllm-version\n"
            "would allocate).");
  fs.String("vllm-version", &f.vllm_version,
            "vllm accounting: the vLLM release to follow, 0.29 or 0.33 (default " +
                std::string(VllmVersionName(kCurrentVllmVersion)) + ").");
  fs.Int("kv-chunk-mib", &f.kv_chunk_mib,
         "kvpage accounting: MiB a pool takes from the budget at a time (default 2). Larger\n"
         "chunks make huge budgets cheaper to simulate; smaller ones strand less memory in\n"
         "partly used chunks of hybrid models.");
  fs.Bool("compare-allocators", &f.compare_allocators,
          "Run kvpage and vllm accounting on the same trace and memory, side by side.");
}

// Which requests run, and how they arrive: the trace's first N or a synthetic set.
void RegisterWorkloadFlags(FlagSet& fs, SimFlags& f) {
  fs.Int("max-requests", &f.max_requests, "Replay only the first N requests (default all).");
  fs.Double("request-rate", &f.request_rate,
            "Requests per second for lengths traces and --synthetic (required there).");
  fs.String("arrival", &f.arrival,
            "Arrival process for lengths traces and --synthetic: poisson (default), fixed or\n"
            "burst (everything at time 0; no --request-rate needed).");
  fs.Int("synthetic", &f.synthetic,
         "Instead of --trace, generate N requests with --prompt-len and --output-len tokens.");
  fs.Int("prompt-len", &f.prompt_len, "--synthetic: prompt tokens per request (default 1024).");
  fs.Int("output-len", &f.output_len, "--synthetic: output tokens per request (default 128).");
  fs.Double("shared-prefix-fraction", &f.shared_prefix_fraction,
            "--synthetic: share of each prompt taken from its prefix group (default 0).");
  fs.Int("num-prefix-groups", &f.num_prefix_groups,
         "--synthetic: number of shared-prefix groups (default 1).");
}

// Where the results go, the seed, the progress bar.
void RegisterOutputFlags(FlagSet& fs, SimFlags& f) {
  fs.String("output-json", &f.output_json,
            "Write the results as JSON to this file ('-' for stdout instead of the table).");
  fs.String("output-dir", &f.output_dir,
            "Write requests.csv, steps.csv and sim.png (needs /usr/bin/python3 with\n"
            "matplotlib) to this directory; with --compare-allocators, one subdirectory per\n"
            "allocator.");
  fs.Int("seed", &f.seed, "Seed of prompt tokens, sampled tokens and arrivals (default 0).");
  fs.Bool("no-progress", &f.no_progress, "No progress bar on stderr.");
}

// --replicas behind a --router.
void RegisterFleetFlags(FlagSet& fs, SimFlags& f) {
  fs.Int("replicas", &f.replicas,
         "Data-parallel replicas behind a router, 1 to 4096, each a full copy of the GPU\n"
         "(--tp GPUs) with its own KV budget; they share one virtual clock (default 1).");
  fs.String("router", &f.router,
            "With --replicas: round-robin (default), least-loaded (fewest outstanding\n"
            "tokens), prefix-aware (longest cached prefix plus load, from the replicas' caches)\n"
            "or kv-events (the same, from the KV events the replicas publish).");
  fs.Double("overlap-weight", &f.overlap_weight,
            "prefix-aware and kv-events: weight of prefill blocks against load blocks in the\n"
            "router cost, as Dynamo's --kv-overlap-score-weight (default 1; 0 = load only).");
}

// The host-memory tier of the prefix cache.
void RegisterHostTierFlags(FlagSet& fs, SimFlags& f) {
  fs.Double("host-cache-gib", &f.host_cache_gib,
            "Host-memory tier of the prefix cache in GiB per replica, up to 1e9 (default 0:\n"
            "none). Blocks the device evicts are loaded back over PCIe instead of recomputed\n"
            "(kvpage accounting only; docs/simulator.md, \"Host tier\").");
  fs.String("host-policy", &f.host_policy,
            "--host-cache-gib: write-through (default: every full block is saved once, beside\n"
            "the forward pass) or write-back (blocks are saved when evicted; the step waits).");
  fs.Double("pcie-gbps", &f.pcie_gbps,
            "--host-cache-gib: GB/s (1e9 bytes) of each replica's link to its host tier, one\n"
            "queue for both directions (default 32, a conservative round figure for PCIe Gen5).");
}

// The largest --tp taken.
constexpr int64_t kMaxTp = 1024;

// InvalidArgument naming --flag unless 1 <= v <= max.
absl::Status Positive(const char* flag, int64_t v, int64_t max = int64_t{1} << 30) {
  if (v < 1 || v > max) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, " must be in [1, ", max,
                                                   "], got ", v));
  }
  return absl::OkStatus();
}

std::string ResolveTrace(const std::string& path) {
  if (std::filesystem::exists(path)) return path;
  const std::string bundled = DataDir() + "/traces/" + path;
  if (path.find('/') == std::string::npos && std::filesystem::exists(bundled)) return bundled;
  return path;
}

absl::StatusOr<sim::TraceFormat> DetectFormat(const std::string& path) {
  if (absl::EndsWithIgnoreCase(path, ".jsonl") || absl::EndsWithIgnoreCase(path, ".json")) {
    return sim::TraceFormat::kMooncake;
  }
  std::ifstream in(path);
  std::string header;
  std::getline(in, header);
  if (absl::StrContains(header, "ContextTokens")) return sim::TraceFormat::kAzure;
  if (absl::StrContains(header, "num_prefill_tokens")) return sim::TraceFormat::kLengths;
  return absl::InvalidArgumentError(absl::StrCat(
      "cannot tell the format of '", path, "'; pass --trace-format mooncake|azure|lengths"));
}

absl::StatusOr<sim::ArrivalOptions> Arrivals(const SimFlags& f, const FlagSet& fs) {
  sim::ArrivalOptions a;
  if (f.arrival == "poisson") {
    a.kind = sim::ArrivalKind::kPoisson;
  } else if (f.arrival == "fixed") {
    a.kind = sim::ArrivalKind::kFixed;
  } else if (f.arrival == "burst") {
    a.kind = sim::ArrivalKind::kBurst;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--arrival must be poisson, fixed or burst, got '", f.arrival, "'"));
  }
  if (a.kind != sim::ArrivalKind::kBurst) {
    if (!fs.WasSet("request-rate")) {
      return absl::InvalidArgumentError("--request-rate is required for this trace");
    }
    if (!(f.request_rate > 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--request-rate must be positive, got ", f.request_rate));
    }
    a.rate_per_s = f.request_rate;
  }
  return a;
}

// --synthetic N: N requests (at most --max-requests) of --prompt-len and --output-len tokens.
absl::StatusOr<std::vector<sim::TraceRequest>> SyntheticTrace(const SimFlags& f,
                                                              const FlagSet& fs,
                                                              int32_t vocab_size) {
  sim::SyntheticTraceOptions o;
  if (absl::Status s = Positive("synthetic", f.synthetic, sim::kMaxSyntheticRequests); !s.ok()) {
    return s;
  }
  if (absl::Status s = Positive("prompt-len", f.prompt_len); !s.ok()) return s;
  if (absl::Status s = Positive("output-len", f.output_len); !s.ok()) return s;
  if (absl::Status s = Positive("num-prefix-groups", f.num_prefix_groups); !s.ok()) return s;
  if (!(f.shared_prefix_fraction >= 0 && f.shared_prefix_fraction <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--shared-prefix-fraction must be in [0, 1], got ", f.shared_prefix_fraction));
  }
  o.num_requests = f.max_requests > 0 ? std::min(f.synthetic, f.max_requests) : f.synthetic;
  auto arrival = Arrivals(f, fs);
  if (!arrival.ok()) return arrival.status();
  o.arrival = *arrival;
  o.prompt_len = {sim::LengthDistribution::Kind::kFixed, static_cast<double>(f.prompt_len), 0,
                  1, 1 << 30};
  o.output_len = {sim::LengthDistribution::Kind::kFixed, static_cast<double>(f.output_len), 0,
                  1, 1 << 30};
  o.shared_prefix_fraction = f.shared_prefix_fraction;
  o.num_prefix_groups = static_cast<int32_t>(f.num_prefix_groups);
  o.seed = static_cast<uint64_t>(f.seed);
  o.vocab_size = vocab_size;
  return sim::GenerateSyntheticTrace(o);
}

// --trace FILE in --trace-format; arrivals from the flags for a lengths trace only.
absl::StatusOr<std::vector<sim::TraceRequest>> FileTrace(const SimFlags& f, const FlagSet& fs,
                                                         int32_t vocab_size) {
  const std::string path = ResolveTrace(f.trace);
  absl::StatusOr<sim::TraceFormat> format = f.trace_format == "auto"
                                                ? DetectFormat(path)
                                                : sim::ParseTraceFormat(f.trace_format);
  if (!format.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--trace-format: ", format.status().message()));
  }
  sim::TraceOptions o;
  o.seed = static_cast<uint64_t>(f.seed);
  o.vocab_size = vocab_size;
  o.max_requests = f.max_requests;
  if (*format == sim::TraceFormat::kLengths) {
    auto arrival = Arrivals(f, fs);
    if (!arrival.ok()) return arrival.status();
    o.arrival = *arrival;
  } else if (fs.WasSet("request-rate") || fs.WasSet("arrival")) {
    return absl::InvalidArgumentError(
        "--request-rate and --arrival apply to lengths traces and --synthetic only; this trace "
        "has its own timestamps");
  }
  return sim::ReadTrace(*format, path, o);
}

// --host-cache-gib, --host-policy and --pcie-gbps into c.scheduler.kv.host_cache and
// c.pcie_gbps; InvalidArgument naming a bad value.
absl::Status SetHostTier(const SimFlags& f, const FlagSet& fs, sim::SimConfig& c) {
  if (!fs.WasSet("host-cache-gib")) {
    if (fs.WasSet("host-policy") || fs.WasSet("pcie-gbps")) {
      return absl::InvalidArgumentError("--host-policy and --pcie-gbps need --host-cache-gib");
    }
    return absl::OkStatus();
  }
  if (!(f.host_cache_gib >= 0) || f.host_cache_gib > 1e9) {
    return absl::InvalidArgumentError(
        absl::StrCat("--host-cache-gib must be in [0, 1e9], got ", f.host_cache_gib));
  }
  if (f.host_policy == "write-through") {
    c.scheduler.kv.host_cache.policy = HostTierPolicy::kWriteThrough;
  } else if (f.host_policy == "write-back") {
    c.scheduler.kv.host_cache.policy = HostTierPolicy::kWriteBack;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "--host-policy must be write-through or write-back, got '", f.host_policy, "'"));
  }
  if (!std::isfinite(f.pcie_gbps) || f.pcie_gbps <= 0 || f.pcie_gbps > 1e9) {
    return absl::InvalidArgumentError(
        absl::StrCat("--pcie-gbps must be in (0, 1e9], got ", f.pcie_gbps));
  }
  c.scheduler.kv.host_cache.budget_bytes = static_cast<int64_t>(f.host_cache_gib * 1073741824.0);
  c.pcie_gbps = f.pcie_gbps;
  return absl::OkStatus();
}

// --model and --gpu with its calibration; token ids kept inside the model's vocabulary.
absl::Status SetModelAndGpu(const SimFlags& f, sim::SimConfig& c) {
  if (f.model.empty()) return absl::InvalidArgumentError("--model is required");
  if (f.gpu.empty()) return absl::InvalidArgumentError("--gpu is required");
  auto model = LoadModel(f.model);
  if (!model.ok()) return model.status();
  c.model = *std::move(model);
  // Token ids (trace prompts and sampled ones) stay inside the model's vocabulary.
  if (c.model.vocab_size >= 2 && c.model.vocab_size < c.vocab_size) {
    c.vocab_size = static_cast<int32_t>(c.model.vocab_size);
  }
  auto gpu = LoadGpu(f.gpu);
  if (!gpu.ok()) return gpu.status();
  c.gpu = *std::move(gpu);
  // The calibration of the file --gpu names (bundled or the user's); none: the bundled one of
  // the same GPU name, else the roofline.
  auto calibration = sim::LoadGpuCalibration(f.gpu);
  if (calibration.ok()) {
    c.calibration = *std::move(calibration);
  } else if (!absl::IsNotFound(calibration.status())) {
    return calibration.status();
  }
  return absl::OkStatus();
}

// The ranges of the scheduler's limits and --tp, and the on/off pairs that exclude each other.
absl::Status CheckSchedulerFlags(const SimFlags& f) {
  for (auto [flag, v] : {std::pair{"block-size", f.block_size},
                         {"max-num-batched-tokens", f.max_num_batched_tokens},
                         {"max-num-seqs", f.max_num_seqs}}) {
    if (absl::Status s = Positive(flag, v); !s.ok()) return s;
  }
  // GPU memory x tp must stay far inside int64 (a 141 GB GPU x 1024 is 1.4e14 bytes).
  if (absl::Status s = Positive("tp", f.tp, kMaxTp); !s.ok()) return s;
  if (f.max_model_len < 0 || f.max_model_len > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-model-len must be in [1, 2^30], got ", f.max_model_len));
  }
  if (f.long_prefill_token_threshold < 0 || f.long_prefill_token_threshold > (1 << 30)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--long-prefill-token-threshold must be in [0, 2^30], got ", f.long_prefill_token_threshold));
  }
  if (f.enable_chunked_prefill && f.no_enable_chunked_prefill) {
    return absl::InvalidArgumentError(
        "--enable-chunked-prefill and --no-enable-chunked-prefill exclude each other");
  }
  if (f.enable_prefix_caching && f.no_enable_prefix_caching) {
    return absl::InvalidArgumentError(
        "--enable-prefix-caching and --no-enable-prefix-caching exclude each other");
  }
  return absl::OkStatus();
}

// The scheduler's limits and policy (after CheckSchedulerFlags).
absl::Status SetScheduler(const SimFlags& f, SchedulerConfig& s) {
  s.max_num_batched_tokens = static_cast<int32_t>(f.max_num_batched_tokens);
  s.max_num_seqs = static_cast<int32_t>(f.max_num_seqs);
  s.max_model_len = f.max_model_len;
  s.enable_chunked_prefill = !f.no_enable_chunked_prefill;
  s.long_prefill_token_threshold = static_cast<int32_t>(f.long_prefill_token_threshold);
  if (f.scheduling_policy == "fcfs") {
    s.policy = SchedulingPolicy::kFcfs;
  } else if (f.scheduling_policy == "priority") {
    s.policy = SchedulingPolicy::kPriority;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "--scheduling-policy must be fcfs or priority, got '", f.scheduling_policy, "'"));
  }
  s.kv.block_size = static_cast<int32_t>(f.block_size);
  s.kv.enable_prefix_caching = !f.no_enable_prefix_caching;
  return absl::OkStatus();
}

// The KV cache's accounting: the vLLM release followed, the dtype, the chunk size, tp.
absl::Status SetKvCache(const SimFlags& f, sim::SimConfig& c) {
  KvCacheConfig& kv = c.scheduler.kv;
  auto version = ParseVllmVersion(f.vllm_version);
  if (!version.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--vllm-version: ", version.status().message()));
  }
  kv.vllm_version = *version;
  if (f.kv_cache_dtype != "auto") {
    auto dtype = ParseDType(f.kv_cache_dtype);
    if (!dtype.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--kv-cache-dtype: ", dtype.status().message()));
    }
    kv.kv_cache_dtype = *dtype;
    c.cost.kv_dtype = *dtype;
  }
  if (absl::Status st = Positive("kv-chunk-mib", f.kv_chunk_mib, int64_t{1} << 24); !st.ok()) {
    return st;
  }
  kv.chunk_bytes = f.kv_chunk_mib << 20;
  c.cost.tp = static_cast<int32_t>(f.tp);
  return absl::OkStatus();
}

// --kv-budget-gib, else the GPU's memory x --gpu-memory-utilization less the weights.
absl::Status SetKvBudget(const SimFlags& f, const FlagSet& fs, sim::SimConfig& c) {
  int64_t& budget_bytes = c.scheduler.kv.kv_budget_bytes;
  if (fs.WasSet("kv-budget-gib")) {
    if (!(f.kv_budget_gib > 0) || f.kv_budget_gib > 1e9) {
      return absl::InvalidArgumentError(
          absl::StrCat("--kv-budget-gib must be in (0, 1e9], got ", f.kv_budget_gib));
    }
    budget_bytes = static_cast<int64_t>(f.kv_budget_gib * 1073741824.0);
    return absl::OkStatus();
  }
  if (!(f.gpu_memory_utilization > 0 && f.gpu_memory_utilization <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--gpu-memory-utilization must be in (0, 1], got ", f.gpu_memory_utilization));
  }
  // Each of the tp GPUs holds its share of the KV heads (replicated below one per GPU, the
  // MLA latent whole) and of the weights; the budget is counted in the whole model's bytes.
  auto budget = TensorParallelKvBudget(c.model, static_cast<int32_t>(f.tp), c.gpu.memory_bytes,
                                       f.gpu_memory_utilization);
  if (!budget.ok()) return budget.status();
  budget_bytes = *budget;
  return absl::OkStatus();
}

}  // namespace

void RegisterSimFlags(FlagSet& fs, SimFlags& f) {
  RegisterHardwareFlags(fs, f);
  RegisterSchedulerFlags(fs, f);
  RegisterAccountingFlags(fs, f);
  RegisterWorkloadFlags(fs, f);
  RegisterOutputFlags(fs, f);
  RegisterFleetFlags(fs, f);
  RegisterHostTierFlags(fs, f);
}

absl::Status CheckAllocatorFlags(const SimFlags& f, const FlagSet& fs) {
  if (f.allocator != "kvpage" && f.allocator != "vllm") {
    return absl::InvalidArgumentError(
        absl::StrCat("--allocator must be kvpage or vllm, got '", f.allocator, "'"));
  }
  if (f.compare_allocators && fs.WasSet("allocator")) {
    return absl::InvalidArgumentError("--compare-allocators and --allocator exclude each other");
  }
  return absl::OkStatus();
}

absl::StatusOr<sim::SimConfig> MakeSimConfig(const SimFlags& f, const FlagSet& fs) {
  sim::SimConfig c;
  if (absl::Status s = SetModelAndGpu(f, c); !s.ok()) return s;
  if (absl::Status s = CheckSchedulerFlags(f); !s.ok()) return s;
  if (absl::Status s = SetScheduler(f, c.scheduler); !s.ok()) return s;
  if (absl::Status s = SetKvCache(f, c); !s.ok()) return s;
  if (absl::Status s = SetKvBudget(f, fs, c); !s.ok()) return s;
  if (absl::Status s = SetHostTier(f, fs, c); !s.ok()) return s;
  c.seed = static_cast<uint64_t>(f.seed);
  c.record_steps = !f.output_dir.empty();
  return c;
}

absl::Status CheckVllmAccounting(const SimFlags& f, const sim::SimConfig& base) {
  const bool vllm = f.compare_allocators || f.allocator == "vllm";
  if (base.scheduler.kv.host_cache.budget_bytes > 0 && vllm) {
    return absl::InvalidArgumentError(
        "--host-cache-gib needs kvpage accounting: vllm accounting models vLLM without "
        "offloading (drop --allocator vllm / --compare-allocators)");
  }
  if (vllm) {
    if (absl::Status s = CheckVllmBlockSize(f.block_size); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--block-size: ", s.message()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<sim::TraceRequest>> LoadSimTrace(const SimFlags& f, const FlagSet& fs,
                                                            int32_t vocab_size) {
  if (fs.WasSet("max-requests")) {
    if (absl::Status s = Positive("max-requests", f.max_requests, int64_t{1} << 40); !s.ok()) {
      return s;
    }
  }
  if (f.seed < 0) return absl::InvalidArgumentError(absl::StrCat("--seed must be >= 0, got ", f.seed));
  if (fs.WasSet("synthetic") == !f.trace.empty()) {
    return absl::InvalidArgumentError("give exactly one of --trace and --synthetic");
  }
  if (fs.WasSet("synthetic")) return SyntheticTrace(f, fs, vocab_size);
  return FileTrace(f, fs, vocab_size);
}

absl::StatusOr<sim::FleetConfig> MakeFleetConfig(const SimFlags& f, const sim::SimConfig& base) {
  sim::FleetConfig c;
  if (absl::Status s = Positive("replicas", f.replicas, sim::FleetConfig::kMaxReplicas); !s.ok()) {
    return s;
  }
  auto router = sim::ParseRouterKind(f.router);
  if (!router.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--router: ", router.status().message()));
  }
  if (!std::isfinite(f.overlap_weight) || f.overlap_weight < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--overlap-weight must be finite and >= 0, got ", f.overlap_weight));
  }
  c.replica = base;
  c.replicas = static_cast<int32_t>(f.replicas);
  c.router = *router;
  c.overlap_weight = f.overlap_weight;
  return c;
}

}  // namespace kvpage::cli
