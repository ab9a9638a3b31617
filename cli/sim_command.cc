// `kvpage sim`: replays a request trace through the scheduler and block manager on a virtual
// clock (sim/simulator.h) and reports `vllm bench serve`-style metrics.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "cli/commands.h"
#include "cli/cli_util.h"
#include "cli/flags.h"
#include "kvpage/catalog.h"
#include "kvpage/planner.h"
#include "sim/cost_model_summary.h"
#include "sim/fleet.h"
#include "sim/hardware_calibration.h"
#include "sim/simulator.h"
#include "sim/trace.h"

namespace kvpage::cli {
namespace {

constexpr const char* kSimUsage =
    R"(Usage: kvpage sim --model M --gpu GPU (--trace FILE | --synthetic N) [flags]

Replays a request trace through kvpage's scheduler and block manager on a virtual clock that
a GPU cost model advances (the calibration in the --gpu file, else a roofline), and reports the metrics `vllm bench serve` reports (TTFT,
TPOT, ITL, end-to-end latency, throughput) plus preemptions, prefix-cache hits, KV usage and
the most requests that ran at once. The same command gives the same JSON, byte for byte,
except `wall_seconds`. docs/simulator.md describes the loop, the cost model and every output.
With --replicas N, N copies of the server sit behind a --router on one virtual clock and the
report covers the fleet, then each replica (docs/simulator.md, "Fleet").)";

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

void RegisterSimFlags(FlagSet& fs, SimFlags& f) {
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
  fs.String("output-json", &f.output_json,
            "Write the results as JSON to this file ('-' for stdout instead of the table).");
  fs.String("output-dir", &f.output_dir,
            "Write requests.csv, steps.csv and sim.png (needs /usr/bin/python3 with\n"
            "matplotlib) to this directory; with --compare-allocators, one subdirectory per\n"
            "allocator.");
  fs.Int("seed", &f.seed, "Seed of prompt tokens, sampled tokens and arrivals (default 0).");
  fs.Bool("no-progress", &f.no_progress, "No progress bar on stderr.");
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

int Fail(const absl::Status& s) { return FailUsage("sim", s); }

// The largest --tp taken.
constexpr int64_t kMaxTp = 1024;

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

absl::StatusOr<std::vector<sim::TraceRequest>> LoadTrace(const SimFlags& f, const FlagSet& fs,
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
  if (fs.WasSet("synthetic")) {
    sim::SyntheticTraceOptions o;
    if (absl::Status s = Positive("synthetic", f.synthetic, int64_t{1} << 24); !s.ok()) return s;
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

// The simulator configuration common to both allocators.
absl::StatusOr<sim::SimConfig> MakeConfig(const SimFlags& f, const FlagSet& fs) {
  sim::SimConfig c;
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
  SchedulerConfig& s = c.scheduler;
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
  auto version = ParseVllmVersion(f.vllm_version);
  if (!version.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--vllm-version: ", version.status().message()));
  }
  s.kv.vllm_version = *version;
  if (f.kv_cache_dtype != "auto") {
    auto dtype = ParseDType(f.kv_cache_dtype);
    if (!dtype.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--kv-cache-dtype: ", dtype.status().message()));
    }
    s.kv.kv_cache_dtype = *dtype;
    c.cost.kv_dtype = *dtype;
  }
  if (absl::Status st = Positive("kv-chunk-mib", f.kv_chunk_mib, int64_t{1} << 24); !st.ok()) {
    return st;
  }
  s.kv.chunk_bytes = f.kv_chunk_mib << 20;
  c.cost.tp = static_cast<int32_t>(f.tp);
  if (fs.WasSet("kv-budget-gib")) {
    if (!(f.kv_budget_gib > 0) || f.kv_budget_gib > 1e9) {
      return absl::InvalidArgumentError(
          absl::StrCat("--kv-budget-gib must be in (0, 1e9], got ", f.kv_budget_gib));
    }
    s.kv.kv_budget_bytes = static_cast<int64_t>(f.kv_budget_gib * 1073741824.0);
  } else {
    if (!(f.gpu_memory_utilization > 0 && f.gpu_memory_utilization <= 1)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--gpu-memory-utilization must be in (0, 1], got ", f.gpu_memory_utilization));
    }
    // Each of the tp GPUs holds its share of the KV heads (replicated below one per GPU, the
    // MLA latent whole) and of the weights; the budget is counted in the whole model's bytes.
    auto budget = TensorParallelKvBudget(c.model, static_cast<int32_t>(f.tp), c.gpu.memory_bytes,
                                         f.gpu_memory_utilization);
    if (!budget.ok()) return budget.status();
    s.kv.kv_budget_bytes = *budget;
  }
  if (absl::Status st = SetHostTier(f, fs, c); !st.ok()) return st;
  c.seed = static_cast<uint64_t>(f.seed);
  c.record_steps = !f.output_dir.empty();
  return c;
}

// A progress bar on stderr, drawn only when stderr is a terminal and the run has taken more
// than a second.
class ProgressBar {
 public:
  explicit ProgressBar(std::string label)
      : label_(std::move(label)), tty_(isatty(STDERR_FILENO) != 0),
        start_(std::chrono::steady_clock::now()) {}
  ~ProgressBar() { Clear(); }
  // Erases the bar so that later messages start on a clean line.
  void Clear() {
    if (drawn_) std::cerr << "\r\033[K" << std::flush;
    drawn_ = false;
  }
  void Update(const sim::SimProgress& p) {
    if (!tty_ || p.total == 0) return;
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    if (elapsed < 1.0) return;
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(kWidth * p.finished / p.total);
    std::cerr << absl::StrFormat("\r%s [%s%s] %d/%d requests, %.0f s simulated, %.1f s",
                                 label_, std::string(filled, '#'),
                                 std::string(kWidth - filled, '.'), p.finished, p.total,
                                 p.simulated_s, elapsed)
              << std::flush;
    drawn_ = true;
  }

 private:
  std::string label_;
  bool tty_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point start_;
};

std::string Fmt(double v, int decimals = 2) { return absl::StrFormat("%.*f", decimals, v); }

// The host tier's rows of the summary tables (one run: the host tier excludes vllm accounting,
// so --compare-allocators never has one).
void HostTierRows(const sim::SimHostTier& h,
                  std::vector<std::pair<std::string, std::vector<std::string>>>& rows) {
  const auto add = [&rows](std::string name, std::string cell) {
    rows.emplace_back(std::move(name), std::vector<std::string>{std::move(cell)});
  };
  add("  from device / host tier", absl::StrCat(h.device_hit_tokens, " / ", h.host_hit_tokens));
  add("Host tier (GiB, policy, link GB/s)",
      absl::StrCat(Fmt(h.budget_bytes / 1073741824.0), ", ", sim::HostTierPolicyName(h.policy),
                   ", ", Fmt(h.pcie_gbps, 1)));
  add("Host saves / loads / evictions (blocks)",
      absl::StrCat(h.stats.saves, " / ", h.stats.loads, " / ", h.stats.evictions));
  add("Host bytes saved / loaded (GB)", absl::StrCat(Fmt(h.stats.saved_bytes / 1e9), " / ",
                                                     Fmt(h.stats.loaded_bytes / 1e9)));
  add("Host bytes moved per second (GB/s)", Fmt(h.bytes_per_s / 1e9, 3));
  add("Link busy / steps waiting for saves (s)",
      absl::StrCat(Fmt(h.link_busy_s), " / ", Fmt(h.save_wait_s)));
}

// One column per run: the numbers a reader compares first.
std::string SummaryTable(const std::vector<std::pair<std::string, const sim::SimResult*>>& runs) {
  std::vector<std::pair<std::string, std::vector<std::string>>> rows;
  auto row = [&](std::string name, auto cell) {
    std::vector<std::string> cells;
    for (const auto& run : runs) cells.push_back(cell(*run.second));
    rows.emplace_back(std::move(name), std::move(cells));
  };
  using R = const sim::SimResult&;
  row("Completed requests", [](R r) { return absl::StrCat(r.summary.completed); });
  row("Dropped (> max_model_len)", [](R r) { return absl::StrCat(r.dropped_requests); });
  row("Truncated at max_model_len", [](R r) { return absl::StrCat(r.truncated_requests); });
  row("Duration (s)", [](R r) { return Fmt(r.summary.duration_s); });
  row("Request throughput (req/s)", [](R r) { return Fmt(r.summary.request_throughput, 3); });
  row("Output throughput (tok/s)", [](R r) { return Fmt(r.summary.output_throughput, 1); });
  row("Total token throughput (tok/s)",
      [](R r) { return Fmt(r.summary.total_token_throughput, 1); });
  const std::pair<const char*, sim::LatencyStats sim::MetricsSummary::*> latencies[] = {
      {"TTFT", &sim::MetricsSummary::ttft_ms}, {"TPOT", &sim::MetricsSummary::tpot_ms},
      {"ITL", &sim::MetricsSummary::itl_ms}, {"E2E latency", &sim::MetricsSummary::e2el_ms}};
  for (const auto& [name, member] : latencies) {
    row(absl::StrCat(name, " mean / p50 / p99 (ms)"), [member = member](R r) {
      const sim::LatencyStats& s = r.summary.*member;
      return absl::StrCat(Fmt(s.mean), " / ", Fmt(s.median), " / ", Fmt(s.p99));
    });
  }
  row("Preemptions", [](R r) { return absl::StrCat(r.preemptions); });
  row("Prefix-cache hit tokens", [](R r) {
    return absl::StrFormat("%d / %d (%.2f%%)", r.prefix_cache.hit_tokens,
                           r.prefix_cache.queried_tokens, 100 * r.prefix_cache.hit_rate);
  });
  if (runs[0].second->host_tier.has_value()) HostTierRows(*runs[0].second->host_tier, rows);
  row("Max concurrency (running)", [](R r) { return absl::StrCat(r.max_concurrency); });
  row("KV budget (GiB)", [](R r) { return Fmt(r.kv_budget_bytes / 1073741824.0); });
  row("KV usage peak / mean (%)", [](R r) {
    return absl::StrCat(Fmt(100 * r.kv_usage[0].peak, 1), " / ", Fmt(100 * r.kv_usage[0].mean, 1));
  });
  row("KV mapped peak / mean (%)", [](R r) {
    return absl::StrCat(Fmt(100 * r.kv_mapped.peak, 1), " / ", Fmt(100 * r.kv_mapped.mean, 1));
  });
  row("Steps", [](R r) { return absl::StrCat(r.num_steps); });
  row("Simulated time (s)", [](R r) { return Fmt(r.simulated_seconds); });
  row("Wall time (s)", [](R r) { return Fmt(r.wall_seconds); });

  size_t name_w = 0;
  std::vector<size_t> col_w;
  for (const auto& run : runs) col_w.push_back(run.first.size());
  for (const auto& [name, cells] : rows) {
    name_w = std::max(name_w, name.size());
    for (size_t i = 0; i < cells.size(); ++i) col_w[i] = std::max(col_w[i], cells[i].size());
  }
  std::string out = absl::StrFormat("%-*s", name_w, "");
  for (size_t i = 0; i < runs.size(); ++i) absl::StrAppendFormat(&out, "  %*s", col_w[i], runs[i].first);
  out += "\n";
  for (const auto& [name, cells] : rows) {
    absl::StrAppendFormat(&out, "%-*s", name_w, name);
    for (size_t i = 0; i < cells.size(); ++i) absl::StrAppendFormat(&out, "  %*s", col_w[i], cells[i]);
    out += "\n";
  }
  return out;
}

std::string PlotScript() {
  if (const char* env = std::getenv("KVPAGE_SIM_PLOT_SCRIPT")) return env;
  return DataDir() + "/scripts/plot_sim.py";
}

// requests.csv, steps.csv and sim.png in `dir`. 1 on failure (message printed).
int WriteOutputDir(const sim::SimResult& r, const std::string& dir, const std::string& title) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    std::cerr << "kvpage sim: cannot create " << dir << ": " << ec.message() << "\n";
    return 1;
  }
  std::ostringstream requests, steps;
  sim::WriteRequestsCsv(r.requests, requests);
  sim::WriteStepsCsv(r.steps, r.pool_names, steps);
  for (const auto& [name, text] : {std::pair{"/requests.csv", requests.str()},
                                   {"/steps.csv", steps.str()}}) {
    if (absl::Status s = sim::WriteTextFile(dir + name, text); !s.ok()) {
      std::cerr << "kvpage sim: " << s.message() << "\n";
      return 1;
    }
  }
  if (!RunPlotScript("sim", PlotScript(),
                     absl::StrCat("--dir ", ShellQuote(dir), " --title ", ShellQuote(title)))) {
    return 1;
  }
  std::cerr << "kvpage sim: wrote " << dir << "/{requests.csv,steps.csv,sim.png}\n";
  return 0;
}

// One run's JSON, or {"kvpage": {...}, "vllm": {...}} for several.
std::string ResultsJson(const std::vector<std::string>& allocators,
                        const std::vector<sim::SimResult>& results,
                        const sim::CostModelSummary& cost) {
  if (results.size() == 1) return sim::WithCostModel(sim::SimResultToJson(results[0]), cost);
  std::string json = "{\n";
  for (size_t i = 0; i < results.size(); ++i) {
    const std::string one = sim::WithCostModel(sim::SimResultToJson(results[i]), cost);
    // Indent the nested object by two spaces.
    std::string nested;
    for (size_t p = 0; p < one.size(); ++p) {
      nested += one[p];
      if (one[p] == '\n' && p + 1 < one.size()) nested += "  ";
    }
    while (!nested.empty() && nested.back() == '\n') nested.pop_back();
    absl::StrAppend(&json, "  \"", allocators[i], "\": ", nested,
                    i + 1 < results.size() ? ",\n" : "\n");
  }
  return json + "}\n";
}

// --replicas, --router and --overlap-weight; InvalidArgument naming a bad value.
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

// The fleet's numbers, then one row per replica.
std::string FleetTable(const sim::FleetResult& r) {
  std::vector<std::pair<std::string, std::string>> rows;
  const sim::MetricsSummary& m = r.summary;
  int64_t preemptions = 0, dropped = 0;
  for (const sim::ReplicaStats& s : r.replicas) {
    preemptions += s.result.preemptions;
    dropped += s.result.dropped_requests;
  }
  rows.emplace_back("Completed requests", absl::StrCat(m.completed));
  rows.emplace_back("Dropped (> max_model_len)", absl::StrCat(dropped));
  rows.emplace_back("Duration (s)", Fmt(m.duration_s));
  rows.emplace_back("Request throughput (req/s)", Fmt(m.request_throughput, 3));
  rows.emplace_back("Output throughput (tok/s)", Fmt(m.output_throughput, 1));
  const std::pair<const char*, const sim::LatencyStats*> latencies[] = {
      {"TTFT", &m.ttft_ms}, {"TPOT", &m.tpot_ms}, {"ITL", &m.itl_ms}, {"E2E latency", &m.e2el_ms}};
  for (const auto& [name, s] : latencies) {
    rows.emplace_back(absl::StrCat(name, " mean / p50 / p99 (ms)"),
                      absl::StrCat(Fmt(s->mean), " / ", Fmt(s->median), " / ", Fmt(s->p99)));
  }
  rows.emplace_back("Preemptions", absl::StrCat(preemptions));
  rows.emplace_back("Prefix-cache hit tokens",
                    absl::StrFormat("%d / %d (%.2f%%)", r.prefix_cache.hit_tokens,
                                    r.prefix_cache.queried_tokens, 100 * r.prefix_cache.hit_rate));
  if (r.host_tier.has_value()) {
    std::vector<std::pair<std::string, std::vector<std::string>>> host_rows;
    HostTierRows(*r.host_tier, host_rows);
    for (auto& [name, cells] : host_rows) rows.emplace_back(std::move(name), std::move(cells[0]));
  }
  rows.emplace_back("Load imbalance (max/mean busy)", Fmt(r.load_imbalance, 3));
  rows.emplace_back("KV event bytes (B/s)",
                    absl::StrCat(r.event_bytes, " (", Fmt(r.event_bytes_per_s, 0), ")"));
  rows.emplace_back("Simulated time (s)", Fmt(r.simulated_seconds));
  rows.emplace_back("Wall time (s)", Fmt(r.wall_seconds));
  size_t name_w = 0;
  for (const auto& row : rows) name_w = std::max(name_w, row.first.size());
  std::string out;
  for (const auto& [name, value] : rows) absl::StrAppendFormat(&out, "%-*s  %s\n", name_w, name, value);
  absl::StrAppendFormat(&out, "\n%7s %8s %9s %10s %9s %11s %11s %8s\n", "replica", "routed",
                        "completed", "busy (s)", "hit (%)", "KV peak (%)", "preemptions",
                        "steps");
  for (size_t i = 0; i < r.replicas.size(); ++i) {
    const sim::ReplicaStats& s = r.replicas[i];
    absl::StrAppendFormat(&out, "%7d %8d %9d %10.2f %9.2f %11.1f %11d %8d\n", i, s.routed,
                          s.result.summary.completed, s.busy_s,
                          100 * s.result.prefix_cache.hit_rate, 100 * s.result.kv_usage[0].peak,
                          s.result.preemptions, s.result.num_steps);
  }
  return out;
}

// `kvpage sim --replicas N --router R`: the fleet run, its table or JSON.
int RunFleet(const SimFlags& f, const FlagSet& fs, const sim::SimConfig& base) {
  if (f.compare_allocators || !f.output_dir.empty()) {
    return Fail(absl::InvalidArgumentError(
        "--compare-allocators and --output-dir are not supported with --replicas / --router"));
  }
  auto config = MakeFleetConfig(f, base);
  if (!config.ok()) return Fail(config.status());
  auto trace = LoadTrace(f, fs, base.vocab_size);
  if (!trace.ok()) return Fail(trace.status());
  config->replica.scheduler.kv.mode =
      f.allocator == "vllm" ? AccountingMode::kVllm : AccountingMode::kKvpage;
  config->replica.record_steps = false;
  ProgressBar bar(absl::StrCat(f.replicas, " x ", f.router));
  if (!f.no_progress) config->replica.progress = [&bar](const sim::SimProgress& p) { bar.Update(p); };
  auto result = sim::SimulateFleet(*trace, *config);
  bar.Clear();
  if (!result.ok()) {
    std::cerr << "kvpage sim: " << result.status().message() << "\n";
    return absl::IsInvalidArgument(result.status()) ? 2 : 1;
  }
  const sim::CostModelSummary cost = sim::SummarizeCostModel(base.gpu, base.calibration);
  const std::string json = sim::WithCostModel(sim::FleetResultToJson(*result, *config), cost);
  if (f.output_json == "-") {
    std::cout << json;
  } else {
    std::cout << absl::StrFormat("%s on %d x %s%s, router %s, %d requests\n", base.model.name,
                                 f.replicas, base.gpu.name,
                                 f.tp > 1 ? absl::StrCat(" (tp ", f.tp, ")") : "", f.router,
                                 trace->size())
              << cost.Line() << "\n"
              << FleetTable(*result);
    if (!f.output_json.empty()) {
      if (absl::Status s = sim::WriteTextFile(f.output_json, json); !s.ok()) {
        std::cerr << "kvpage sim: " << s.message() << "\n";
        return 1;
      }
    }
  }
  std::cout.flush();
  return 0;
}

}  // namespace

int RunSim(const std::vector<std::string>& args) {
  SimFlags f;
  FlagSet fs(kSimUsage);
  RegisterSimFlags(fs, f);
  if (int rc = 0; !ParseFlagsOrExit(fs, args, "sim", &rc)) return rc;
  if (f.allocator != "kvpage" && f.allocator != "vllm") {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("--allocator must be kvpage or vllm, got '", f.allocator, "'")));
  }
  if (f.compare_allocators && fs.WasSet("allocator")) {
    return Fail(absl::InvalidArgumentError("--compare-allocators and --allocator exclude each other"));
  }
  auto base = MakeConfig(f, fs);
  if (!base.ok()) return Fail(base.status());
  if (base->scheduler.kv.host_cache.budget_bytes > 0 &&
      (f.compare_allocators || f.allocator == "vllm")) {
    return Fail(absl::InvalidArgumentError(
        "--host-cache-gib needs kvpage accounting: vllm accounting models vLLM without "
        "offloading (drop --allocator vllm / --compare-allocators)"));
  }
  if (f.compare_allocators || f.allocator == "vllm") {
    if (absl::Status s = CheckVllmBlockSize(f.block_size); !s.ok()) {
      return Fail(absl::InvalidArgumentError(absl::StrCat("--block-size: ", s.message())));
    }
  }
  if (fs.WasSet("replicas") || fs.WasSet("router") || fs.WasSet("overlap-weight")) {
    return RunFleet(f, fs, *base);
  }
  auto trace = LoadTrace(f, fs, base->vocab_size);
  if (!trace.ok()) return Fail(trace.status());

  std::vector<std::string> allocators =
      f.compare_allocators ? std::vector<std::string>{"kvpage", "vllm"}
                           : std::vector<std::string>{f.allocator};
  std::vector<sim::SimResult> results;
  for (const std::string& allocator : allocators) {
    sim::SimConfig c = *base;
    c.scheduler.kv.mode = allocator == "vllm" ? AccountingMode::kVllm : AccountingMode::kKvpage;
    ProgressBar bar(allocator);
    if (!f.no_progress) c.progress = [&bar](const sim::SimProgress& p) { bar.Update(p); };
    auto result = sim::Simulate(*trace, c);
    bar.Clear();
    if (!result.ok()) {
      std::cerr << "kvpage sim: " << allocator << ": " << result.status().message() << "\n";
      return absl::IsInvalidArgument(result.status()) ? 2 : 1;
    }
    if (result->dropped_requests > 0) {
      std::cerr << "kvpage sim: warning: " << allocator << ": dropped " << result->dropped_requests
                << " request(s) whose prompt leaves no room under max_model_len "
                << result->max_model_len << "\n";
    }
    results.push_back(*std::move(result));
  }

  if (!f.output_dir.empty()) {
    // Before the JSON, which may be written inside it.
    std::error_code ec;
    std::filesystem::create_directories(f.output_dir, ec);
  }
  const sim::CostModelSummary cost = sim::SummarizeCostModel(base->gpu, base->calibration);
  const std::string json = ResultsJson(allocators, results, cost);
  if (f.output_json == "-") {
    std::cout << json;
  } else {
    std::vector<std::pair<std::string, const sim::SimResult*>> runs;
    for (size_t i = 0; i < results.size(); ++i) runs.emplace_back(allocators[i], &results[i]);
    std::cout << absl::StrFormat("%s on %s%s, %d requests\n", base->model.name, base->gpu.name,
                                 f.tp > 1 ? absl::StrCat(" x", f.tp) : "", trace->size())
              << cost.Line() << "\n"
              << SummaryTable(runs);
    if (!f.output_json.empty()) {
      if (absl::Status s = sim::WriteTextFile(f.output_json, json); !s.ok()) {
        std::cerr << "kvpage sim: " << s.message() << "\n";
        return 1;
      }
    }
  }
  std::cout.flush();
  if (!f.output_dir.empty()) {
    for (size_t i = 0; i < results.size(); ++i) {
      const std::string dir =
          results.size() == 1 ? f.output_dir : f.output_dir + "/" + allocators[i];
      const std::string title =
          absl::StrCat(base->model.name, " on ", base->gpu.name, ", ", allocators[i]);
      if (int rc = WriteOutputDir(results[i], dir, title); rc != 0) return rc;
    }
  }
  return 0;
}

}  // namespace kvpage::cli
