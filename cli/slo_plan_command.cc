// `kvpage plan --trace FILE --slo TERMS`: the fewest GPUs, with which tensor-parallel degree
// and router, that serve a trace within an SLO. For every (tp, router) pair a replica search
// (sim/slo_search.h) runs fleet simulations (sim/fleet.h); the searches run in parallel.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/library_entry.h"
#include "cli/slo_report.h"
#include "kvpage/catalog.h"
#include "kvpage/planner.h"
#include "kvpage/tensor_parallel.h"
#include "sim/fleet.h"
#include "sim/cost_model_summary.h"
#include "sim/hardware_calibration.h"
#include "sim/parallel_for.h"
#include "sim/slo.h"
#include "sim/slo_search.h"
#include "sim/trace.h"

namespace kvpage::cli {
namespace {

constexpr const char* kSloUsage =
    R"(Usage: kvpage plan --trace FILE --slo ttft-p99=2s,tpot-p99=100ms --model M --gpu G
                   [--max-requests N] [--routers R[,R…]] [--tp T[,T…]] [--jobs J]
                   [--max-replicas N] [--format table|json] [--plot FILE.png] [--progress]

For each tensor-parallel degree T and router R, finds the fewest data-parallel replicas of
T GPUs each whose fleet simulation (kvpage sim --replicas) of the trace meets every SLO term:
1, 2, 4, … replicas until one meets it, then bisection between the last miss and the first
hit (the SLO is assumed to hold for every count above one that holds). Prints every
simulation it ran and the answer: the fewest GPUs (replicas x T). docs/capacity_planning.md
has a worked example.

SLO terms: ttft, tpot, itl or e2e, then -p50, -p90 or -p99, '=', a positive limit and its
unit, s or ms; comma-separated.)";

struct SloFlags {
  std::string model;
  std::string gpu;
  std::string trace;
  std::string slo;
  int64_t max_requests = 0;
  std::string routers = "round-robin,least-loaded,prefix-aware,kv-events";
  std::string tp = "1";
  int64_t jobs = 0;
  int64_t max_replicas = 256;
  double gpu_memory_utilization = 0.9;
  int64_t seed = 0;
  std::string format = "table";
  std::string plot;
  bool progress = false;
};

void RegisterSloFlags(FlagSet& fs, SloFlags& f) {
  fs.String("trace", &f.trace,
            "Trace file (Mooncake .jsonl or Azure CSV). A bare name not in the working\n"
            "directory is looked up in the bundled traces (e.g. mooncake_conversation_trace.jsonl).");
  fs.String("slo", &f.slo, "SLO terms, e.g. ttft-p99=2s,tpot-p99=100ms (required).");
  fs.String("model", &f.model, "Bundled model name or path to a config.json (required).");
  fs.String("gpu", &f.gpu,
            "GPU of every replica (required): " + absl::StrJoin(BundledGpuNames(), ", ") +
                " (aliases " + absl::StrJoin(BundledGpuAliases(), ", ") +
                ") or a hardware JSON file.");
  fs.Int("max-requests", &f.max_requests, "Replay only the first N requests (default all).");
  fs.String("routers", &f.routers,
            "Routers to compare, comma-separated (default round-robin,least-loaded,\n"
            "prefix-aware,kv-events).");
  fs.String("tp", &f.tp,
            "Tensor-parallel degrees to try, comma-separated (default 1). Each must split the\n"
            "model as vLLM requires and leave room for KV after the weights.");
  fs.Int("jobs", &f.jobs, "Searches run at once (default: the number of hardware threads).");
  fs.Int("max-replicas", &f.max_replicas,
         "Upper bound of each search (default 256, at most 4096 and the request count).");
  fs.Double("gpu-memory-utilization", &f.gpu_memory_utilization,
            "KV budget of each GPU = memory x this - weights / tp (default 0.9).");
  fs.Int("seed", &f.seed, "Seed of prompt and sampled tokens (default 0).");
  fs.String("format", &f.format, "table (default) or json.");
  fs.String("plot", &f.plot,
            "Also draw each SLO metric against GPUs per (tp, router) to this PNG file (needs\n"
            "/usr/bin/python3 with matplotlib).");
  fs.Bool("progress", &f.progress, "Progress bar on stderr even when it is not a terminal.");
}

int Fail(const absl::Status& s) { return FailUsage("plan", s); }

absl::StatusOr<std::vector<int32_t>> ParseTpList(const std::string& text) {
  std::vector<int32_t> tps;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int64_t tp = 0;
    if (!absl::SimpleAtoi(part, &tp) || tp < 1 || tp > kMaxTensorParallel) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--tp: expected degrees in [1, ", kMaxTensorParallel, "], got '", part, "'"));
    }
    if (std::find(tps.begin(), tps.end(), tp) != tps.end()) {
      return absl::InvalidArgumentError(absl::StrCat("--tp lists ", tp, " twice"));
    }
    tps.push_back(static_cast<int32_t>(tp));
  }
  return tps;
}

absl::StatusOr<std::vector<sim::RouterKind>> ParseRouters(const std::string& text) {
  std::vector<sim::RouterKind> routers;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    absl::StatusOr<sim::RouterKind> router = sim::ParseRouterKind(part);
    if (!router.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--routers: ", router.status().message()));
    }
    if (std::find(routers.begin(), routers.end(), *router) != routers.end()) {
      return absl::InvalidArgumentError(absl::StrCat("--routers lists '", part, "' twice"));
    }
    routers.push_back(*router);
  }
  return routers;
}

absl::StatusOr<std::vector<sim::TraceRequest>> LoadSloTrace(const SloFlags& f, int32_t vocab) {
  if (f.trace.empty()) return absl::InvalidArgumentError("--trace is required with --slo");
  std::string path = f.trace;
  const std::string bundled = DataDir() + "/traces/" + path;
  if (!std::filesystem::exists(path) && path.find('/') == std::string::npos &&
      std::filesystem::exists(bundled)) {
    path = bundled;
  }
  sim::TraceFormat format = sim::TraceFormat::kMooncake;
  if (!absl::EndsWithIgnoreCase(path, ".jsonl") && !absl::EndsWithIgnoreCase(path, ".json")) {
    std::ifstream in(path);
    std::string header;
    std::getline(in, header);
    if (!absl::StrContains(header, "ContextTokens")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--trace '", f.trace, "': expected a Mooncake .jsonl or an Azure CSV (ContextTokens)"));
    }
    format = sim::TraceFormat::kAzure;
  }
  sim::TraceOptions o;
  o.seed = static_cast<uint64_t>(f.seed);
  o.vocab_size = vocab;
  o.max_requests = f.max_requests;
  return sim::ReadTrace(format, path, o);
}

// One replica of tp GPUs: kvpage sim's defaults, the budget of tp GPUs.
absl::StatusOr<sim::SimConfig> ReplicaConfig(const SloFlags& f, const ModelSpec& model,
                                             const GpuSpec& gpu, int32_t tp, bool keep_itl) {
  sim::SimConfig c;
  c.model = model;
  c.gpu = gpu;
  if (model.vocab_size >= 2 && model.vocab_size < c.vocab_size) {
    c.vocab_size = static_cast<int32_t>(model.vocab_size);
  }
  absl::StatusOr<sim::GpuCalibration> calibration = sim::LoadGpuCalibration(f.gpu);
  if (calibration.ok()) {
    c.calibration = *std::move(calibration);
  } else if (!absl::IsNotFound(calibration.status())) {
    return calibration.status();
  }
  absl::StatusOr<int64_t> budget =
      TensorParallelKvBudget(model, tp, gpu.memory_bytes, f.gpu_memory_utilization);
  if (!budget.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--tp ", tp, ": ", budget.status().message()));
  }
  c.scheduler.kv.kv_budget_bytes = *budget;
  c.cost.tp = tp;
  c.seed = static_cast<uint64_t>(f.seed);
  c.record_steps = false;
  c.record_token_times = keep_itl;  // only ITL needs every token's time
  return c;
}

// "[#####.....] 3/8 searches, 17 simulations, 12.3 s" on stderr, redrawn after every
// simulation (on one line on a terminal, one line each otherwise). Thread-safe.
class SearchProgress {
 public:
  SearchProgress(bool enabled, int64_t searches)
      : enabled_(enabled), tty_(isatty(STDERR_FILENO) != 0), searches_(searches),
        start_(std::chrono::steady_clock::now()) {}
  ~SearchProgress() {
    if (enabled_ && tty_ && drawn_) std::cerr << "\r\033[K" << std::flush;
  }
  void Simulated() { Draw(0, 1); }
  void SearchDone() { Draw(1, 0); }

 private:
  void Draw(int64_t searches_done, int64_t simulations) {
    if (!enabled_) return;
    std::lock_guard<std::mutex> lock(mu_);
    done_ += searches_done;
    simulations_ += simulations;
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    constexpr int64_t kWidth = 30;
    const int64_t filled = kWidth * done_ / std::max<int64_t>(searches_, 1);
    std::cerr << absl::StrFormat("%s[%s%s] %d/%d searches, %d simulations, %.1f s%s",
                                 tty_ ? "\r" : "", std::string(filled, '#'),
                                 std::string(kWidth - filled, '.'), done_, searches_,
                                 simulations_, elapsed, tty_ ? "" : "\n")
              << std::flush;
    drawn_ = true;
  }

  const bool enabled_, tty_;
  const int64_t searches_;
  const std::chrono::steady_clock::time_point start_;
  std::mutex mu_;
  int64_t done_ = 0, simulations_ = 0;
  bool drawn_ = false;
};

// Runs every search, `jobs` at a time.
void RunSearches(const std::vector<sim::TraceRequest>& trace,
                 const std::vector<sim::SimConfig>& replica_by_search,
                 const std::vector<sim::SloTerm>& slo, int32_t max_replicas, int32_t jobs,
                 SearchProgress& progress, std::vector<SloSearch>& searches) {
  sim::ParallelFor(static_cast<int64_t>(searches.size()), jobs, [&](int64_t i) {
    SloSearch& s = searches[i];
    sim::ReplicaProbe probe = [&](int32_t replicas) -> absl::StatusOr<sim::ProbeOutcome> {
      sim::FleetConfig fleet;
      fleet.replica = replica_by_search[i];
      fleet.replicas = replicas;
      fleet.router = s.router;
      absl::StatusOr<sim::FleetResult> run = sim::SimulateFleet(trace, fleet);
      progress.Simulated();
      if (!run.ok()) return run.status();
      sim::ProbeOutcome outcome;
      outcome.met = sim::MeetsSlo(run->summary, slo);
      outcome.completed = run->summary.completed;
      for (const sim::SloTerm& t : slo) outcome.values_ms.push_back(t.ValueMs(run->summary));
      return outcome;
    };
    // Keep the probes run before an error: they are part of the explored frontier.
    std::vector<sim::ReplicaProbeRecord> seen;
    sim::ReplicaProbe recording = [&](int32_t r) -> absl::StatusOr<sim::ProbeOutcome> {
      absl::StatusOr<sim::ProbeOutcome> o = probe(r);
      if (o.ok()) seen.push_back({r, *o});
      return o;
    };
    absl::StatusOr<sim::ReplicaSearchResult> result =
        sim::SearchFewestReplicas(recording, {.max_replicas = max_replicas});
    if (result.ok()) {
      s.result = *std::move(result);
    } else {
      s.status = result.status();
      s.result.probes = std::move(seen);
    }
    progress.SearchDone();
  });
}

std::string PlotScript() {
  if (const char* env = std::getenv("KVPAGE_SLO_PLOT_SCRIPT")) return env;
  return DataDir() + "/scripts/plot_slo.py";
}


// Checks the flags that need no file; fills the parsed lists.
absl::Status CheckFlags(const SloFlags& f, const FlagSet& fs, std::vector<sim::SloTerm>* slo,
                        std::vector<int32_t>* tps, std::vector<sim::RouterKind>* routers) {
  if (!fs.WasSet("slo")) return absl::InvalidArgumentError("--slo is required with --trace");
  if (f.model.empty()) return absl::InvalidArgumentError("--model is required");
  if (f.gpu.empty()) return absl::InvalidArgumentError("--gpu is required with --slo");
  if (f.format != "table" && f.format != "json") {
    return absl::InvalidArgumentError(
        absl::StrCat("--format must be table or json with --slo, got '", f.format, "'"));
  }
  if (fs.WasSet("max-requests") && f.max_requests < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-requests must be positive, got ", f.max_requests));
  }
  if (fs.WasSet("jobs") && (f.jobs < 1 || f.jobs > 1024)) {
    return absl::InvalidArgumentError(absl::StrCat("--jobs must be in [1, 1024], got ", f.jobs));
  }
  if (f.max_replicas < 1 || f.max_replicas > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-replicas must be in [1, 4096], got ", f.max_replicas));
  }
  if (!(f.gpu_memory_utilization > 0 && f.gpu_memory_utilization <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--gpu-memory-utilization must be in (0, 1], got ", f.gpu_memory_utilization));
  }
  if (f.seed < 0) return absl::InvalidArgumentError(absl::StrCat("--seed must be >= 0, got ", f.seed));
  auto parsed_slo = sim::ParseSlo(f.slo);
  if (!parsed_slo.ok()) return parsed_slo.status();
  *slo = *std::move(parsed_slo);
  auto parsed_tps = ParseTpList(f.tp);
  if (!parsed_tps.ok()) return parsed_tps.status();
  *tps = *std::move(parsed_tps);
  auto parsed_routers = ParseRouters(f.routers);
  if (!parsed_routers.ok()) return parsed_routers.status();
  *routers = *std::move(parsed_routers);
  return absl::OkStatus();
}

// One search per (tp, router), tp-major, with the replica configuration each simulates.
absl::Status PlanSearches(const SloFlags& f, const ModelSpec& model, const GpuSpec& gpu,
                          const std::vector<sim::SloTerm>& slo, const std::vector<int32_t>& tps,
                          const std::vector<sim::RouterKind>& routers,
                          std::vector<SloSearch>* searches,
                          std::vector<sim::SimConfig>* replicas) {
  const bool keep_itl = std::any_of(slo.begin(), slo.end(), [](const sim::SloTerm& t) {
    return t.metric == &sim::MetricsSummary::itl_ms;
  });
  for (int32_t tp : tps) {
    if (absl::Status s = CheckTensorParallel(model, tp); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--tp ", tp, ": ", s.message()));
    }
    auto config = ReplicaConfig(f, model, gpu, tp, keep_itl);
    if (!config.ok()) return config.status();
    for (sim::RouterKind router : routers) {
      searches->push_back({.tp = tp, .router = router});
      replicas->push_back(*config);
    }
  }
  return absl::OkStatus();
}

}  // namespace

bool IsSloPlan(const std::vector<std::string>& args) {
  return std::any_of(args.begin(), args.end(), [](const std::string& a) {
    return a == "--slo" || a == "--trace" || a.starts_with("--slo=") || a.starts_with("--trace=");
  });
}

namespace {

// What a run of the searches gives: the JSON and the table, and whether any search met the SLO.
struct SloPlanRun {
  std::string json;
  std::string table;
  bool met = false;
};

absl::StatusOr<SloPlanRun> RunSloSearches(const SloFlags& f, const FlagSet& fs,
                                          bool show_progress) {
  std::vector<sim::SloTerm> slo;
  std::vector<int32_t> tps;
  std::vector<sim::RouterKind> routers;
  if (absl::Status s = CheckFlags(f, fs, &slo, &tps, &routers); !s.ok()) return s;
  auto model = LoadModel(f.model);
  if (!model.ok()) return model.status();
  auto gpu = LoadGpu(f.gpu);
  if (!gpu.ok()) return gpu.status();
  std::vector<SloSearch> searches;
  std::vector<sim::SimConfig> replicas;
  if (absl::Status s = PlanSearches(f, *model, *gpu, slo, tps, routers, &searches, &replicas);
      !s.ok()) {
    return s;
  }
  auto loaded = LoadSloTrace(f, replicas.front().vocab_size);
  if (!loaded.ok()) return loaded.status();
  const std::vector<sim::TraceRequest>& trace = *loaded;
  if (trace.empty()) return absl::InvalidArgumentError("--trace holds no request");

  // More replicas than requests leave some idle: the bound need not exceed the request count.
  const auto max_replicas = static_cast<int32_t>(std::min<int64_t>(f.max_replicas, trace.size()));
  const int32_t jobs = static_cast<int32_t>(
      fs.WasSet("jobs") ? f.jobs : std::max<unsigned>(1, std::thread::hardware_concurrency()));
  {
    SearchProgress progress(show_progress, static_cast<int64_t>(searches.size()));
    RunSearches(trace, replicas, slo, max_replicas, jobs, progress, searches);
  }
  SloRunInfo info{model->name, gpu->name, std::filesystem::path(f.trace).filename().string(),
                  static_cast<int64_t>(trace.size()),
                  trace.back().arrival_s - trace.front().arrival_s, slo, max_replicas};
  const std::optional<SloAnswer> answer = PickSloAnswer(searches, slo);
  // Every replica runs the same GPU file, so one cost model priced every search.
  const sim::CostModelSummary cost =
      sim::SummarizeCostModel(replicas.front().gpu, replicas.front().calibration);
  return SloPlanRun{sim::WithCostModel(SloFrontierJson(info, searches, answer), cost),
                    SloFrontierTable(info, searches, answer) + cost.Line() + "\n",
                    answer.has_value()};
}

}  // namespace

int RunSloPlan(const std::vector<std::string>& args) {
  SloFlags f;
  FlagSet fs(kSloUsage);
  RegisterSloFlags(fs, f);
  // "--slo --help" would read --help as the SLO: any --help asks for this help.
  if (std::find(args.begin(), args.end(), "--help") != args.end()) {
    std::cout << fs.Help();
    return 0;
  }
  if (int rc = 0; !ParseFlagsOrExit(fs, args, "plan", &rc)) return rc;
  auto run = RunSloSearches(f, fs, f.progress || isatty(STDERR_FILENO) != 0);
  if (!run.ok()) return Fail(run.status());
  std::cout << (f.format == "json" ? run->json : run->table);
  std::cout.flush();
  if (!f.plot.empty()) {
    if (int rc = PlotJson("plan", PlotScript(), run->json, f.plot); rc != 0) return rc;
  }
  return run->met ? 0 : 1;
}

absl::StatusOr<std::string> SloPlanJsonForArgs(const std::vector<std::string>& args) {
  SloFlags f;
  FlagSet fs(kSloUsage);
  RegisterSloFlags(fs, f);
  if (std::find(args.begin(), args.end(), "--help") != args.end()) {
    return absl::InvalidArgumentError("--help is not offered here");
  }
  bool help = false;
  if (absl::Status s = fs.Parse(args, &help); !s.ok()) return s;
  for (const char* flag : {"plot", "format", "progress"}) {
    if (fs.WasSet(flag)) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, " is not offered here"));
    }
  }
  auto run = RunSloSearches(f, fs, /*show_progress=*/false);
  if (!run.ok()) return run.status();
  return std::move(run->json);
}

}  // namespace kvpage::cli
