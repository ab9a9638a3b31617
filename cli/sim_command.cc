// `kvpage sim`: replays a request trace through the scheduler and block manager on a virtual
// clock (sim/simulator.h) and reports `vllm bench serve`-style metrics. The flags and what
// they configure are in sim_flags.h, the tables and files in sim_report.h.
#include <filesystem>
#include <initializer_list>
#include <iostream>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/library_entry.h"
#include "cli/sim_flags.h"
#include "cli/sim_report.h"
#include "sim/cost_model_summary.h"
#include "sim/fleet.h"
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

int Fail(const absl::Status& s) { return FailUsage("sim", s); }

// The fleet run (--replicas, --router, --overlap-weight) and its JSON, reporting progress to
// `bar` when given.
absl::StatusOr<FleetSimRun> SimulateFleetFor(const SimFlags& f, const FlagSet& fs,
                                          const sim::SimConfig& base, ProgressBar* bar) {
  if (f.compare_allocators || !f.output_dir.empty()) {
    return absl::InvalidArgumentError(
        "--compare-allocators and --output-dir are not supported with --replicas / --router");
  }
  auto config = MakeFleetConfig(f, base);
  if (!config.ok()) return config.status();
  auto trace = LoadSimTrace(f, fs, base.vocab_size);
  if (!trace.ok()) return trace.status();
  config->replica.scheduler.kv.mode =
      f.allocator == "vllm" ? AccountingMode::kVllm : AccountingMode::kKvpage;
  config->replica.record_steps = false;
  if (bar != nullptr) config->replica.progress = [bar](const sim::SimProgress& p) { bar->Update(p); };
  auto result = sim::SimulateFleet(*trace, *config);
  if (bar != nullptr) bar->Clear();
  if (!result.ok()) return result.status();
  const sim::CostModelSummary cost = sim::SummarizeCostModel(base.gpu, base.calibration);
  std::string json = sim::WithCostModel(sim::FleetResultToJson(*result, *config), cost);
  return FleetSimRun{*std::move(result), std::move(json), trace->size()};
}

// `kvpage sim --replicas N --router R`: the fleet run, its table or JSON.
int RunFleet(const SimFlags& f, const FlagSet& fs, const sim::SimConfig& base) {
  ProgressBar bar(absl::StrCat(f.replicas, " x ", f.router));
  auto run = SimulateFleetFor(f, fs, base, f.no_progress ? nullptr : &bar);
  if (!run.ok()) {
    std::cerr << "kvpage sim: " << run.status().message() << "\n";
    return absl::IsInvalidArgument(run.status()) ? 2 : 1;
  }
  if (f.output_json == "-") {
    std::cout << run->json;
  } else {
    const sim::CostModelSummary cost = sim::SummarizeCostModel(base.gpu, base.calibration);
    std::cout << absl::StrFormat("%s on %d x %s%s, router %s, %d requests\n", base.model.name,
                                 f.replicas, base.gpu.name,
                                 f.tp > 1 ? absl::StrCat(" (tp ", f.tp, ")") : "", f.router,
                                 run->num_requests)
              << cost.Line() << "\n"
              << FleetTable(run->result);
    if (!f.output_json.empty()) {
      if (absl::Status s = sim::WriteTextFile(f.output_json, run->json); !s.ok()) {
        std::cerr << "kvpage sim: " << s.message() << "\n";
        return 1;
      }
    }
  }
  std::cout.flush();
  return 0;
}

// Replays the trace under each allocator's accounting into results. Returns 0, or the exit
// code after a message on stderr.
int SimulateEach(const SimFlags& f, const std::vector<std::string>& allocators,
                 const std::vector<sim::TraceRequest>& trace, const sim::SimConfig& base,
                 std::vector<sim::SimResult>& results) {
  for (const std::string& allocator : allocators) {
    sim::SimConfig c = base;
    c.scheduler.kv.mode = allocator == "vllm" ? AccountingMode::kVllm : AccountingMode::kKvpage;
    ProgressBar bar(allocator);
    if (!f.no_progress) c.progress = [&bar](const sim::SimProgress& p) { bar.Update(p); };
    auto result = sim::Simulate(trace, c);
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
  return 0;
}

// The JSON on stdout with --output-json -, else the table (and the JSON to --output-json).
// Returns 0, or 1 after a message when the JSON file cannot be written.
int PrintResults(const SimFlags& f, const std::vector<std::string>& allocators,
                 const std::vector<sim::SimResult>& results, const sim::SimConfig& base,
                 size_t num_requests) {
  if (!f.output_dir.empty()) {
    // Before the JSON, which may be written inside it.
    std::error_code ec;
    std::filesystem::create_directories(f.output_dir, ec);
  }
  const sim::CostModelSummary cost = sim::SummarizeCostModel(base.gpu, base.calibration);
  const std::string json = ResultsJson(allocators, results, cost);
  if (f.output_json == "-") {
    std::cout << json;
    return 0;
  }
  std::vector<std::pair<std::string, const sim::SimResult*>> runs;
  for (size_t i = 0; i < results.size(); ++i) runs.emplace_back(allocators[i], &results[i]);
  std::cout << absl::StrFormat("%s on %s%s, %d requests\n", base.model.name, base.gpu.name,
                               f.tp > 1 ? absl::StrCat(" x", f.tp) : "", num_requests)
            << cost.Line() << "\n"
            << SummaryTable(runs);
  if (!f.output_json.empty()) {
    if (absl::Status s = sim::WriteTextFile(f.output_json, json); !s.ok()) {
      std::cerr << "kvpage sim: " << s.message() << "\n";
      return 1;
    }
  }
  return 0;
}

// With --output-dir, each run's CSV files and plot: in it, or one subdirectory per allocator.
int WriteOutputDirs(const SimFlags& f, const std::vector<std::string>& allocators,
                    const std::vector<sim::SimResult>& results, const sim::SimConfig& base) {
  if (f.output_dir.empty()) return 0;
  for (size_t i = 0; i < results.size(); ++i) {
    const std::string dir =
        results.size() == 1 ? f.output_dir : f.output_dir + "/" + allocators[i];
    const std::string title =
        absl::StrCat(base.model.name, " on ", base.gpu.name, ", ", allocators[i]);
    if (int rc = WriteOutputDir(results[i], dir, title); rc != 0) return rc;
  }
  return 0;
}

// A library call's flags (SimulateForArgs, SimulateFleetForArgs) into f and fs, and the run's
// base configuration. InvalidArgument for --help or a flag in `refused`.
absl::StatusOr<sim::SimConfig> LibrarySimConfig(const std::vector<std::string>& args,
                                                std::initializer_list<const char*> refused,
                                                SimFlags& f, FlagSet& fs) {
  RegisterSimFlags(fs, f);
  bool help = false;
  if (absl::Status s = fs.Parse(args, &help); !s.ok()) return s;
  for (const char* flag : refused) {
    if (fs.WasSet(flag) || help) {
      return absl::InvalidArgumentError(
          absl::StrCat(help ? "--help" : absl::StrCat("--", flag), " is not offered here"));
    }
  }
  if (absl::Status s = CheckAllocatorFlags(f, fs); !s.ok()) return s;
  auto base = MakeSimConfig(f, fs);
  if (!base.ok()) return base.status();
  if (absl::Status s = CheckVllmAccounting(f, *base); !s.ok()) return s;
  return base;
}

}  // namespace

absl::StatusOr<SimRun> SimulateForArgs(const std::vector<std::string>& args) {
  SimFlags f;
  FlagSet fs(kSimUsage);
  auto base = LibrarySimConfig(
      args, {"output-dir", "output-json", "replicas", "router", "overlap-weight"}, f, fs);
  if (!base.ok()) return base.status();
  auto trace = LoadSimTrace(f, fs, base->vocab_size);
  if (!trace.ok()) return trace.status();
  SimRun run;
  run.allocators = f.compare_allocators ? std::vector<std::string>{"kvpage", "vllm"}
                                        : std::vector<std::string>{f.allocator};
  for (const std::string& allocator : run.allocators) {
    sim::SimConfig c = *base;
    c.scheduler.kv.mode = allocator == "vllm" ? AccountingMode::kVllm : AccountingMode::kKvpage;
    auto result = sim::Simulate(*trace, c);
    if (!result.ok()) {
      return absl::Status(result.status().code(),
                          absl::StrCat(allocator, ": ", result.status().message()));
    }
    run.results.push_back(*std::move(result));
  }
  run.json = ResultsJson(run.allocators, run.results,
                         sim::SummarizeCostModel(base->gpu, base->calibration));
  return run;
}

absl::StatusOr<FleetSimRun> SimulateFleetForArgs(const std::vector<std::string>& args) {
  SimFlags f;
  FlagSet fs(kSimUsage);
  auto base = LibrarySimConfig(args, {"output-dir", "output-json"}, f, fs);
  if (!base.ok()) return base.status();
  return SimulateFleetFor(f, fs, *base, nullptr);
}

int RunSim(const std::vector<std::string>& args) {
  SimFlags f;
  FlagSet fs(kSimUsage);
  RegisterSimFlags(fs, f);
  if (int rc = 0; !ParseFlagsOrExit(fs, args, "sim", &rc)) return rc;
  if (absl::Status s = CheckAllocatorFlags(f, fs); !s.ok()) return Fail(s);
  auto base = MakeSimConfig(f, fs);
  if (!base.ok()) return Fail(base.status());
  if (absl::Status s = CheckVllmAccounting(f, *base); !s.ok()) return Fail(s);
  if (fs.WasSet("replicas") || fs.WasSet("router") || fs.WasSet("overlap-weight")) {
    return RunFleet(f, fs, *base);
  }
  auto trace = LoadSimTrace(f, fs, base->vocab_size);
  if (!trace.ok()) return Fail(trace.status());
  const std::vector<std::string> allocators =
      f.compare_allocators ? std::vector<std::string>{"kvpage", "vllm"}
                           : std::vector<std::string>{f.allocator};
  std::vector<sim::SimResult> results;
  if (int rc = SimulateEach(f, allocators, *trace, *base, results); rc != 0) return rc;
  if (int rc = PrintResults(f, allocators, results, *base, trace->size()); rc != 0) return rc;
  std::cout.flush();
  return WriteOutputDirs(f, allocators, results, *base);
}

}  // namespace kvpage::cli
