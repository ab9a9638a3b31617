// Metrics: what a server exports for dashboards and autoscalers, under vLLM's metric names.
//
// A MetricsRecorder watches one Scheduler's steps through the server's clock (the scheduler
// keeps none) and turns them into a Metrics snapshot: gauges of now, counters and histograms
// since the recorder was made. RenderPrometheus writes a snapshot in the Prometheus text
// exposition format (version 0.0.4); serving it over HTTP is the server's part.
//
//   kvpage::MetricsRecorder metrics;
//   metrics.ObserveArrival(spec.id, spec.prompt_token_ids.size(), Now());  // AddRequest took it
//   const kvpage::SchedulerOutput& out = scheduler->Schedule();
//   metrics.ObserveSchedule(out, Now());
//   ... run the step ...
//   auto result = scheduler->Update(out, model_output);
//   metrics.ObserveUpdate(out, model_output, *result, Now());
//   // on a scrape:
//   std::string body = kvpage::RenderPrometheus(metrics.Snapshot(*scheduler), "qwen3-8b");
//
// Names and meanings follow vLLM 0.33 (vllm/v1/metrics/loggers.py), bucket bounds its
// defaults (vllm/v1/metrics/buckets.py), so its dashboards read a kvpage server unchanged:
//   vllm:num_requests_running, vllm:num_requests_waiting       gauges
//   vllm:kv_cache_usage_perc                                     gauge, 0..1
//   vllm:prefix_cache_queries_total, vllm:prefix_cache_hits_total  counters, in tokens
//   vllm:num_preemptions_total, vllm:prompt_tokens_total,
//   vllm:prompt_tokens_cached_total, vllm:generation_tokens_total  counters
//   vllm:request_success_total{finished_reason="stop|length|abort"}  counter
//   vllm:iteration_tokens_total                                  histogram, tokens per step
//   vllm:request_queue_time_seconds, vllm:time_to_first_token_seconds,
//   vllm:e2e_request_latency_seconds                             histograms, seconds
//   vllm:request_prompt_tokens, vllm:request_generation_tokens   histograms, tokens
// and one series kvpage adds: kvpage:kv_pool_usage_perc{group="G",kind="K"}, each pool's used
// bytes over the budget (the pools share it).
//
// Thread safety: none; one thread (the scheduler's) calls a recorder.
#ifndef KVPAGE_METRICS_H_
#define KVPAGE_METRICS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "kvpage/scheduler.h"

namespace kvpage {

// A cumulative histogram over fixed upper bounds (an implicit +Inf bucket follows them).
struct Histogram {
  std::vector<double> upper_bounds;  // ascending
  std::vector<uint64_t> counts;      // per bucket, not cumulative; upper_bounds.size() + 1
  double sum = 0;
  uint64_t count = 0;

  static Histogram WithBounds(std::vector<double> upper_bounds);
  // Counts `value` in the first bucket whose bound is >= value. NaN is ignored.
  void Observe(double value);
};

struct PoolUsageMetric {
  int32_t group = 0;
  LayerKind kind = LayerKind::kFullAttention;
  double usage = 0;  // the pool's used bytes over the whole budget
};

struct Metrics {
  // Gauges, read from the scheduler at Snapshot.
  int64_t num_requests_running = 0;
  int64_t num_requests_waiting = 0;
  double kv_cache_usage_perc = 0;
  std::vector<PoolUsageMetric> pools;
  // Counters: the scheduler's and the KV cache's lifetime totals.
  int64_t prefix_cache_queries = 0;  // prompt tokens looked up
  int64_t prefix_cache_hits = 0;     // of which the cache served
  int64_t num_preemptions = 0;
  int64_t prompt_tokens = 0;         // of admitted requests, once per request
  int64_t prompt_tokens_cached = 0;  // of which prefix hits
  // Counters the recorder keeps.
  int64_t generation_tokens = 0;     // sampled tokens applied by Update
  int64_t requests_stop = 0;         // finished on a stop token (or a server's stop string)
  int64_t requests_length = 0;       // max_new_tokens or max_model_len reached
  int64_t requests_abort = 0;        // the scheduler's count of Abort calls
  // Histograms the recorder keeps.
  Histogram iteration_tokens;        // scheduled tokens per step
  Histogram queue_time_seconds;      // arrival to first scheduled
  Histogram time_to_first_token_seconds;  // arrival to the first sampled token's Update
  Histogram e2e_latency_seconds;     // arrival to finishing (aborts excluded)
  Histogram request_prompt_tokens;   // per finished request
  Histogram request_generation_tokens;
};

class MetricsRecorder {
 public:
  // `max_model_len` bounds the token histograms' 1-2-5 buckets (vLLM's rule).
  explicit MetricsRecorder(int64_t max_model_len = 131072);

  // A request was queued at `now_seconds` (any clock that only moves forward). Requests the
  // recorder never saw arrive count in the counters but in no latency histogram.
  void ObserveArrival(RequestId id, int64_t num_prompt_tokens, double now_seconds);
  // The step Schedule() returned: tokens per step, and queue time of requests scheduled for
  // the first time; requests aborted since the last step are forgotten. Call once per step
  // (Schedule returns a step again until its Update; a second call for it is ignored).
  void ObserveSchedule(const SchedulerOutput& output, double now_seconds);
  // The step's Update: tokens generated, first tokens, finished requests.
  void ObserveUpdate(const SchedulerOutput& output, const ModelOutput& model_output,
                     const UpdateResult& result, double now_seconds);
  // A request the server ended with Scheduler::Finish (Update's finished requests are
  // observed by ObserveUpdate).
  void ObserveFinish(const FinishedRequest& finished, double now_seconds);

  // The metrics as of now: the recorder's own plus the scheduler's gauges and counters.
  Metrics Snapshot(const Scheduler& scheduler) const;

 private:
  struct Timeline {
    double arrival = 0;
    int64_t prompt_tokens = 0;
    bool scheduled = false;
    bool sampled = false;
  };
  Metrics m_;
  uint64_t last_step_ = 0;
  bool any_step_ = false;
  absl::flat_hash_map<RequestId, Timeline> timelines_;
};

// The Prometheus text exposition of `metrics`, every series labelled
// model_name="<model_name>" (quotes, backslashes and newlines escaped).
std::string RenderPrometheus(const Metrics& metrics, absl::string_view model_name);

}  // namespace kvpage

#endif  // KVPAGE_METRICS_H_
