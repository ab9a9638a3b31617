#include "sim/slo.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace kvpage::sim {
namespace {

constexpr char kNames[] =
    "ttft, tpot, itl or e2e, then -p50, -p90 or -p99 (e.g. ttft-p99=2s,tpot-p99=100ms)";

absl::Status BadTerm(absl::string_view term, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("--slo term '", term, "': ", why));
}

bool FindMetric(absl::string_view name, LatencyStats MetricsSummary::**out) {
  const std::pair<absl::string_view, LatencyStats MetricsSummary::*> metrics[] = {
      {"ttft", &MetricsSummary::ttft_ms}, {"tpot", &MetricsSummary::tpot_ms},
      {"itl", &MetricsSummary::itl_ms}, {"e2e", &MetricsSummary::e2el_ms}};
  for (const auto& [n, m] : metrics) {
    if (n == name) *out = m;
  }
  return *out != nullptr;
}

bool FindStat(absl::string_view name, double LatencyStats::**out) {
  const std::pair<absl::string_view, double LatencyStats::*> stats[] = {
      {"p50", &LatencyStats::median}, {"p90", &LatencyStats::p90}, {"p99", &LatencyStats::p99}};
  for (const auto& [n, s] : stats) {
    if (n == name) *out = s;
  }
  return *out != nullptr;
}

// "2s" -> 2000, "100ms" -> 100, "1.5 s" -> 1500.
absl::StatusOr<double> ParseLimitMs(absl::string_view term, absl::string_view value) {
  value = absl::StripAsciiWhitespace(value);
  if (value.empty()) return BadTerm(term, absl::StrCat("has no value; expected e.g. 2s or 100ms"));
  double scale = 0;
  absl::string_view number = value;
  if (absl::ConsumeSuffix(&number, "ms")) {
    scale = 1;
  } else if (absl::ConsumeSuffix(&number, "s")) {
    scale = 1000;
  } else {
    return BadTerm(term, absl::StrCat("value '", value, "' needs a unit, s or ms"));
  }
  double v = 0;
  if (!absl::SimpleAtod(absl::StripAsciiWhitespace(number), &v) || !std::isfinite(v)) {
    return BadTerm(term, absl::StrCat("'", value, "' is not a number with a unit (s or ms)"));
  }
  if (!(v > 0)) return BadTerm(term, absl::StrCat("limit must be positive, got '", value, "'"));
  return v * scale;
}

absl::StatusOr<SloTerm> ParseTerm(absl::string_view term) {
  const size_t eq = term.find('=');
  if (eq == absl::string_view::npos) {
    return BadTerm(term, absl::StrCat("expected METRIC-STAT=LIMIT with METRIC-STAT one of ",
                                      kNames));
  }
  const absl::string_view name = absl::StripAsciiWhitespace(term.substr(0, eq));
  SloTerm t;
  t.name = std::string(name);
  const size_t dash = name.find('-');
  if (dash == absl::string_view::npos || !FindMetric(name.substr(0, dash), &t.metric) ||
      !FindStat(name.substr(dash + 1), &t.stat)) {
    return BadTerm(term, absl::StrCat("unknown metric '", name, "'; expected ", kNames));
  }
  auto limit = ParseLimitMs(term, term.substr(eq + 1));
  if (!limit.ok()) return limit.status();
  t.limit_ms = *limit;
  return t;
}

std::string FormatMs(double ms) {
  if (ms >= 1000) return absl::StrFormat("%g s", ms / 1000);
  return absl::StrFormat("%g ms", ms);
}

}  // namespace

absl::StatusOr<std::vector<SloTerm>> ParseSlo(absl::string_view text) {
  if (absl::StripAsciiWhitespace(text).empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--slo is empty; expected terms such as ",
                                                   "ttft-p99=2s,tpot-p99=100ms"));
  }
  std::vector<SloTerm> terms;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    if (absl::StripAsciiWhitespace(part).empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--slo '", text, "' has an empty term"));
    }
    auto term = ParseTerm(part);
    if (!term.ok()) return term.status();
    for (const SloTerm& seen : terms) {
      if (seen.name == term->name) return BadTerm(part, "repeats an earlier term");
    }
    terms.push_back(*std::move(term));
  }
  return terms;
}

std::string SloToString(const std::vector<SloTerm>& terms) {
  std::vector<std::string> parts;
  for (const SloTerm& t : terms) parts.push_back(absl::StrCat(t.name, " <= ", FormatMs(t.limit_ms)));
  return absl::StrJoin(parts, ", ");
}

bool MeetsSlo(const MetricsSummary& summary, const std::vector<SloTerm>& terms) {
  if (summary.completed <= 0) return false;
  return std::all_of(terms.begin(), terms.end(), [&](const SloTerm& t) {
    return t.ValueMs(summary) <= t.limit_ms;
  });
}

double WorstSloRatio(const std::vector<double>& values_ms, const std::vector<SloTerm>& terms) {
  double worst = 0;
  for (size_t i = 0; i < terms.size() && i < values_ms.size(); ++i) {
    worst = std::max(worst, values_ms[i] / terms[i].limit_ms);
  }
  return worst;
}

}  // namespace kvpage::sim
