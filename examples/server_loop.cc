// server_loop: what a C++ inference server's main loop looks like on kvpage.
//
// Feeds the first N requests of a bundled trace (Mooncake conversation trace by default) to a
// kvpage Scheduler, all arriving at once, and runs a fake model until every request finishes.
// The fake model samples random tokens, but before that it checks what a real forward pass
// relies on:
//   * every slot of the step's slot mapping lies in a block of the request's own table row,
//     at the right offset, and no two tokens of a step write the same slot;
//   * no block is written by two requests in one step (blocks shared through the prefix
//     cache are full: they are read, never written);
//   * recurrent-state write slots are distinct across the batch.
// It prints one line per 100 steps and a summary: steps, tokens per step, KV usage.
//
// With --kv-events-endpoint it publishes the cache's KV events after every step, as vLLM's
// --kv-events-config does (kvpage/kv_event_publisher.h), so a KV-aware router can be pointed
// at it; --kv-events-linger-s keeps it (and its replay socket) up that long after the run,
// --kv-events-wait-s waits that long before the run (a subscriber joining over TCP misses what
// is published before its subscription arrives).
//
// With --metrics-port it serves kvpage's metrics (kvpage/metrics.h, vLLM's names) at
// http://127.0.0.1:PORT/metrics, updated after every step (0 picks a free port; the line
// "serving metrics on ..." names it), and keeps serving the final figures --metrics-linger-s.
//
// With --async-scheduling on it schedules step N + 1 before applying step N's tokens, as a
// server overlapping scheduling with the forward pass does (SchedulerConfig::async_scheduling).
//
// Requests also end the ways only the server can see (Scheduler::Finish): with
// --stop-string-every N, every N-th request (by trace index) ends with kStop at its 4th output
// token, as when the detokenized text completes a stop string; with --client-gone-every N,
// every N-th request ends with kAborted after its first token, as when its client disconnects.
// The summary counts the finish reasons and the cached tokens the finished requests report.
//
//   build/bin/server_loop [--model qwen3-8b] [--requests 200] [--trace FILE]
//                         [--kv-budget-mib 2048] [--max-num-seqs 64] [--seed 1]
//                         [--block-size 16] [--hash-seed SEED (default: --seed)]
//                         [--kv-events-endpoint tcp://*:5557]
//                         [--kv-events-replay-endpoint tcp://*:5558] [--kv-events-topic T]
//                         [--kv-events-linger-s 0] [--kv-events-wait-s 0]
//                         [--metrics-port PORT] [--metrics-linger-s 0]
//                         [--async-scheduling off] [--stop-string-every 0]
//                         [--client-gone-every 0]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "absl/status/statusor.h"
#include "kvpage/catalog.h"
#include "metrics_endpoint.h"
#include "kvpage/kv_event_publisher.h"
#include "kvpage/metrics.h"
#include "kvpage/scheduler.h"
#include "sim/trace.h"

namespace {

struct Options {
  std::string model = "qwen3-8b";
  std::string trace = std::string(KVPAGE_SOURCE_DIR) + "/sim/data/traces/mooncake_conversation_trace.jsonl";
  int64_t requests = 200;
  int64_t kv_budget_mib = 2048;
  int32_t max_num_seqs = 64;
  uint32_t seed = 1;
  int32_t block_size = 16;
  std::optional<uint64_t> hash_seed;  // unset: --seed
  std::string kv_events_endpoint;     // empty: no events
  std::optional<std::string> kv_events_replay_endpoint;
  std::string kv_events_topic;
  double kv_events_linger_s = 0;
  double kv_events_wait_s = 0;
  std::optional<int32_t> metrics_port;  // unset: no endpoint
  double metrics_linger_s = 0;
  bool async_scheduling = false;
  int64_t stop_string_every = 0;  // 0: no request ends by a stop string
  int64_t client_gone_every = 0;  // 0: no client disconnects
};

// Whole-string parses of a flag's value; false on anything else (the caller names the flag).
bool ParseInteger(const std::string& text, long long min, long long* out) {
  char* end = nullptr;
  const long long number = std::strtoll(text.c_str(), &end, 10);
  if (end == text.c_str() || *end != '\0' || number < min) return false;
  *out = number;
  return true;
}

bool ParseSeconds(const std::string& text, double* out) {
  char* end = nullptr;
  const double seconds = std::strtod(text.c_str(), &end);
  if (!(seconds >= 0) || end == text.c_str() || *end != '\0') return false;
  *out = seconds;
  return true;
}

// One setter per kind of flag: text, a positive count, a hash seed >= 0, seconds >= 0.
template <auto Field>
bool SetText(const std::string& value, Options* o) {
  o->*Field = value;
  return true;
}

template <auto Field>
bool SetCount(const std::string& value, Options* o) {
  long long number = 0;
  if (!ParseInteger(value, 1, &number)) return false;
  o->*Field = static_cast<std::remove_reference_t<decltype(o->*Field)>>(number);
  return true;
}

bool SetMetricsPort(const std::string& value, Options* o) {
  long long number = 0;
  if (!ParseInteger(value, 0, &number) || number > 65535) return false;
  o->metrics_port = static_cast<int32_t>(number);
  return true;
}

bool SetHashSeed(const std::string& value, Options* o) {
  long long number = 0;
  if (!ParseInteger(value, 0, &number)) return false;
  o->hash_seed = static_cast<uint64_t>(number);
  return true;
}

template <auto Field>
bool SetOnOff(const std::string& value, Options* o) {
  if (value != "on" && value != "off") return false;
  o->*Field = value == "on";
  return true;
}

template <auto Field>
bool SetSeconds(const std::string& value, Options* o) {
  return ParseSeconds(value, &(o->*Field));
}

struct Flag {
  const char* name;
  bool (*set)(const std::string& value, Options* o);
};

constexpr Flag kFlags[] = {
    {"--model", SetText<&Options::model>},
    {"--trace", SetText<&Options::trace>},
    {"--requests", SetCount<&Options::requests>},
    {"--kv-budget-mib", SetCount<&Options::kv_budget_mib>},
    {"--max-num-seqs", SetCount<&Options::max_num_seqs>},
    {"--seed", SetCount<&Options::seed>},
    {"--block-size", SetCount<&Options::block_size>},
    {"--hash-seed", SetHashSeed},
    {"--kv-events-endpoint", SetText<&Options::kv_events_endpoint>},
    {"--kv-events-replay-endpoint", SetText<&Options::kv_events_replay_endpoint>},
    {"--kv-events-topic", SetText<&Options::kv_events_topic>},
    {"--kv-events-linger-s", SetSeconds<&Options::kv_events_linger_s>},
    {"--kv-events-wait-s", SetSeconds<&Options::kv_events_wait_s>},
    {"--metrics-port", SetMetricsPort},
    {"--metrics-linger-s", SetSeconds<&Options::metrics_linger_s>},
    {"--async-scheduling", SetOnOff<&Options::async_scheduling>},
    {"--stop-string-every", SetCount<&Options::stop_string_every>},
    {"--client-gone-every", SetCount<&Options::client_gone_every>},
};

// "--flag value" pairs into *o; false after a message naming the first bad one.
bool ParseArgs(int argc, char** argv, Options* o) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    const Flag* known = std::find_if(std::begin(kFlags), std::end(kFlags),
                                     [&flag](const Flag& f) { return flag == f.name; });
    if (known == std::end(kFlags) || !known->set(value, o)) {
      std::fprintf(stderr, "server_loop: bad flag or value: %s %s\n", flag.c_str(), value.c_str());
      return false;
    }
  }
  if (argc % 2 == 0) {
    std::fprintf(stderr, "server_loop: flag %s has no value\n", argv[argc - 1]);
    return false;
  }
  return true;
}

// The checks of one step; returns the number of violations (and prints the first few).
int64_t CheckStep(const kvpage::SchedulerOutput& out) {
  int64_t errors = 0;
  auto report = [&](const std::string& what) {
    if (errors++ < 10) std::fprintf(stderr, "step %llu: %s\n", static_cast<unsigned long long>(out.step), what.c_str());
  };
  for (const kvpage::AttentionBatch& g : out.attention) {
    std::set<int64_t> written;
    size_t t = 0;
    for (const kvpage::ScheduledRequest& r : out.requests) {
      const int32_t* row = g.block_table.data() + static_cast<size_t>(r.row) * g.max_blocks_per_row;
      for (int64_t pos = r.num_computed_tokens; pos < r.num_computed_tokens + r.num_scheduled_tokens;
           ++pos, ++t) {
        const int32_t block = row[pos / g.kernel_block_size];
        const int64_t want = int64_t{block} * g.kernel_block_size + pos % g.kernel_block_size;
        if (block <= 0 || g.slot_mapping[t] != want) {
          report("request " + std::to_string(r.id.value) + " position " + std::to_string(pos) +
                 " maps to slot " + std::to_string(g.slot_mapping[t]));
        }
        if (!written.insert(g.slot_mapping[t]).second) {
          report("slot " + std::to_string(g.slot_mapping[t]) + " written twice");
        }
      }
    }
    // A block being written this step belongs to one row only.
    std::map<int32_t, int32_t> writer;
    t = 0;
    for (const kvpage::ScheduledRequest& r : out.requests) {
      for (int32_t k = 0; k < r.num_scheduled_tokens; ++k, ++t) {
        const int32_t block = static_cast<int32_t>(g.slot_mapping[t] / g.kernel_block_size);
        auto [it, inserted] = writer.emplace(block, r.row);
        if (!inserted && it->second != r.row) {
          report("block " + std::to_string(block) + " written by rows " +
                 std::to_string(it->second) + " and " + std::to_string(r.row));
        }
      }
    }
  }
  for (const kvpage::StateBatch& s : out.states) {
    std::set<int32_t> writes;
    for (const kvpage::ScheduledRequest& r : out.requests) {
      if (!writes.insert(s.write_slots[r.row]).second) {
        report("state slot " + std::to_string(s.write_slots[r.row]) + " written twice");
      }
    }
  }
  return errors;
}

// The model and the first --requests requests of the trace; false after a message.
bool LoadInputs(const Options& opt, kvpage::ModelSpec* model,
                std::vector<kvpage::sim::TraceRequest>* trace) {
  auto loaded = kvpage::LoadModel(opt.model);
  if (!loaded.ok()) {
    std::fprintf(stderr, "server_loop: %s\n", std::string(loaded.status().message()).c_str());
    return false;
  }
  *model = *std::move(loaded);
  kvpage::sim::TraceOptions trace_options;
  trace_options.max_requests = opt.requests;
  trace_options.seed = opt.seed;
  auto read = kvpage::sim::ReadTrace(kvpage::sim::TraceFormat::kMooncake, opt.trace, trace_options);
  if (!read.ok()) {
    std::fprintf(stderr, "server_loop: %s\n", std::string(read.status().message()).c_str());
    return false;
  }
  *trace = *std::move(read);
  return true;
}

kvpage::SchedulerConfig MakeConfig(const Options& opt) {
  kvpage::SchedulerConfig config;
  config.kv.kv_budget_bytes = opt.kv_budget_mib << 20;
  config.kv.hash_seed = opt.hash_seed.value_or(opt.seed);
  config.kv.block_size = opt.block_size;
  config.kv.enable_kv_events = !opt.kv_events_endpoint.empty();
  config.max_num_seqs = opt.max_num_seqs;
  config.max_num_batched_tokens = 8192;
  config.async_scheduling = opt.async_scheduling;
  return config;
}

// With --kv-events-endpoint: the publisher, bound and announced on stdout, after
// --kv-events-wait-s. Without: nullptr. An error when it cannot bind.
absl::StatusOr<std::unique_ptr<kvpage::KvEventPublisher>> StartPublisher(
    const Options& opt, const kvpage::Scheduler& scheduler) {
  if (opt.kv_events_endpoint.empty()) return std::unique_ptr<kvpage::KvEventPublisher>();
  auto made = kvpage::KvEventPublisher::Create(
      {.endpoint = opt.kv_events_endpoint,
       .replay_endpoint = opt.kv_events_replay_endpoint,
       .topic = opt.kv_events_topic},
      kvpage::KvEventGroupInfos(scheduler.kv_cache()));
  if (!made.ok()) return made.status();
  std::unique_ptr<kvpage::KvEventPublisher> publisher = *std::move(made);
  std::printf("publishing KV events on %s%s%s\n", publisher->endpoint().c_str(),
              publisher->replay_endpoint().empty() ? "" : ", replay on ",
              publisher->replay_endpoint().c_str());
  std::fflush(stdout);  // a router waiting on a pipe reads where to connect now
  std::this_thread::sleep_for(std::chrono::duration<double>(opt.kv_events_wait_s));
  return publisher;
}

// The metrics, and where they are served (null without --metrics-port).
struct Metrics {
  kvpage::MetricsRecorder recorder;
  std::unique_ptr<MetricsEndpoint> endpoint;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();

  double Now() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  void Publish(const kvpage::Scheduler& scheduler, const std::string& model) {
    if (endpoint != nullptr) endpoint->Set(kvpage::RenderPrometheus(recorder.Snapshot(scheduler), model));
  }
};

// Every request arrives at once; returns how many the scheduler refused.
int64_t AddRequests(const std::vector<kvpage::sim::TraceRequest>& trace,
                    kvpage::Scheduler& scheduler, Metrics& metrics) {
  int64_t skipped = 0;
  for (const kvpage::sim::TraceRequest& t : trace) {
    kvpage::RequestSpec spec;
    spec.id = kvpage::RequestId(t.index);
    spec.prompt_token_ids = kvpage::sim::PromptTokens(t);
    spec.max_new_tokens = t.output_len;
    spec.arrival_time = t.arrival_s;
    const int64_t prompt_len = static_cast<int64_t>(spec.prompt_token_ids.size());
    if (!scheduler.AddRequest(std::move(spec)).ok()) {
      ++skipped;  // longer than the model allows
      continue;
    }
    metrics.recorder.ObserveArrival(kvpage::RequestId(t.index), prompt_len, metrics.Now());
  }
  return skipped;
}

struct LoopStats {
  int64_t errors = 0, steps = 0, tokens = 0, finished = 0, peak_running = 0;
  double peak_usage = 0;
  std::map<std::string, int64_t> reasons;  // finished requests by FinishReasonName
  int64_t cached_tokens = 0;               // FinishedRequest::num_cached_tokens, summed
  std::map<int64_t, int64_t> outputs;      // tokens sampled so far, by request
};

void CountFinished(const kvpage::FinishedRequest& f, LoopStats& stats) {
  ++stats.finished;
  ++stats.reasons[std::string(kvpage::FinishReasonName(f.reason))];
  stats.cached_tokens += f.num_cached_tokens;
}

// The ends only the server sees, after a step's tokens are applied: a stop string the 4th
// output token completes, a client gone after the first (--stop-string-every,
// --client-gone-every). A request this update already finished (by length) is not found.
void EndByServer(const Options& opt, kvpage::Scheduler& scheduler,
                 const kvpage::SchedulerOutput& out, Metrics& metrics, LoopStats& stats) {
  for (const kvpage::ScheduledRequest& r : out.requests) {
    if (!r.samples) continue;
    const int64_t id = r.id.value, n = ++stats.outputs[id];
    std::optional<kvpage::FinishReason> reason;
    if (opt.client_gone_every > 0 && id % opt.client_gone_every == 0 && n == 1) {
      reason = kvpage::FinishReason::kAborted;
    } else if (opt.stop_string_every > 0 && id % opt.stop_string_every == 0 && n == 4) {
      reason = kvpage::FinishReason::kStop;
    }
    if (!reason.has_value()) continue;
    absl::StatusOr<kvpage::FinishedRequest> finished = scheduler.Finish(r.id, *reason);
    if (!finished.ok()) continue;
    metrics.recorder.ObserveFinish(*finished, metrics.Now());
    CountFinished(*finished, stats);
  }
}

// The fake forward pass: one random token per request that reached its last token.
void FakeForward(const kvpage::SchedulerOutput& out, std::mt19937& rng,
                 kvpage::ModelOutput& result) {
  result.sampled_token_ids.clear();
  result.sampled_offsets.assign(1, 0);
  for (const kvpage::ScheduledRequest& r : out.requests) {
    if (r.samples) result.sampled_token_ids.push_back(static_cast<int32_t>(rng() % 100000));
    result.sampled_offsets.push_back(static_cast<int32_t>(result.sampled_token_ids.size()));
  }
}

// One scheduled step and the tokens its (fake) forward pass sampled, until its Update.
struct Step {
  const kvpage::SchedulerOutput* out = nullptr;
  kvpage::ModelOutput result;
};

// Applies a step's tokens, publishes its metrics and KV events and counts it. False after a
// message when the update fails.
bool ApplyStep(const Options& opt, kvpage::Scheduler& scheduler, const Step& step,
               kvpage::KvEventPublisher* publisher, Metrics& metrics, LoopStats& stats) {
  const kvpage::SchedulerOutput& out = *step.out;
  auto update = scheduler.Update(out, step.result);
  if (!update.ok()) {
    std::fprintf(stderr, "server_loop: %s\n", std::string(update.status().message()).c_str());
    return false;
  }
  metrics.recorder.ObserveUpdate(out, step.result, *update, metrics.Now());
  metrics.Publish(scheduler, opt.model);
  if (publisher != nullptr) {  // never blocks: a slow router drops, the loop goes on
    const std::chrono::duration<double> now = std::chrono::system_clock::now().time_since_epoch();
    publisher->Publish(now.count(), scheduler.DrainKvEvents());
  }
  ++stats.steps;
  stats.tokens += out.total_num_scheduled_tokens;
  for (const kvpage::FinishedRequest& f : update->finished) CountFinished(f, stats);
  EndByServer(opt, scheduler, out, metrics, stats);
  stats.peak_running = std::max<int64_t>(stats.peak_running, out.num_rows);
  const double usage = scheduler.kv_cache().Usage().usage;
  stats.peak_usage = std::max(stats.peak_usage, usage);
  if (stats.steps % 100 == 0) {
    std::printf("step %6lld  running %3d  waiting %4d  tokens %5lld  kv usage %5.1f%%\n",
                static_cast<long long>(stats.steps), update->stats.num_running,
                update->stats.num_waiting, static_cast<long long>(out.total_num_scheduled_tokens),
                100 * usage);
  }
  return true;
}

// Steps until every request finished, checking each step and publishing its KV events. With
// async scheduling, step N + 1 is scheduled (and its forward pass run) before step N's update.
// Returns 0, or 1 after a message when a step cannot run or its update fails.
int RunLoop(const Options& opt, kvpage::Scheduler& scheduler,
            kvpage::KvEventPublisher* publisher, Metrics& metrics, LoopStats& stats) {
  std::mt19937 rng(opt.seed);
  Step steps[2];  // the step in flight and the next one (async)
  int latest = 0;
  Step* in_flight = nullptr;
  while (scheduler.HasUnfinishedRequests() || in_flight != nullptr) {
    Step* next = nullptr;
    if (scheduler.HasUnfinishedRequests()) {
      next = &steps[latest ^= 1];
      next->out = &scheduler.Schedule();
      if (next->out->requests.empty() && in_flight == nullptr) {
        std::fprintf(stderr, "server_loop: nothing can run (a request larger than the cache?)\n");
        return 1;
      }
      metrics.recorder.ObserveSchedule(*next->out, metrics.Now());
      stats.errors += CheckStep(*next->out);  // before the next Schedule: it reads the tables
      FakeForward(*next->out, rng, next->result);
    }
    Step* apply = opt.async_scheduling ? in_flight : next;
    if (apply != nullptr && !ApplyStep(opt, scheduler, *apply, publisher, metrics, stats)) return 1;
    in_flight = opt.async_scheduling ? next : nullptr;
  }
  return 0;
}

void PrintSummary(const Options& opt, const kvpage::Scheduler& scheduler, const LoopStats& s,
                  int64_t skipped) {
  const kvpage::SchedulerStats& stats = scheduler.stats();
  std::printf("\n%s, %lld requests (%lld longer than max_model_len %lld skipped), KV budget %lld MiB\n",
              opt.model.c_str(), static_cast<long long>(s.finished), static_cast<long long>(skipped),
              static_cast<long long>(scheduler.max_model_len()),
              static_cast<long long>(opt.kv_budget_mib));
  std::printf("steps %lld, tokens %lld (%.1f per step), peak running %lld, peak KV usage %.1f%%\n",
              static_cast<long long>(s.steps), static_cast<long long>(s.tokens),
              s.steps > 0 ? static_cast<double>(s.tokens) / s.steps : 0.0,
              static_cast<long long>(s.peak_running), 100 * s.peak_usage);
  std::printf("preemptions %lld, prefix-cache hits %lld of %lld prompt tokens\n",
              static_cast<long long>(stats.preemptions), static_cast<long long>(stats.prefix_hit_tokens),
              static_cast<long long>(stats.admitted_prompt_tokens));
  std::printf("finish reasons:");
  for (const auto& [reason, count] : s.reasons) {
    std::printf(" %s %lld", reason.c_str(), static_cast<long long>(count));
  }
  std::printf("; cached tokens reported %lld\n", static_cast<long long>(s.cached_tokens));
  std::printf("invalid table rows or slots: %lld\n", static_cast<long long>(s.errors));
}

// Flushes what is queued, reports the publisher's counts, lingers, and shuts it down.
void StopPublisher(const Options& opt, kvpage::KvEventPublisher& publisher) {
  publisher.Flush(absl::Seconds(10));
  const kvpage::KvEventPublisherStats ev = publisher.stats();
  std::printf("KV events: %lld batches (%lld bytes) published, %lld dropped\n",
              static_cast<long long>(ev.published_batches),
              static_cast<long long>(ev.published_bytes),
              static_cast<long long>(ev.dropped_batches));
  std::fflush(stdout);
  std::this_thread::sleep_for(std::chrono::duration<double>(opt.kv_events_linger_s));
  publisher.Shutdown();
}

// With --metrics-port: the endpoint, announced on stdout. False after a message when the
// port cannot be bound.
bool StartMetrics(const Options& opt, Metrics& metrics) {
  if (!opt.metrics_port.has_value()) return true;
  auto endpoint = MetricsEndpoint::Start(*opt.metrics_port);
  if (!endpoint.ok()) {
    std::fprintf(stderr, "server_loop: %s\n", std::string(endpoint.status().message()).c_str());
    return false;
  }
  metrics.endpoint = *std::move(endpoint);
  std::printf("serving metrics on http://127.0.0.1:%d/metrics\n", metrics.endpoint->port());
  std::fflush(stdout);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  if (!ParseArgs(argc, argv, &opt)) return 2;
  kvpage::ModelSpec model;
  std::vector<kvpage::sim::TraceRequest> trace;
  if (!LoadInputs(opt, &model, &trace)) return 2;
  auto created = kvpage::Scheduler::Create(model, MakeConfig(opt));
  if (!created.ok()) {
    std::fprintf(stderr, "server_loop: %s\n", std::string(created.status().message()).c_str());
    return 2;
  }
  kvpage::Scheduler& scheduler = **created;
  auto started = StartPublisher(opt, scheduler);
  if (!started.ok()) {
    std::fprintf(stderr, "server_loop: %s\n", std::string(started.status().message()).c_str());
    return 2;
  }
  std::unique_ptr<kvpage::KvEventPublisher> publisher = *std::move(started);
  Metrics metrics;
  if (!StartMetrics(opt, metrics)) return 2;
  const int64_t skipped = AddRequests(trace, scheduler, metrics);
  LoopStats stats;
  if (int rc = RunLoop(opt, scheduler, publisher.get(), metrics, stats); rc != 0) return rc;
  PrintSummary(opt, scheduler, stats, skipped);
  if (publisher != nullptr) StopPublisher(opt, *publisher);
  if (metrics.endpoint != nullptr) {
    metrics.Publish(scheduler, opt.model);
    std::printf("final metrics served for %.0f s\n", opt.metrics_linger_s);
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::duration<double>(opt.metrics_linger_s));
  }
  if (scheduler.kv_cache().Usage().used_bytes != 0) {
    std::printf("blocks still held after every request finished\n");
    return 1;
  }
  return stats.errors == 0 ? 0 : 1;
}
