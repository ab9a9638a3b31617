// `kvpage sim`'s tables, JSON and output directory.
#include "cli/sim_report.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/cli_util.h"

namespace kvpage::cli {
namespace {

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

std::string PlotScript() {
  if (const char* env = std::getenv("KVPAGE_SIM_PLOT_SCRIPT")) return env;
  return DataDir() + "/scripts/plot_sim.py";
}

}  // namespace

ProgressBar::ProgressBar(std::string label)
    : label_(std::move(label)), tty_(isatty(STDERR_FILENO) != 0),
      start_(std::chrono::steady_clock::now()) {}

void ProgressBar::Clear() {
  if (drawn_) std::cerr << "\r\033[K" << std::flush;
  drawn_ = false;
}

void ProgressBar::Update(const sim::SimProgress& p) {
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

}  // namespace kvpage::cli
