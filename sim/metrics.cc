#include "sim/metrics.h"

#include <algorithm>
#include <cmath>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

namespace kvpage::sim {
namespace {

absl::Status RecordError(const RequestRecord& r, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("request ", r.index, ": ", what));
}

// 12 significant digits: microseconds for times up to 10^6 s, and no binary noise such as
// 150.00000000000003 for a derived 150 ms.
std::string Num(double v) { return absl::StrFormat("%.12g", v); }

double Ms(double seconds) { return seconds * 1000.0; }

}  // namespace

absl::Status RequestRecord::Validate() const {
  if (prompt_len < 1) return RecordError(*this, absl::StrCat("prompt_len ", prompt_len, " < 1"));
  if (output_len < 1) return RecordError(*this, absl::StrCat("output_len ", output_len, " < 1"));
  if (hit_tokens < 0) return RecordError(*this, absl::StrCat("hit_tokens ", hit_tokens, " < 0"));
  if (num_preemptions < 0) {
    return RecordError(*this, absl::StrCat("num_preemptions ", num_preemptions, " < 0"));
  }
  if (!(arrival_s <= first_token_s && first_token_s <= finish_s)) {
    return RecordError(*this, absl::StrCat("times must satisfy arrival ", arrival_s,
                                           " <= first token ", first_token_s, " <= finish ",
                                           finish_s));
  }
  if (token_times_s.empty()) return absl::OkStatus();
  if (static_cast<int64_t>(token_times_s.size()) != output_len) {
    return RecordError(*this, absl::StrCat("token_times_s has ", token_times_s.size(),
                                           " entries for output_len ", output_len));
  }
  if (token_times_s.front() != first_token_s || token_times_s.back() != finish_s ||
      !std::is_sorted(token_times_s.begin(), token_times_s.end())) {
    return RecordError(*this, "token_times_s must rise from first_token_s to finish_s");
  }
  return absl::OkStatus();
}

namespace {

// Percentile of values already sorted, without a copy: a run's ITLs are one per output token.
double SortedPercentile(const std::vector<double>& values, double p) {
  if (values.empty()) return 0.0;
  const double h = static_cast<double>(values.size() - 1) * p / 100.0;
  const auto lo = static_cast<size_t>(std::floor(h));
  if (lo + 1 >= values.size()) return values.back();
  return values[lo] + (h - static_cast<double>(lo)) * (values[lo + 1] - values[lo]);
}

}  // namespace

double Percentile(std::vector<double> values, double p) {
  std::sort(values.begin(), values.end());
  return SortedPercentile(values, p);
}

LatencyStats ComputeStats(std::vector<double> values) {
  LatencyStats s;
  if (values.empty()) return s;
  std::sort(values.begin(), values.end());
  double sum = 0;
  for (double v : values) sum += v;
  const double n = static_cast<double>(values.size());
  s.mean = sum / n;
  double sq = 0;
  for (double v : values) sq += (v - s.mean) * (v - s.mean);
  s.std = std::sqrt(sq / n);
  s.median = SortedPercentile(values, 50);
  s.p90 = SortedPercentile(values, 90);
  s.p99 = SortedPercentile(values, 99);
  return s;
}

absl::StatusOr<MetricsSummary> Summarize(absl::Span<const RequestRecord> records) {
  MetricsSummary s;
  std::vector<double> ttft, tpot, itl, e2el;
  size_t num_itls = 0;
  for (const RequestRecord& r : records) {
    num_itls += std::max<size_t>(r.token_times_s.size(), 1) - 1;
  }
  itl.reserve(num_itls);
  double first_arrival = 0, last_finish = 0;
  for (const RequestRecord& r : records) {
    if (absl::Status st = r.Validate(); !st.ok()) return st;
    first_arrival = s.completed == 0 ? r.arrival_s : std::min(first_arrival, r.arrival_s);
    last_finish = s.completed == 0 ? r.finish_s : std::max(last_finish, r.finish_s);
    ++s.completed;
    s.total_input_tokens += r.prompt_len;
    s.total_output_tokens += r.output_len;
    s.prefix_hit_tokens += r.hit_tokens;
    s.num_preemptions += r.num_preemptions;
    ttft.push_back(Ms(r.first_token_s - r.arrival_s));
    e2el.push_back(Ms(r.finish_s - r.arrival_s));
    if (r.output_len >= 2) {
      tpot.push_back(Ms(r.finish_s - r.first_token_s) / (r.output_len - 1));
    }
    for (size_t i = 1; i < r.token_times_s.size(); ++i) {
      itl.push_back(Ms(r.token_times_s[i] - r.token_times_s[i - 1]));
    }
  }
  s.duration_s = last_finish - first_arrival;
  if (s.duration_s > 0) {
    s.request_throughput = static_cast<double>(s.completed) / s.duration_s;
    s.output_throughput = static_cast<double>(s.total_output_tokens) / s.duration_s;
    s.total_token_throughput =
        static_cast<double>(s.total_input_tokens + s.total_output_tokens) / s.duration_s;
  }
  s.ttft_ms = ComputeStats(std::move(ttft));
  s.tpot_ms = ComputeStats(std::move(tpot));
  s.itl_ms = ComputeStats(std::move(itl));
  s.e2el_ms = ComputeStats(std::move(e2el));
  return s;
}

std::string SummaryToJson(const MetricsSummary& s) {
  nlohmann::ordered_json j;
  j["completed"] = s.completed;
  j["duration_s"] = s.duration_s;
  j["total_input_tokens"] = s.total_input_tokens;
  j["total_output_tokens"] = s.total_output_tokens;
  j["prefix_hit_tokens"] = s.prefix_hit_tokens;
  j["num_preemptions"] = s.num_preemptions;
  j["request_throughput"] = s.request_throughput;
  j["output_throughput"] = s.output_throughput;
  j["total_token_throughput"] = s.total_token_throughput;
  const std::pair<const char*, const LatencyStats*> metrics[] = {
      {"ttft", &s.ttft_ms}, {"tpot", &s.tpot_ms}, {"itl", &s.itl_ms}, {"e2el", &s.e2el_ms}};
  for (const auto& [name, stats] : metrics) {
    j[absl::StrCat("mean_", name, "_ms")] = stats->mean;
    j[absl::StrCat("median_", name, "_ms")] = stats->median;
    j[absl::StrCat("std_", name, "_ms")] = stats->std;
    j[absl::StrCat("p90_", name, "_ms")] = stats->p90;
    j[absl::StrCat("p99_", name, "_ms")] = stats->p99;
  }
  return j.dump(2) + "\n";
}

void WriteRequestsCsv(absl::Span<const RequestRecord> records, std::ostream& out) {
  out << "index,arrival_s,first_token_s,finish_s,prompt_len,output_len,hit_tokens,"
         "num_preemptions,ttft_ms,tpot_ms,e2el_ms\n";
  for (const RequestRecord& r : records) {
    const std::string tpot =
        r.output_len >= 2 ? Num(Ms(r.finish_s - r.first_token_s) / (r.output_len - 1)) : "";
    out << r.index << ',' << Num(r.arrival_s) << ',' << Num(r.first_token_s) << ','
        << Num(r.finish_s) << ',' << r.prompt_len << ',' << r.output_len << ','
        << r.hit_tokens << ',' << r.num_preemptions << ','
        << Num(Ms(r.first_token_s - r.arrival_s)) << ',' << tpot << ','
        << Num(Ms(r.finish_s - r.arrival_s)) << '\n';
  }
}

void WriteStepsCsv(absl::Span<const StepRecord> steps, absl::Span<const std::string> pool_names,
                   std::ostream& out) {
  out << "time_s,duration_s,running,waiting,scheduled_tokens,preemptions";
  for (const std::string& name : pool_names) out << ",kv_usage_" << name;
  out << '\n';
  for (const StepRecord& s : steps) {
    out << Num(s.time_s) << ',' << Num(s.duration_s) << ',' << s.num_running << ','
        << s.num_waiting << ',' << s.num_scheduled_tokens << ',' << s.num_preemptions;
    for (size_t i = 0; i < pool_names.size(); ++i) {
      out << ',' << (i < s.kv_usage.size() ? Num(s.kv_usage[i]) : std::string());
    }
    out << '\n';
  }
}

absl::Status WriteTextFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::InternalError(absl::StrCat("cannot open '", path, "' for writing"));
  out << text;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write '", path, "'"));
  return absl::OkStatus();
}

}  // namespace kvpage::sim
