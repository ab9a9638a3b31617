#include "kvpage/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kvpage/kv_cache_manager.h"
#include "kvpage/model_spec.h"

namespace kvpage {
namespace {

// vLLM 0.33's default bucket bounds (vllm/v1/metrics/buckets.py).
std::vector<double> RequestLatencyBuckets() {
  return {0.3,  0.5,  0.8,  1.0,  1.5,  2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
          30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
}
std::vector<double> FirstTokenBuckets() {
  return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
          1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
}
std::vector<double> IterationTokenBuckets() {
  return {1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384};
}
// 1, 2, 5, 10, 20, 50, ... up to max_value (vLLM's build_1_2_5_buckets).
std::vector<double> OneTwoFiveBuckets(int64_t max_value) {
  std::vector<double> bounds;
  for (int64_t scale = 1;; scale *= 10) {
    for (const int64_t m : {1, 2, 5}) {
      if (m * scale > max_value) return bounds;
      bounds.push_back(static_cast<double>(m * scale));
    }
    if (scale > max_value / 10) return bounds;
  }
}

std::string EscapeLabel(absl::string_view value) {
  std::string out;
  for (const char c : value) {
    if (c == '\\' || c == '"') out.push_back('\\');
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out.push_back(c);
  }
  return out;
}

// The shortest text that reads back as v.
std::string Number(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (std::isnan(v)) return "NaN";
  char buf[32];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, ec == std::errc() ? end : buf);
}

// Writes Prometheus series under a shared label set.
class Writer {
 public:
  explicit Writer(absl::string_view model)
      : labels_(absl::StrCat("model_name=\"", EscapeLabel(model), "\"")) {}

  void Header(absl::string_view name, absl::string_view type, absl::string_view help) {
    absl::StrAppend(&out_, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
  }
  void Sample(absl::string_view name, double value, absl::string_view extra = "") {
    absl::StrAppend(&out_, name, "{", labels_, extra.empty() ? "" : ",", extra, "} ",
                    Number(value), "\n");
  }
  void Gauge(absl::string_view name, absl::string_view help, double value) {
    Header(name, "gauge", help);
    Sample(name, value);
  }
  void Counter(absl::string_view name, absl::string_view help, double value) {
    const std::string total = absl::StrCat(name, "_total");
    Header(total, "counter", help);
    Sample(total, value);
  }
  void Hist(absl::string_view name, absl::string_view help, const Histogram& h) {
    Header(name, "histogram", help);
    const std::string bucket = absl::StrCat(name, "_bucket");
    uint64_t cumulative = 0;
    for (size_t i = 0; i <= h.upper_bounds.size(); ++i) {
      cumulative += i < h.counts.size() ? h.counts[i] : 0;
      const double le = i < h.upper_bounds.size() ? h.upper_bounds[i] : INFINITY;
      Sample(bucket, static_cast<double>(cumulative), absl::StrCat("le=\"", Number(le), "\""));
    }
    Sample(absl::StrCat(name, "_sum"), h.sum);
    Sample(absl::StrCat(name, "_count"), static_cast<double>(h.count));
  }
  std::string Take() { return std::move(out_); }

 private:
  std::string labels_;
  std::string out_;
};

}  // namespace

Histogram Histogram::WithBounds(std::vector<double> upper_bounds) {
  Histogram h;
  h.counts.assign(upper_bounds.size() + 1, 0);
  h.upper_bounds = std::move(upper_bounds);
  return h;
}

void Histogram::Observe(double value) {
  if (std::isnan(value)) return;
  if (counts.size() != upper_bounds.size() + 1) counts.assign(upper_bounds.size() + 1, 0);
  const size_t i = static_cast<size_t>(
      std::lower_bound(upper_bounds.begin(), upper_bounds.end(), value) - upper_bounds.begin());
  ++counts[i];
  sum += value;
  ++count;
}

MetricsRecorder::MetricsRecorder(int64_t max_model_len) {
  const int64_t cap = std::max<int64_t>(1, max_model_len);
  m_.iteration_tokens = Histogram::WithBounds(IterationTokenBuckets());
  m_.queue_time_seconds = Histogram::WithBounds(RequestLatencyBuckets());
  m_.time_to_first_token_seconds = Histogram::WithBounds(FirstTokenBuckets());
  m_.e2e_latency_seconds = Histogram::WithBounds(RequestLatencyBuckets());
  m_.request_prompt_tokens = Histogram::WithBounds(OneTwoFiveBuckets(cap));
  m_.request_generation_tokens = Histogram::WithBounds(OneTwoFiveBuckets(cap));
}

void MetricsRecorder::ObserveArrival(RequestId id, int64_t num_prompt_tokens,
                                     double now_seconds) {
  timelines_[id] = Timeline{.arrival = now_seconds, .prompt_tokens = num_prompt_tokens};
}

void MetricsRecorder::ObserveSchedule(const SchedulerOutput& output, double now_seconds) {
  if (any_step_ && output.step == last_step_) return;
  any_step_ = true;
  last_step_ = output.step;
  for (const RequestId id : output.finished_ids) timelines_.erase(id);  // aborted ones
  if (output.requests.empty()) return;
  m_.iteration_tokens.Observe(static_cast<double>(output.total_num_scheduled_tokens));
  for (const ScheduledRequest& r : output.requests) {
    auto it = timelines_.find(r.id);
    if (it == timelines_.end() || it->second.scheduled) continue;
    it->second.scheduled = true;
    m_.queue_time_seconds.Observe(now_seconds - it->second.arrival);
  }
}

void MetricsRecorder::ObserveUpdate(const SchedulerOutput& output,
                                    const ModelOutput& model_output, const UpdateResult& result,
                                    double now_seconds) {
  m_.generation_tokens += static_cast<int64_t>(model_output.sampled_token_ids.size());
  for (const ScheduledRequest& r : output.requests) {
    if (!r.samples) continue;
    auto it = timelines_.find(r.id);
    if (it == timelines_.end() || it->second.sampled) continue;
    it->second.sampled = true;
    m_.time_to_first_token_seconds.Observe(now_seconds - it->second.arrival);
  }
  for (const FinishedRequest& f : result.finished) ObserveFinish(f, now_seconds);
}

void MetricsRecorder::ObserveFinish(const FinishedRequest& f, double now_seconds) {
  auto it = timelines_.find(f.id);
  if (f.reason == FinishReason::kAborted) {
    if (it != timelines_.end()) timelines_.erase(it);
    return;
  }
  ++(f.reason == FinishReason::kStop ? m_.requests_stop : m_.requests_length);
  m_.request_generation_tokens.Observe(f.num_output_tokens);
  if (it == timelines_.end()) return;
  m_.e2e_latency_seconds.Observe(now_seconds - it->second.arrival);
  m_.request_prompt_tokens.Observe(static_cast<double>(it->second.prompt_tokens));
  timelines_.erase(it);
}

Metrics MetricsRecorder::Snapshot(const Scheduler& scheduler) const {
  Metrics m = m_;
  m.num_requests_running = scheduler.num_running();
  m.num_requests_waiting = scheduler.num_waiting();
  const KvCacheUsage usage = scheduler.kv_cache().Usage();
  m.kv_cache_usage_perc = usage.usage;
  for (const PoolUsage& p : usage.pools) {
    const double bytes = static_cast<double>(p.used_blocks) * static_cast<double>(p.block_bytes);
    m.pools.push_back({.group = p.group.value,
                       .kind = p.kind,
                       .usage = usage.budget_bytes > 0 ? bytes / usage.budget_bytes : 0});
  }
  const PrefixCacheStats cache = scheduler.kv_cache().prefix_cache_stats();
  m.prefix_cache_queries = cache.queried_tokens;
  m.prefix_cache_hits = cache.hit_tokens;
  const SchedulerStats& stats = scheduler.stats();
  m.num_preemptions = stats.preemptions;
  m.prompt_tokens = stats.admitted_prompt_tokens;
  m.prompt_tokens_cached = stats.prefix_hit_tokens;
  m.requests_abort = stats.aborted;
  return m;
}

std::string RenderPrometheus(const Metrics& m, absl::string_view model_name) {
  Writer w(model_name);
  w.Gauge("vllm:num_requests_running", "Requests in model execution batches.",
          static_cast<double>(m.num_requests_running));
  w.Gauge("vllm:num_requests_waiting", "Requests waiting to be processed.",
          static_cast<double>(m.num_requests_waiting));
  w.Gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
          m.kv_cache_usage_perc);
  w.Header("kvpage:kv_pool_usage_perc", "gauge",
           "Used bytes of one layer group's pool over the shared KV budget.");
  for (const PoolUsageMetric& p : m.pools) {
    w.Sample("kvpage:kv_pool_usage_perc", p.usage,
             absl::StrCat("group=\"", p.group, "\",kind=\"", LayerKindName(p.kind), "\""));
  }
  w.Counter("vllm:prefix_cache_queries", "Prefix cache queries, in queried tokens.",
            static_cast<double>(m.prefix_cache_queries));
  w.Counter("vllm:prefix_cache_hits", "Prefix cache hits, in cached tokens.",
            static_cast<double>(m.prefix_cache_hits));
  w.Counter("vllm:num_preemptions", "Cumulative number of preemptions.",
            static_cast<double>(m.num_preemptions));
  w.Counter("vllm:prompt_tokens", "Prefill tokens of admitted requests.",
            static_cast<double>(m.prompt_tokens));
  w.Counter("vllm:prompt_tokens_cached", "Prefill tokens served by the prefix cache.",
            static_cast<double>(m.prompt_tokens_cached));
  w.Counter("vllm:generation_tokens", "Generated tokens.",
            static_cast<double>(m.generation_tokens));
  w.Header("vllm:request_success_total", "counter", "Finished requests by finish reason.");
  w.Sample("vllm:request_success_total", static_cast<double>(m.requests_stop),
           "finished_reason=\"stop\"");
  w.Sample("vllm:request_success_total", static_cast<double>(m.requests_length),
           "finished_reason=\"length\"");
  w.Sample("vllm:request_success_total", static_cast<double>(m.requests_abort),
           "finished_reason=\"abort\"");
  w.Hist("vllm:iteration_tokens_total", "Scheduled tokens per engine step.", m.iteration_tokens);
  w.Hist("vllm:request_queue_time_seconds", "Seconds from arrival to first scheduling.",
         m.queue_time_seconds);
  w.Hist("vllm:time_to_first_token_seconds", "Seconds from arrival to the first token.",
         m.time_to_first_token_seconds);
  w.Hist("vllm:e2e_request_latency_seconds", "Seconds from arrival to finishing.",
         m.e2e_latency_seconds);
  w.Hist("vllm:request_prompt_tokens", "Prompt tokens per finished request.",
         m.request_prompt_tokens);
  w.Hist("vllm:request_generation_tokens", "Generated tokens per finished request.",
         m.request_generation_tokens);
  return w.Take();
}

}  // namespace kvpage
