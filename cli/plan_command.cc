// `kvpage plan` and `kvpage models`.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "cli/commands.h"
#include "cli/cli_util.h"
#include "cli/flags.h"
#include "cli/library_entry.h"
#include "kvpage/catalog.h"
#include "kvpage/checkpoint.h"
#include "kvpage/plan_format.h"
#include "kvpage/planner.h"
#include "kvpage/tensor_parallel.h"
#include "kvpage/vllm_runtime_memory.h"
#include "nlohmann/json.hpp"

namespace kvpage::cli {
namespace {

constexpr const char* kPlanUsage =
    R"(Usage: kvpage plan --model M[,M…] --context L[,L…] [--policy kvpage|vllm|llamacpp | --compare]
                   [policy flags] [--gpu GPU [--gpu-memory-utilization 0.9] | --kv-budget-gib X]
                   [--tp N] [--host-cache-gib N] [--format table|json|csv] [--plot FILE.png]
       kvpage plan --trace FILE --slo ttft-p99=2s,tpot-p99=100ms --model M --gpu G [flags]
                   (the fewest GPUs that serve a trace within an SLO; `kvpage plan --slo --help`)

Reports, for each context length L, the bytes one request of length L reserves for the model
under a reservation policy (kvpage's allocator, vLLM, or llama-server), split into the
length-dependent KV part and the fixed recurrent state, and — given a KV budget — how many
such requests fit. MiB = 2^20 bytes. With --tp N, everything is one GPU's share of a model
split over N GPUs by tensor parallelism. docs/capacity_planning.md explains every policy.)";

struct PlanFlags {
  std::string model;
  std::string policy = "kvpage";
  bool compare = false;
  std::string context = "4096,32768,131072";
  std::string kv_cache_dtype = "auto";
  int64_t block_size = 16;
  int64_t max_num_batched_tokens = 8192;
  bool no_async_scheduling = false;
  bool no_enable_prefix_caching = false;
  std::string vllm_version{VllmVersionName(kCurrentVllmVersion)};
  bool allow_long_max_model_len = false;
  int64_t max_num_seqs = 1024;
  bool enforce_eager = false;
  int64_t ubatch = 512;
  int64_t batch = 2048;
  int64_t parallel = 1;
  bool kv_unified = false;
  bool swa_full = false;
  std::string gpu;
  int64_t tp = 1;
  double gpu_memory_utilization = 0.9;
  double kv_budget_gib = 0;
  std::string format = "table";
  std::string plot;
  double host_cache_gib = 0;
  std::string checkpoint;
};

void RegisterPlanFlags(FlagSet& fs, PlanFlags& f) {
  fs.String("model", &f.model,
            "Bundled model name, path to a config.json, a comma-separated list, or 'all'.\n"
            "Bundled: " + absl::StrJoin(BundledModelNames(), ", ") + ".");
  fs.String("policy", &f.policy, "kvpage (default), vllm or llamacpp.");
  fs.Bool("compare", &f.compare, "Plan under all three policies, side by side.");
  fs.String("context", &f.context,
            "Context lengths in tokens, comma-separated; K = 1024 (default 4K,32K,128K).");
  fs.String("kv-cache-dtype", &f.kv_cache_dtype,
            "auto (default: the model dtype; f16 for llamacpp), f32, f16, bf16, fp8, q8_0.\n"
            "Applies to attention KV only; recurrent state keeps its own dtypes.");
  fs.Int("block-size", &f.block_size, "kvpage, vllm: tokens per KV block (default 16).");
  fs.Int("max-num-batched-tokens", &f.max_num_batched_tokens,
         "kvpage, vllm: token budget of one step (default 8192, vLLM's LLM-class default on an\n"
         "A100 80GB). Sizes the sliding-window in-flight allowance.");
  fs.Bool("no-async-scheduling", &f.no_async_scheduling,
          "vllm: synchronous scheduling, one batch in flight instead of two.");
  fs.Bool("no-enable-prefix-caching", &f.no_enable_prefix_caching,
          "kvpage, vllm: prefix caching off (vllm keeps 1 linear-attention state block per\n"
          "group instead of 2; kvpage takes no state snapshots).");
  fs.String("vllm-version", &f.vllm_version,
            "vllm: the vLLM release to follow, 0.29 or 0.33 (default " +
                std::string(VllmVersionName(kCurrentVllmVersion)) +
                "). Both reserve the same\nfor every bundled model "
                "(docs/capacity_planning.md §3.2).");
  fs.Bool("allow-long-max-model-len", &f.allow_long_max_model_len,
          "vllm: as VLLM_ALLOW_LONG_MAX_MODEL_LEN=1, accept a --context above the model's\n"
          "derived max_model_len (positions past the trained range give NaN under RoPE).");
  fs.Int("max-num-seqs", &f.max_num_seqs,
         "vllm: requests one step may hold (default 1024, `vllm serve` on an H100 or H200);\n"
         "with --max-num-batched-tokens it sets the activation peak subtracted from --gpu.");
  fs.Bool("enforce-eager", &f.enforce_eager,
          "vllm: no CUDA graphs, so no CUDA-graph memory is subtracted from --gpu.");
  fs.Int("ubatch", &f.ubatch, "llamacpp: --ubatch-size (default 512).");
  fs.Int("batch", &f.batch, "llamacpp: --batch-size (default 2048).");
  fs.Int("parallel", &f.parallel, "llamacpp: --parallel, number of sequences (default 1).");
  fs.Bool("kv-unified", &f.kv_unified, "llamacpp: --kv-unified, one KV stream for all sequences.");
  fs.Bool("swa-full", &f.swa_full, "llamacpp: --swa-full, full-size cache for sliding layers.");
  fs.String("gpu", &f.gpu,
            "GPU whose memory sets the KV budget: " + absl::StrJoin(BundledGpuNames(), ", ") +
                " (aliases " + absl::StrJoin(BundledGpuAliases(), ", ") +
                ") or a hardware JSON file.\n"
                "Budget = memory x utilization - weights; under vllm also less its estimated\n"
                "activations, CUDA graphs and non-torch memory (docs/capacity_planning.md §1.1).");
  fs.Double("gpu-memory-utilization", &f.gpu_memory_utilization,
            "Fraction of GPU memory the runtime may use (default 0.9).");
  fs.Int("tp", &f.tp,
         "Tensor-parallel degree, 1 to 1024 (default 1): plan one GPU's share. It holds\n"
         "num_kv_heads / tp KV heads (one, replicated, when fewer than tp), the whole MLA\n"
         "latent, 1/tp of linear-attention state and weights / tp. tp must divide the query\n"
         "heads, and divide or be a multiple of the KV heads, as vLLM requires.");
  fs.Double("kv-budget-gib", &f.kv_budget_gib,
            "KV budget in GiB (2^30 bytes) of each GPU; overrides --gpu.");
  fs.String("format", &f.format, "table (default), json or csv.");
  fs.Double("host-cache-gib", &f.host_cache_gib,
            "Also report how many tokens a host-memory tier of the prefix cache of this many\n"
            "GiB holds (kvpage's pools; table and json formats; `kvpage sim --host-cache-gib`).");
  fs.String("checkpoint", &f.checkpoint,
            "Local Hugging Face checkpoint directory: the weights subtracted from --gpu's\n"
            "memory are its safetensors tensors' exact bytes (model.safetensors.index.json or\n"
            "model.safetensors; quantized dtypes included), not config.json's parameter count.\n"
            "Without safetensors files, the count from config.json. The model is its\n"
            "config.json unless --model names one.");
  fs.String("plot", &f.plot,
            "Also draw reserved memory against context length (powers of two from 1K up to\n"
            "the largest --context) for the chosen models and policies, to this PNG file.\n"
            "Needs /usr/bin/python3 with matplotlib (scripts/bootstrap.sh installs it).");
}

absl::StatusOr<std::vector<ModelSpec>> LoadModels(const std::string& list) {
  if (list.empty()) return absl::InvalidArgumentError("--model is required");
  std::vector<std::string> names;
  if (list == "all") {
    names = BundledModelNames();
  } else {
    names = absl::StrSplit(list, ',');
  }
  std::vector<ModelSpec> models;
  for (const std::string& name : names) {
    auto model = LoadModel(name);
    if (!model.ok()) return model.status();
    models.push_back(*std::move(model));
  }
  return models;
}

// --checkpoint DIR: one model (DIR/config.json unless --model names it) whose weight bytes
// are the checkpoint's; config.json's count when DIR holds no safetensors files (a warning).
absl::StatusOr<std::vector<ModelSpec>> LoadPlanModels(const PlanFlags& f) {
  if (f.checkpoint.empty()) return LoadModels(f.model);
  std::error_code ec;
  if (!std::filesystem::is_directory(f.checkpoint, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--checkpoint: '", f.checkpoint, "' is not a directory"));
  }
  auto models = LoadModels(
      f.model.empty() ? (std::filesystem::path(f.checkpoint) / "config.json").string() : f.model);
  if (!models.ok()) return models.status();
  if (models->size() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--checkpoint applies to one model, got ", models->size()));
  }
  ModelSpec& model = (*models)[0];
  const absl::StatusOr<CheckpointWeights> weights = ReadCheckpointWeights(f.checkpoint);
  if (absl::IsNotFound(weights.status())) {
    std::cerr << "kvpage plan: warning: " << weights.status().message()
              << "; weights counted from config.json (" << model.WeightBytes() << " bytes)\n";
    return models;
  }
  if (!weights.ok()) return weights.status();
  std::cerr << absl::StrFormat(
      "kvpage plan: weights of %s: %d bytes in %d tensors of %d safetensors files (config.json "
      "counts %d)\n",
      model.name, weights->total_bytes, weights->num_tensors, weights->num_files,
      model.WeightBytes());
  model.weight_bytes = weights->total_bytes;
  return models;
}

absl::StatusOr<PlanOptions> ToOptions(const PlanFlags& f) {
  PlanOptions o;
  if (f.kv_cache_dtype != "auto") {
    auto dtype = ParseDType(f.kv_cache_dtype);
    if (!dtype.ok()) return absl::InvalidArgumentError(absl::StrCat("--kv-cache-dtype: ", dtype.status().message()));
    o.kv_cache_dtype = *dtype;
  }
  auto narrow = [](const char* flag, int64_t v, int32_t* out) -> absl::Status {
    if (v <= 0 || v > (int64_t{1} << 30)) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, " must be in [1, 2^30], got ", v));
    }
    *out = static_cast<int32_t>(v);
    return absl::OkStatus();
  };
  for (auto [flag, v, out] : {std::tuple{"block-size", f.block_size, &o.block_size},
                              {"max-num-batched-tokens", f.max_num_batched_tokens,
                               &o.max_num_batched_tokens},
                              {"max-num-seqs", f.max_num_seqs, &o.max_num_seqs},
                              {"ubatch", f.ubatch, &o.ubatch},
                              {"batch", f.batch, &o.batch},
                              {"parallel", f.parallel, &o.parallel}}) {
    if (absl::Status s = narrow(flag, v, out); !s.ok()) return s;
  }
  o.async_scheduling = !f.no_async_scheduling;
  o.enable_prefix_caching = !f.no_enable_prefix_caching;
  auto version = ParseVllmVersion(f.vllm_version);
  if (!version.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--vllm-version: ", version.status().message()));
  }
  o.vllm_version = *version;
  o.allow_long_max_model_len = f.allow_long_max_model_len;
  o.enforce_eager = f.enforce_eager;
  if (f.tp < 1 || f.tp > kMaxTensorParallel) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tp must be in [1, ", kMaxTensorParallel, "], got ", f.tp));
  }
  o.tp = static_cast<int32_t>(f.tp);
  o.kv_unified = f.kv_unified;
  o.swa_full = f.swa_full;
  if (absl::Status s = o.Validate(); !s.ok()) return s;
  return o;
}

// The vllm-only flags mean nothing to the other policies: refused, not ignored, there.
absl::Status CheckVllmOnlyFlags(const PlanFlags& f, const FlagSet& fs, Policy policy) {
  if (policy == Policy::kVllm) return absl::OkStatus();
  for (const char* flag :
       {"vllm-version", "allow-long-max-model-len", "max-num-seqs", "enforce-eager"}) {
    if (!fs.WasSet(flag)) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        "--", flag, " applies to --policy vllm (or --compare), not --policy ", f.policy));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<int64_t>> Budget(const PlanFlags& f, const FlagSet& fs,
                                              const ModelSpec& model) {
  if (fs.WasSet("kv-budget-gib")) {
    if (!(f.kv_budget_gib > 0) || f.kv_budget_gib > 1e9) {
      return absl::InvalidArgumentError(
          absl::StrCat("--kv-budget-gib must be in (0, 1e9], got ", f.kv_budget_gib));
    }
    return std::optional<int64_t>(static_cast<int64_t>(f.kv_budget_gib * 1073741824.0));
  }
  if (f.gpu.empty()) {
    if (fs.WasSet("gpu-memory-utilization")) {
      return absl::InvalidArgumentError("--gpu-memory-utilization needs --gpu");
    }
    return std::optional<int64_t>();
  }
  auto gpu = LoadGpu(f.gpu);
  if (!gpu.ok()) return gpu.status();
  if (!(f.gpu_memory_utilization > 0 && f.gpu_memory_utilization <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--gpu-memory-utilization must be in (0, 1], got ", f.gpu_memory_utilization));
  }
  auto shard = ShardForTensorParallel(model, static_cast<int32_t>(f.tp));
  if (!shard.ok()) return shard.status();
  auto budget = KvBudgetFromGpu(*shard, gpu->memory_bytes, f.gpu_memory_utilization);
  if (!budget.ok()) {
    // The weights alone do not fit: no request fits either. Say so, and plan with nothing.
    std::cerr << "kvpage plan: warning: " << budget.status().message() << "; KV budget is 0\n";
    return std::optional<int64_t>(0);
  }
  return std::optional<int64_t>(*budget);
}

int Fail(const absl::Status& s) { return FailUsage("plan", s); }

// What a host tier of `budget_bytes` holds for a model: its tokens at the bytes per token of
// every attention pool summed (kvpage's layout, whatever policy the table shows).
struct HostTierCapacity {
  int64_t budget_bytes = 0;
  double bytes_per_token = 0;
  int64_t tokens = 0;
  // Bytes of one recurrent-state snapshot (hybrid models): snapshots share the tier, so
  // `tokens` is then an upper bound.
  int64_t snapshot_bytes = 0;
};

absl::StatusOr<HostTierCapacity> HostCapacity(const ModelSpec& model, PlanOptions options,
                                              int64_t context, int64_t budget_bytes) {
  options.policy = Policy::kKvpage;
  const int64_t contexts[] = {context};
  auto plan = MakePlan(model, options, contexts);
  if (!plan.ok()) return plan.status();
  const PlanRow& row = plan->rows[0];
  HostTierCapacity c{.budget_bytes = budget_bytes, .snapshot_bytes = row.snapshot_bytes};
  for (const GroupReservation& g : row.groups) {
    if (g.block_size <= 0 || g.blocks <= 0) continue;  // recurrent state
    c.bytes_per_token += static_cast<double>(g.reserved_bytes) /
                         static_cast<double>(g.blocks * g.block_size);
  }
  if (c.bytes_per_token > 0) {
    c.tokens = static_cast<int64_t>(static_cast<double>(budget_bytes) / c.bytes_per_token);
  }
  return c;
}

std::string HostCapacityLine(const std::string& model, const HostTierCapacity& c) {
  std::string line = absl::StrFormat(
      "host tier %.2f GiB holds %d tokens of %s (%.1f bytes/token, every attention pool)\n",
      c.budget_bytes / 1073741824.0, c.tokens, model, c.bytes_per_token);
  if (c.snapshot_bytes > 0) {
    absl::StrAppendFormat(&line,
                          "  approximate: recurrent-state snapshots (%.3f MiB each) share the "
                          "tier, so fewer tokens fit\n",
                          c.snapshot_bytes / 1048576.0);
  }
  return line;
}

// PlansToJson with "host_cache" {budget_bytes, tokens, bytes_per_token, snapshot_bytes} added
// to each plan.
std::string PlansToJsonWithHost(const std::vector<Plan>& plans,
                                const std::vector<HostTierCapacity>& host) {
  using ojson = nlohmann::ordered_json;
  ojson j = ojson::parse(PlansToJson(plans));
  for (size_t i = 0; i < plans.size(); ++i) {
    ojson& plan = plans.size() == 1 ? j : j["plans"][i];
    const HostTierCapacity& c = host[i];
    plan["host_cache"] = ojson{{"budget_bytes", c.budget_bytes},
                               {"tokens", c.tokens},
                               {"bytes_per_token", c.bytes_per_token},
                               {"snapshot_bytes", c.snapshot_bytes}};
  }
  return j.dump(2) + "\n";
}

std::string PlotScript() {
  if (const char* env = std::getenv("KVPAGE_PLOT_SCRIPT")) return env;
  return DataDir() + "/scripts/plot_plan.py";
}

// Runs the planner over a power-of-two sweep and hands its JSON to the plotting script.
int DrawPlot(const std::vector<Plan>& plans, const std::string& png) {
  return PlotJson("plan", PlotScript(), PlansToJson(plans), png);
}

// The flags that need no file: --format, --compare against --policy, --host-cache-gib.
absl::Status CheckPlanFlags(const PlanFlags& f, const FlagSet& fs) {
  if (f.format != "table" && f.format != "json" && f.format != "csv") {
    return absl::InvalidArgumentError(
        absl::StrCat("--format must be table, json or csv, got '", f.format, "'"));
  }
  if (f.compare && fs.WasSet("policy")) {
    return absl::InvalidArgumentError("--compare and --policy exclude each other");
  }
  if (!fs.WasSet("host-cache-gib")) return absl::OkStatus();
  if (!(f.host_cache_gib > 0) || f.host_cache_gib > 1e9) {
    return absl::InvalidArgumentError(
        absl::StrCat("--host-cache-gib must be in (0, 1e9], got ", f.host_cache_gib));
  }
  if (f.format == "csv") {
    return absl::InvalidArgumentError("--host-cache-gib needs --format table or json");
  }
  return absl::OkStatus();
}

// The three policies with --compare, else --policy.
absl::StatusOr<std::vector<Policy>> Policies(const PlanFlags& f, const FlagSet& fs) {
  if (f.compare) return std::vector<Policy>{Policy::kKvpage, Policy::kVllm, Policy::kLlamaCpp};
  auto p = ParsePolicy(f.policy);
  if (!p.ok()) return p.status();
  if (absl::Status s = CheckVllmOnlyFlags(f, fs, *p); !s.ok()) return s;
  return std::vector<Policy>{*p};
}

// The plot's contexts: powers of two from 1K up to the longest context, then that context.
std::vector<int64_t> PlotSweep(const std::vector<int64_t>& contexts) {
  std::vector<int64_t> sweep;
  const int64_t longest = *std::max_element(contexts.begin(), contexts.end());
  for (int64_t c = 1024; c <= longest; c *= 2) sweep.push_back(c);
  if (sweep.empty() || sweep.back() != longest) sweep.push_back(longest);
  return sweep;
}

// What `kvpage plan` computes: one plan per (model, policy), in that order.
struct PlanRun {
  std::vector<int64_t> contexts;
  std::vector<Policy> policies;
  PlanOptions options;
  std::vector<Plan> plans;
  std::vector<int64_t> sweep;                   // PlotSweep(contexts)
  std::vector<Plan> plot_plans;                 // with --plot, over `sweep`
  std::vector<HostTierCapacity> host_capacity;  // per plan, with --host-cache-gib
};

// One GPU's budget under the vllm policy (its runtime memory subtracted) and that memory;
// a budget of 0, with a warning, when weights and runtime memory fill the GPU.
absl::StatusOr<std::pair<int64_t, VllmRuntimeMemory>> VllmBudget(const ModelSpec& model,
                                                                  const PlanOptions& o) {
  const absl::StatusOr<ModelSpec> shard = ShardForTensorParallel(model, o.tp);
  if (!shard.ok()) return shard.status();
  const absl::StatusOr<VllmRuntimeMemory> runtime = EstimateVllmRuntimeMemory(*shard, o);
  if (!runtime.ok()) return runtime.status();
  auto budget = VllmKvBudgetFromGpu(*shard, *o.gpu_memory_bytes, o.gpu_memory_utilization, o);
  if (!budget.ok()) {
    std::cerr << "kvpage plan: warning: " << budget.status().message() << "; KV budget is 0\n";
    return std::pair<int64_t, VllmRuntimeMemory>(0, *runtime);
  }
  return std::pair<int64_t, VllmRuntimeMemory>(*budget, *runtime);
}

// Appends one model's plans under every policy to run.
absl::Status PlanModel(const PlanFlags& f, const FlagSet& fs, const ModelSpec& model,
                       PlanRun& run) {
  auto budget = Budget(f, fs, model);
  if (!budget.ok()) return budget.status();
  PlanOptions options = run.options;
  if (auto gpu = LoadGpu(f.gpu); gpu.ok() && !fs.WasSet("kv-budget-gib")) {
    // The budget came from this GPU: a vllm refusal can name the utilization and tp that fit.
    options.gpu_memory_bytes = gpu->memory_bytes;
    options.gpu_memory_utilization = f.gpu_memory_utilization;
  }
  const bool host = fs.WasSet("host-cache-gib");
  HostTierCapacity capacity;
  if (host) {
    auto c = HostCapacity(model, run.options, run.contexts[0],
                          static_cast<int64_t>(f.host_cache_gib * 1073741824.0));
    if (!c.ok()) return c.status();
    capacity = *c;
  }
  for (Policy policy : run.policies) {
    PlanOptions o = options;
    o.policy = policy;
    std::optional<VllmRuntimeMemory> runtime;
    std::optional<int64_t> policy_budget = *budget;
    if (policy == Policy::kVllm && o.gpu_memory_bytes.has_value() && *budget > 0) {
      auto vllm = VllmBudget(model, o);
      if (!vllm.ok()) return vllm.status();
      std::tie(policy_budget, runtime) = *vllm;
    }
    auto plan = MakePlan(model, o, run.contexts, policy_budget);
    if (!plan.ok()) {
      return absl::Status(plan.status().code(),
                          absl::StrCat(model.name, " under ", PolicyName(policy), ": ",
                                       plan.status().message()));
    }
    plan->vllm_runtime = runtime;
    run.plans.push_back(*std::move(plan));
    if (host) run.host_capacity.push_back(capacity);
    if (!f.plot.empty()) {
      auto swept = MakePlan(model, o, run.sweep, policy_budget);
      if (!swept.ok()) return swept.status();
      run.plot_plans.push_back(*std::move(swept));
    }
  }
  return absl::OkStatus();
}

// Contexts, models, options and policies from the flags, then every plan.
absl::StatusOr<PlanRun> MakePlans(const PlanFlags& f, const FlagSet& fs) {
  PlanRun run;
  if (absl::Status s = ParseTokenCountList("context", f.context, &run.contexts); !s.ok()) {
    return s;
  }
  auto models = LoadPlanModels(f);
  if (!models.ok()) return models.status();
  auto options = ToOptions(f);
  if (!options.ok()) return options.status();
  run.options = *options;
  auto policies = Policies(f, fs);
  if (!policies.ok()) return policies.status();
  run.policies = *std::move(policies);
  run.sweep = PlotSweep(run.contexts);
  for (const ModelSpec& model : *models) {
    if (absl::Status s = PlanModel(f, fs, model, run); !s.ok()) return s;
  }
  return run;
}

// The table (one per model, the policies side by side with --compare), JSON or CSV.
void PrintPlans(const PlanFlags& f, bool host, const PlanRun& run) {
  if (f.format == "json") {
    std::cout << (host ? PlansToJsonWithHost(run.plans, run.host_capacity)
                       : PlansToJson(run.plans));
    return;
  }
  if (f.format == "csv") {
    std::cout << PlansToCsv(run.plans);
    return;
  }
  const size_t per_model = run.policies.size();
  for (size_t i = 0; i < run.plans.size(); i += per_model) {
    if (i > 0) std::cout << "\n";
    if (f.compare) {
      std::cout << CompareTable(absl::MakeConstSpan(run.plans).subspan(i, per_model));
    } else {
      std::cout << PlanToTable(run.plans[i]);
    }
    if (host) std::cout << HostCapacityLine(run.plans[i].model, run.host_capacity[i]);
  }
}

}  // namespace

absl::StatusOr<std::vector<Plan>> PlansForArgs(const std::vector<std::string>& args) {
  PlanFlags f;
  FlagSet fs(kPlanUsage);
  RegisterPlanFlags(fs, f);
  bool help = false;
  if (absl::Status s = fs.Parse(args, &help); !s.ok()) return s;
  for (const char* flag : {"plot", "host-cache-gib"}) {
    if (fs.WasSet(flag) || help) {
      return absl::InvalidArgumentError(
          absl::StrCat(help ? "--help" : absl::StrCat("--", flag), " is not offered here"));
    }
  }
  if (absl::Status s = CheckPlanFlags(f, fs); !s.ok()) return s;
  auto run = MakePlans(f, fs);
  if (!run.ok()) return run.status();
  return std::move(run->plans);
}

int RunPlan(const std::vector<std::string>& args) {
  if (IsSloPlan(args)) return RunSloPlan(args);
  PlanFlags f;
  FlagSet fs(kPlanUsage);
  RegisterPlanFlags(fs, f);
  if (int rc = 0; !ParseFlagsOrExit(fs, args, "plan", &rc)) return rc;
  if (absl::Status s = CheckPlanFlags(f, fs); !s.ok()) return Fail(s);
  auto run = MakePlans(f, fs);
  if (!run.ok()) return Fail(run.status());
  PrintPlans(f, fs.WasSet("host-cache-gib"), *run);
  std::cout.flush();
  if (!f.plot.empty()) return DrawPlot(run->plot_plans, f.plot);
  return 0;
}

int RunModels(const std::vector<std::string>& args) {
  std::string model_list = "all";
  FlagSet fs("Usage: kvpage models [--model M[,M…]]\n\nLists models with their layer groups.");
  fs.String("model", &model_list, "Bundled name(s), path(s) or 'all' (default).");
  if (int rc = 0; !ParseFlagsOrExit(fs, args, "models", &rc)) return rc;
  auto models = LoadModels(model_list);
  if (!models.ok()) return FailUsage("models", models.status());
  for (const ModelSpec& m : *models) {
    std::cout << absl::StrFormat(
        "%-28s %-18s %3d layers  %s  %7.2fB params  %7.2f GB weights  max_pos %d\n", m.name,
        m.model_type, m.num_layers(), DTypeName(m.dtype), m.num_params / 1e9,
        m.WeightBytes() / 1e9, m.max_position_embeddings);
    for (const LayerGroup& g : m.groups) {
      const LayerSpec& s = g.spec;
      std::string shape;
      if (s.kind == LayerKind::kLinearAttention) {
        shape = absl::StrFormat("conv %d values (%s) + recurrent %d values (%s)",
                                s.linear.ConvValues(), DTypeName(s.linear.conv_dtype),
                                s.linear.RecurrentValues(), DTypeName(s.linear.recurrent_dtype));
      } else {
        shape = absl::StrFormat("%d kv heads x (%d + %d)", s.attention.num_kv_heads,
                                s.attention.head_dim_k, s.attention.head_dim_v);
        if (s.kind == LayerKind::kSlidingWindow) {
          absl::StrAppendFormat(&shape, ", window %d", s.sliding_window);
        }
        if (s.attention.HasIndexer()) {
          absl::StrAppendFormat(&shape, ", indexer key %d values (top-%d of %d heads)",
                                s.attention.index_head_dim, m.index_topk, m.index_n_heads);
        }
      }
      std::cout << absl::StrFormat("    %-17s x%-3d %s\n", LayerKindName(s.kind), g.num_layers(),
                                   shape);
    }
  }
  return 0;
}

}  // namespace kvpage::cli
