// What a simulation run reports: per-request records, per-step records, and a summary named
// and defined like `vllm bench serve` (vllm.benchmarks.serve), so simulated and measured runs
// compare field by field.
//
// Definitions (times in the records are simulated seconds; summary latencies in ms):
//   ttft_ms   first_token_s − arrival_s
//   e2el_ms   finish_s − arrival_s
//   tpot_ms   (e2el − ttft) / (output_len − 1), only for requests with output_len >= 2
//             (time per output token *excluding the first*)
//   itl_ms    every gap between consecutive output tokens of a request, pooled over requests
//   duration_s            last finish − first arrival over the completed requests
//   request_throughput    completed / duration_s                       (req/s)
//   output_throughput     Σ output_len / duration_s                    (tok/s)
//   total_token_throughput (Σ prompt_len + Σ output_len) / duration_s  (tok/s)
// Statistics: mean, median, std (population, ddof = 0), p90 and p99, where percentile p of n
// sorted values x is numpy's default "linear" method: rank h = (n − 1) · p / 100,
// x[floor h] + (h − floor h) · (x[floor h + 1] − x[floor h]); median = p50. An empty set gives
// 0 for every statistic (vllm bench serve reports 0 there too).
//
// Writers produce deterministic text: JSON keys in a fixed order (numbers as nlohmann::json
// prints them), CSV columns in a fixed order with numbers in %.12g.
// All functions are pure and thread-compatible.
#ifndef KVPAGE_SIM_METRICS_H_
#define KVPAGE_SIM_METRICS_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace kvpage::sim {

// One finished request.
struct RequestRecord {
  int64_t index = 0;           // trace index
  double arrival_s = 0;
  double first_token_s = 0;    // when the first output token was produced
  double finish_s = 0;         // when the last output token was produced
  int32_t prompt_len = 0;
  int32_t output_len = 0;      // tokens generated, >= 1
  // Prompt tokens served by the prefix cache. Simulate records the first admission's hit;
  // other producers may sum over re-admissions (so it may exceed prompt_len).
  int64_t hit_tokens = 0;
  int32_t num_preemptions = 0;
  // Emission time of every output token (front() == first_token_s, back() == finish_s), or
  // empty when not recorded: ITLs are then unavailable for this request.
  std::vector<double> token_times_s;

  // InvalidArgument naming the index and the field unless arrival <= first token <= finish,
  // lengths are positive, hit_tokens and num_preemptions are >= 0 (hits add up over
  // re-admissions after preemption, so they may exceed prompt_len), and token_times_s is
  // empty or holds output_len non-decreasing times from first_token_s to finish_s.
  absl::Status Validate() const;
};

// The state after one scheduler step.
struct StepRecord {
  double time_s = 0;             // when the step started
  double duration_s = 0;         // cost-model time of the step
  int32_t num_running = 0;
  int32_t num_waiting = 0;
  int64_t num_scheduled_tokens = 0;
  int32_t num_preemptions = 0;   // preemptions this step
  std::vector<double> kv_usage;  // used / total blocks per KV pool, in pool order
};

struct LatencyStats {
  double mean = 0, median = 0, std = 0, p90 = 0, p99 = 0;
};

struct MetricsSummary {
  int64_t completed = 0;
  double duration_s = 0;
  int64_t total_input_tokens = 0;
  int64_t total_output_tokens = 0;
  int64_t prefix_hit_tokens = 0;
  int64_t num_preemptions = 0;
  double request_throughput = 0;
  double output_throughput = 0;
  double total_token_throughput = 0;
  LatencyStats ttft_ms, tpot_ms, itl_ms, e2el_ms;
};

// numpy "linear" percentile of `values` (any order), p in [0, 100]; 0 when empty.
double Percentile(std::vector<double> values, double p);
LatencyStats ComputeStats(std::vector<double> values);

// The summary of `records`; the first invalid record's error otherwise.
absl::StatusOr<MetricsSummary> Summarize(absl::Span<const RequestRecord> records);

// {"completed", "duration_s", "total_input_tokens", "total_output_tokens",
//  "prefix_hit_tokens", "num_preemptions", "request_throughput", "output_throughput",
//  "total_token_throughput", then for m in ttft, tpot, itl, e2el: "mean_<m>_ms",
//  "median_<m>_ms", "std_<m>_ms", "p90_<m>_ms", "p99_<m>_ms"}, pretty-printed with 2 spaces.
std::string SummaryToJson(const MetricsSummary& summary);

// Per-request CSV, one row per record:
// index,arrival_s,first_token_s,finish_s,prompt_len,output_len,hit_tokens,num_preemptions,
// ttft_ms,tpot_ms,e2el_ms (tpot_ms empty when output_len < 2).
void WriteRequestsCsv(absl::Span<const RequestRecord> records, std::ostream& out);

// Per-step CSV: time_s,duration_s,running,waiting,scheduled_tokens,preemptions, then one
// kv_usage_<name> column per pool name. REQUIRES: every record has pool_names.size() usages.
void WriteStepsCsv(absl::Span<const StepRecord> steps, absl::Span<const std::string> pool_names,
                   std::ostream& out);

// Writes `text` to `path`; Internal error naming the path when it cannot.
absl::Status WriteTextFile(const std::string& path, const std::string& text);

}  // namespace kvpage::sim

#endif  // KVPAGE_SIM_METRICS_H_
