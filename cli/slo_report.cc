#include "cli/slo_report.h"

#include <algorithm>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

namespace kvpage::cli {
namespace {

using ordered_json = nlohmann::ordered_json;

// The probe of `search` at `replicas`. REQUIRES: it ran.
const sim::ReplicaProbeRecord& ProbeAt(const SloSearch& search, int32_t replicas) {
  for (const sim::ReplicaProbeRecord& p : search.result.probes) {
    if (p.replicas == replicas) return p;
  }
  return search.result.probes.back();  // unreachable: fewest is always a probed count
}

std::string Values(const std::vector<sim::SloTerm>& slo, const std::vector<double>& values) {
  std::string out;
  for (size_t i = 0; i < slo.size() && i < values.size(); ++i) {
    absl::StrAppendFormat(&out, "%s%s %.1f ms", i > 0 ? ", " : "", slo[i].name, values[i]);
  }
  return out;
}

std::string SearchOutcome(const SloRunInfo& info, const SloSearch& s) {
  const std::string who = absl::StrFormat("  tp %d, %-13s ", s.tp, sim::RouterKindName(s.router));
  if (!s.status.ok()) return absl::StrCat(who, "error: ", s.status.message(), "\n");
  if (!s.result.fewest.has_value()) {
    return absl::StrCat(who, "not met at ", info.max_replicas,
                        " replicas (the search's upper bound)\n");
  }
  const int64_t gpus = int64_t{*s.result.fewest} * s.tp;
  return absl::StrFormat("%s%d replica%s = %d GPU%s  (%d simulation%s)\n", who,
                         *s.result.fewest, *s.result.fewest == 1 ? "" : "s", gpus,
                         gpus == 1 ? "" : "s", s.result.probes.size(),
                         s.result.probes.size() == 1 ? "" : "s");
}

ordered_json ValuesJson(const std::vector<sim::SloTerm>& slo, const std::vector<double>& values) {
  ordered_json j = ordered_json::object();
  for (size_t i = 0; i < slo.size() && i < values.size(); ++i) j[slo[i].name] = values[i];
  return j;
}

ordered_json SearchJson(const SloRunInfo& info, const SloSearch& s) {
  ordered_json j;
  j["tp"] = s.tp;
  j["router"] = std::string(sim::RouterKindName(s.router));
  const bool found = s.status.ok() && s.result.fewest.has_value();
  j["fewest_replicas"] = found ? ordered_json(*s.result.fewest) : ordered_json(nullptr);
  j["gpus"] = found ? ordered_json(int64_t{*s.result.fewest} * s.tp) : ordered_json(nullptr);
  j["error"] = s.status.ok() ? ordered_json(nullptr) : ordered_json(std::string(s.status.message()));
  ordered_json probes = ordered_json::array();
  for (const sim::ReplicaProbeRecord& p : s.result.probes) {
    probes.push_back({{"replicas", p.replicas},
                      {"gpus", int64_t{p.replicas} * s.tp},
                      {"completed", p.outcome.completed},
                      {"met", p.outcome.met},
                      {"values_ms", ValuesJson(info.slo, p.outcome.values_ms)}});
  }
  j["probes"] = std::move(probes);
  return j;
}

}  // namespace

std::optional<SloAnswer> PickSloAnswer(const std::vector<SloSearch>& searches,
                                       const std::vector<sim::SloTerm>& slo) {
  std::optional<SloAnswer> best;
  double best_ratio = 0;
  for (size_t i = 0; i < searches.size(); ++i) {
    const SloSearch& s = searches[i];
    if (!s.status.ok() || !s.result.fewest.has_value()) continue;
    const SloAnswer candidate{i, *s.result.fewest, int64_t{*s.result.fewest} * s.tp};
    const double ratio = sim::WorstSloRatio(ProbeAt(s, candidate.replicas).outcome.values_ms, slo);
    // Searches are visited in listed order, so a full tie keeps the earlier one.
    if (!best.has_value() ||
        std::tie(candidate.gpus, ratio, s.tp) <
            std::tie(best->gpus, best_ratio, searches[best->search].tp)) {
      best = candidate;
      best_ratio = ratio;
    }
  }
  return best;
}

std::string SloFrontierTable(const SloRunInfo& info, const std::vector<SloSearch>& searches,
                             const std::optional<SloAnswer>& answer) {
  std::string out = absl::StrFormat("%s on %s: %d requests of %s (%.0f s of arrivals)",
                                    info.model, info.gpu, info.requests, info.trace,
                                    info.trace_seconds);
  // Prompts longer than max_model_len are dropped at every count; the SLO is over the rest.
  for (const SloSearch& s : searches) {
    if (s.result.probes.empty()) continue;
    const int64_t completed = s.result.probes.front().outcome.completed;
    if (completed < info.requests) {
      absl::StrAppendFormat(&out, "; %d complete, %d dropped (prompt over max_model_len)",
                            completed, info.requests - completed);
    }
    break;
  }
  absl::StrAppendFormat(&out,
                        "\nSLO: %s; per (tp, router), replicas 1..%d by doubling, then "
                        "bisection\n\n",
                        sim::SloToString(info.slo), info.max_replicas);
  absl::StrAppendFormat(&out, "%4s  %-13s %8s %6s", "tp", "router", "replicas", "GPUs");
  for (const sim::SloTerm& t : info.slo) absl::StrAppendFormat(&out, " %14s", t.name + " ms");
  absl::StrAppend(&out, "  met\n");
  for (const SloSearch& s : searches) {
    std::vector<const sim::ReplicaProbeRecord*> probes;
    for (const sim::ReplicaProbeRecord& p : s.result.probes) probes.push_back(&p);
    std::sort(probes.begin(), probes.end(),
              [](auto* a, auto* b) { return a->replicas < b->replicas; });
    for (const sim::ReplicaProbeRecord* p : probes) {
      absl::StrAppendFormat(&out, "%4d  %-13s %8d %6d", s.tp, sim::RouterKindName(s.router),
                            p->replicas, int64_t{p->replicas} * s.tp);
      for (double v : p->outcome.values_ms) absl::StrAppendFormat(&out, " %14.1f", v);
      absl::StrAppend(&out, p->outcome.met ? "  yes\n" : "  no\n");
    }
  }
  absl::StrAppend(&out, "\nFewest replicas that meet the SLO:\n");
  for (const SloSearch& s : searches) absl::StrAppend(&out, SearchOutcome(info, s));
  if (!answer.has_value()) {
    return absl::StrCat(out, "\nAnswer: no (tp, router) met the SLO within ", info.max_replicas,
                        " replicas\n");
  }
  const SloSearch& s = searches[answer->search];
  return absl::StrCat(
      out,
      absl::StrFormat("\nAnswer: %d x %s  (tp %d, %d replica%s, router %s: %s)\n", answer->gpus,
                      info.gpu, s.tp, answer->replicas, answer->replicas == 1 ? "" : "s",
                      sim::RouterKindName(s.router),
                      Values(info.slo, ProbeAt(s, answer->replicas).outcome.values_ms)),
      "Ties on GPUs go to the most headroom (smallest worst value / limit), then the smaller "
      "tp, then the router listed first.\n");
}

std::string SloFrontierJson(const SloRunInfo& info, const std::vector<SloSearch>& searches,
                            const std::optional<SloAnswer>& answer) {
  ordered_json j;
  j["model"] = info.model;
  j["gpu"] = info.gpu;
  j["trace"] = info.trace;
  j["requests"] = info.requests;
  j["trace_seconds"] = info.trace_seconds;
  j["max_replicas"] = info.max_replicas;
  ordered_json slo = ordered_json::array();
  for (const sim::SloTerm& t : info.slo) slo.push_back({{"metric", t.name}, {"limit_ms", t.limit_ms}});
  j["slo"] = std::move(slo);
  ordered_json all = ordered_json::array();
  for (const SloSearch& s : searches) all.push_back(SearchJson(info, s));
  j["searches"] = std::move(all);
  if (answer.has_value()) {
    const SloSearch& s = searches[answer->search];
    j["answer"] = {{"tp", s.tp},
                   {"router", std::string(sim::RouterKindName(s.router))},
                   {"replicas", answer->replicas},
                   {"gpus", answer->gpus},
                   {"values_ms", ValuesJson(info.slo, ProbeAt(s, answer->replicas).outcome.values_ms)}};
  } else {
    j["answer"] = nullptr;
  }
  return j.dump(2) + "\n";
}

}  // namespace kvpage::cli
