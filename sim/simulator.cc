// The event loop of `kvpage sim` (see simulator.h and docs/simulator.md, "Event loop").
#include "sim/simulator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "internal/status_macros.h"
#include "nlohmann/json.hpp"
#include "sim/calibrated_cost_model.h"
#include "sim/random.h"
#include "spdlog/spdlog.h"

namespace kvpage::sim {
namespace {

// Per trace request: where it is in its life, and its record while it is live.
struct Live {
  RequestRecord record;
  int32_t generated = 0;     // output tokens sampled so far
  bool first_scheduled = false;
  bool finished = false;
};

// The sampled token for output position `pos` of request `index`: no allocation, no state.
int32_t SampledToken(uint64_t seed, int64_t index, int32_t pos, int32_t vocab) {
  const uint64_t h = SplitMix64Finalize(seed ^ SplitMix64Finalize(
                                                   static_cast<uint64_t>(index) * kSplitMix64Gamma +
                                                   static_cast<uint64_t>(pos)));
  return static_cast<int32_t>(h % static_cast<uint64_t>(vocab));
}

// Pools of the manager, for usage reporting. kvpage mode has one pool per group; vLLM mode one
// block-id space that every group shares (manager_layout.cc), reported once.
struct PoolView {
  std::vector<std::string> names;
  std::vector<int32_t> first_group;  // PoolUsage index standing for the pool
};

PoolView MakePoolView(const KvCacheManager& kv) {
  PoolView v;
  const KvCacheUsage u = kv.Usage();
  if (kv.config().mode == AccountingMode::kVllm) {
    v.names.push_back("shared");
    v.first_group.push_back(0);
    return v;
  }
  for (size_t i = 0; i < u.pools.size(); ++i) {
    v.names.push_back(absl::StrCat("g", u.pools[i].group.value, "_",
                                   LayerKindName(u.pools[i].kind)));
    v.first_group.push_back(static_cast<int32_t>(i));
  }
  return v;
}

class Loop {
 public:
  Loop(const std::vector<TraceRequest>& trace, const SimConfig& config, const CostModel& cost,
       Scheduler& scheduler)
      : trace_(trace), config_(config), cost_(cost), sched_(scheduler), live_(trace.size()) {}

  absl::Status Run(SimResult& result);

 private:
  // Adds every request that has arrived by `t_`.
  absl::Status AddArrivals(SimResult& result);
  // Prices, samples, and applies one non-empty step.
  absl::Status RunStep(const SchedulerOutput& out, SimResult& result);
  absl::Status NeverRuns() const;
  void RecordUsage(const SchedulerOutput& out, double dt, SimResult& result);
  void Report() const;

  const std::vector<TraceRequest>& trace_;
  const SimConfig& config_;
  const CostModel& cost_;
  Scheduler& sched_;
  std::vector<Live> live_;
  PoolView pools_;
  size_t next_ = 0;     // next trace request to arrive
  double t_ = 0;        // virtual clock, seconds
  int64_t done_ = 0;    // finished or dropped
  StepShape shape_;     // reused every step
  ModelOutput model_out_;
  std::vector<double> usage_;       // per step: total, then pools
  std::vector<double> usage_peak_;
  std::vector<double> usage_time_;  // Σ usage · duration
  double busy_s_ = 0;               // Σ step durations
};

absl::Status Loop::AddArrivals(SimResult& result) {
  while (next_ < trace_.size() && trace_[next_].arrival_s <= t_) {
    const TraceRequest& tr = trace_[next_];
    Live& l = live_[next_];
    l.record.index = tr.index;
    l.record.arrival_s = tr.arrival_s;
    l.record.prompt_len = tr.prompt_len;
    // A prompt that leaves no room for an output token is refused (OutOfRange) before its
    // tokens are built: a trace row may describe 2^31 - 1 of them (8 GiB of ids).
    absl::Status s = absl::OutOfRangeError("prompt too long for max_model_len");
    if (tr.prompt_len < sched_.max_model_len()) {
      if (config_.record_token_times) l.record.token_times_s.reserve(tr.output_len);
      RequestSpec spec;
      spec.id = RequestId(static_cast<int64_t>(next_));
      spec.prompt_token_ids = PromptTokens(tr);
      spec.max_new_tokens = tr.output_len;
      spec.arrival_time = tr.arrival_s;
      s = sched_.AddRequest(std::move(spec));
    }
    if (absl::IsOutOfRange(s)) {
      // Too long for max_model_len: vLLM rejects such a request; count it and go on.
      ++result.dropped_requests;
      ++done_;
      l.finished = true;
      l.record.token_times_s = {};
    } else if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat("request ", tr.index, ": ", s.message()));
    } else {
      result.prefix_cache.queried_tokens += tr.prompt_len;
    }
    ++next_;
  }
  return absl::OkStatus();
}

absl::Status Loop::NeverRuns() const {
  // Nothing runs and nothing was preempted, yet nothing was scheduled: the request at the
  // head of the queue does not fit in an empty cache. FCFS (and equal priorities) admit in
  // trace order, so that is the earliest live request.
  for (size_t i = 0; i < next_; ++i) {
    if (live_[i].finished) continue;
    const TraceRequest& tr = trace_[i];
    return absl::ResourceExhaustedError(absl::StrCat(
        "request ", tr.index, " (", tr.prompt_len, " prompt tokens, ", tr.output_len,
        " output tokens) can never be scheduled: the KV budget of ",
        sched_.kv_cache().config().kv_budget_bytes,
        " bytes cannot hold its prompt even with nothing else running"));
  }
  return absl::InternalError("the scheduler scheduled nothing with no waiting request");
}

void Loop::RecordUsage(const SchedulerOutput& out, double dt, SimResult& result) {
  const KvCacheUsage u = sched_.kv_cache().Usage();
  usage_.clear();
  usage_.push_back(u.usage);
  for (int32_t g : pools_.first_group) {
    const PoolUsage& p = u.pools[g];
    usage_.push_back(u.budget_bytes > 0
                         ? static_cast<double>(int64_t{p.used_blocks} * p.block_bytes) /
                               static_cast<double>(u.budget_bytes)
                         : 0.0);
  }
  usage_.push_back(u.budget_bytes > 0 ? static_cast<double>(u.mapped_bytes) /
                                           static_cast<double>(u.budget_bytes)
                                     : 0.0);
  for (size_t i = 0; i < usage_.size(); ++i) {
    usage_peak_[i] = std::max(usage_peak_[i], usage_[i]);
    usage_time_[i] += usage_[i] * dt;
  }
  busy_s_ += dt;
  if (config_.record_steps) {
    StepRecord s;
    s.time_s = t_;
    s.duration_s = dt;
    s.num_running = out.num_rows;
    s.num_waiting = sched_.num_waiting();
    s.num_scheduled_tokens = out.total_num_scheduled_tokens;
    s.num_preemptions = static_cast<int32_t>(out.preempted_ids.size());
    s.kv_usage.assign(usage_.begin() + 1, usage_.end() - 1);  // pools only
    result.steps.push_back(std::move(s));
  }
}

absl::Status Loop::RunStep(const SchedulerOutput& out, SimResult& result) {
  shape_.requests.resize(out.requests.size());
  model_out_.sampled_token_ids.clear();
  model_out_.sampled_offsets.assign(1, 0);
  for (size_t i = 0; i < out.requests.size(); ++i) {
    const kvpage::ScheduledRequest& r = out.requests[i];
    shape_.requests[i] = {r.num_computed_tokens, r.num_scheduled_tokens};
    Live& l = live_[static_cast<size_t>(r.id.value)];
    if (r.is_new && !r.resumed && !l.first_scheduled) {
      l.first_scheduled = true;
      l.record.hit_tokens = r.num_computed_tokens;
      result.prefix_cache.hit_tokens += r.num_computed_tokens;
    }
    if (r.samples) {
      model_out_.sampled_token_ids.push_back(
          SampledToken(config_.seed, r.id.value, l.generated, config_.vocab_size));
    }
    model_out_.sampled_offsets.push_back(
        static_cast<int32_t>(model_out_.sampled_token_ids.size()));
  }
  const double dt = cost_.StepTime(shape_);
  RecordUsage(out, dt, result);
  result.max_concurrency = std::max(result.max_concurrency, out.num_rows);
  ++result.num_steps;
  t_ += dt;

  for (const kvpage::ScheduledRequest& r : out.requests) {
    if (!r.samples) continue;
    Live& l = live_[static_cast<size_t>(r.id.value)];
    if (l.generated == 0) l.record.first_token_s = t_;
    ++l.generated;
    if (config_.record_token_times) l.record.token_times_s.push_back(t_);
  }
  absl::StatusOr<UpdateResult> update = sched_.Update(out, model_out_);
  if (!update.ok()) {
    return absl::InternalError(
        absl::StrCat("scheduler rejected step ", out.step, ": ", update.status().message()));
  }
  for (const FinishedRequest& f : update->finished) {
    Live& l = live_[static_cast<size_t>(f.id.value)];
    l.finished = true;
    l.record.finish_s = t_;
    l.record.output_len = f.num_output_tokens;
    if (f.reason == FinishReason::kMaxModelLen) ++result.truncated_requests;
    ++done_;
  }
  if (config_.check_invariants) {
    KVPAGE_RETURN_IF_ERROR(sched_.CheckInvariants());
  }
  return absl::OkStatus();
}

void Loop::Report() const {
  if (config_.progress) {
    config_.progress(SimProgress{done_, static_cast<int64_t>(trace_.size()), t_});
  }
}

absl::Status Loop::Run(SimResult& result) {
  pools_ = MakePoolView(sched_.kv_cache());
  result.pool_names = pools_.names;
  // total, pools, mapped
  usage_peak_.assign(pools_.names.size() + 2, 0.0);
  usage_time_.assign(pools_.names.size() + 2, 0.0);
  int32_t empty_steps = 0;
  while (true) {
    KVPAGE_RETURN_IF_ERROR(AddArrivals(result));
    if (!sched_.HasUnfinishedRequests()) {
      if (next_ == trace_.size()) break;
      t_ = std::max(t_, trace_[next_].arrival_s);
      continue;
    }
    const SchedulerOutput& out = sched_.Schedule();
    for (RequestId id : out.preempted_ids) {
      ++live_[static_cast<size_t>(id.value)].record.num_preemptions;
      ++result.preemptions;
    }
    if (out.requests.empty()) {
      // A step that preempted everything it ran schedules nothing; the next one admits again.
      // Without preemptions and with nothing running, nothing will ever change.
      if ((out.preempted_ids.empty() && sched_.num_running() == 0) || ++empty_steps > 2) {
        return NeverRuns();
      }
      continue;
    }
    empty_steps = 0;
    KVPAGE_RETURN_IF_ERROR(RunStep(out, result));
    if (config_.progress && result.num_steps % config_.progress_interval_steps == 0) {
      Report();
    }
  }
  Report();

  result.simulated_seconds = t_;
  auto stats = [&](size_t i, std::string name) {
    return PoolUsageStats{std::move(name), usage_peak_[i],
                          busy_s_ > 0 ? usage_time_[i] / busy_s_ : 0.0};
  };
  result.kv_usage.push_back(stats(0, "total"));
  for (size_t i = 0; i < pools_.names.size(); ++i) {
    result.kv_usage.push_back(stats(i + 1, pools_.names[i]));
  }
  result.kv_mapped = stats(usage_peak_.size() - 1, "mapped");
  for (Live& l : live_) {
    if (l.record.output_len > 0) result.requests.push_back(std::move(l.record));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status SimConfig::Validate() const {
  if (vocab_size < 2) {
    return absl::InvalidArgumentError(absl::StrCat("vocab_size must be >= 2, got ", vocab_size));
  }
  if (model.vocab_size > 0 && vocab_size > model.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("vocab_size ", vocab_size,
                                                   " exceeds the model's vocab_size ",
                                                   model.vocab_size));
  }
  if (progress_interval_steps < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("progress_interval_steps must be >= 1, got ", progress_interval_steps));
  }
  if (cost_model == nullptr) KVPAGE_RETURN_IF_ERROR(cost.Validate());
  return absl::OkStatus();
}

absl::StatusOr<SimResult> Simulate(const std::vector<TraceRequest>& trace,
                                   const SimConfig& config) {
  const auto wall_start = std::chrono::steady_clock::now();
  KVPAGE_RETURN_IF_ERROR(config.Validate());
  for (size_t i = 0; i < trace.size(); ++i) {
    // A NaN compares false with everything: it would pass the order check below.
    if (!std::isfinite(trace[i].arrival_s)) {
      return absl::InvalidArgumentError(absl::StrCat("trace request ", trace[i].index,
                                                     " arrives at ", trace[i].arrival_s,
                                                     " s: arrival times must be finite"));
    }
    if (i > 0 && trace[i].arrival_s < trace[i - 1].arrival_s) {
      return absl::InvalidArgumentError(absl::StrCat(
          "trace arrivals must not decrease: request ", trace[i].index, " arrives at ",
          trace[i].arrival_s, " s, before request ", trace[i - 1].index, " at ",
          trace[i - 1].arrival_s, " s"));
    }
  }
  std::unique_ptr<CostModel> owned_cost;
  const CostModel* cost = config.cost_model;
  if (cost == nullptr && config.calibration.has_value()) {
    KVPAGE_ASSIGN_OR_RETURN(owned_cost, CalibratedCostModel::Create(config.model, config.gpu,
                                                                    *config.calibration,
                                                                    config.cost));
    cost = owned_cost.get();
  } else if (cost == nullptr) {
    KVPAGE_ASSIGN_OR_RETURN(owned_cost,
                            CreateDefaultCostModel(config.model, config.gpu, config.cost));
    cost = owned_cost.get();
  }
  SchedulerConfig sc = config.scheduler;
  if (!sc.kv.hash_seed.has_value()) sc.kv.hash_seed = config.seed;
  KVPAGE_ASSIGN_OR_RETURN(std::unique_ptr<Scheduler> scheduler,
                          Scheduler::Create(config.model, sc));

  SimResult result;
  const KvCacheManager& kv = scheduler->kv_cache();
  result.kv_budget_bytes = kv.config().kv_budget_bytes;
  result.block_size = kv.group_block_size(GroupId(0));
  // The length in effect: the scheduler lowers the model's when the KV budget cannot hold it.
  result.max_model_len = scheduler->max_model_len();
  Loop loop(trace, config, *cost, *scheduler);
  KVPAGE_RETURN_IF_ERROR(loop.Run(result));

  const PrefixCacheStats stats = kv.prefix_cache_stats();
  result.manager_queried_tokens = stats.queried_tokens;
  result.manager_hit_tokens = stats.hit_tokens;
  if (result.prefix_cache.queried_tokens > 0) {
    result.prefix_cache.hit_rate = static_cast<double>(result.prefix_cache.hit_tokens) /
                                   static_cast<double>(result.prefix_cache.queried_tokens);
  }
  if (result.dropped_requests > 0) {
    spdlog::debug("kvpage sim: dropped {} request(s) longer than max_model_len {}",
                 result.dropped_requests, result.max_model_len);
  }
  KVPAGE_ASSIGN_OR_RETURN(result.summary, Summarize(result.requests));
  result.wall_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  return result;
}

std::string SimResultToJson(const SimResult& r) {
  using ojson = nlohmann::ordered_json;
  ojson j = ojson::parse(SummaryToJson(r.summary));
  j["preemptions"] = r.preemptions;
  j["prefix_cache"] = ojson{{"queried_tokens", r.prefix_cache.queried_tokens},
                            {"hit_tokens", r.prefix_cache.hit_tokens},
                            {"hit_rate", r.prefix_cache.hit_rate}};
  ojson usage = ojson::object();
  for (const PoolUsageStats& p : r.kv_usage) {
    usage[p.name] = ojson{{"peak", p.peak}, {"mean", p.mean}};
  }
  j["kv_usage"] = std::move(usage);
  j["kv_mapped"] = ojson{{"peak", r.kv_mapped.peak}, {"mean", r.kv_mapped.mean}};
  j["max_concurrency"] = r.max_concurrency;
  j["num_steps"] = r.num_steps;
  j["dropped_requests"] = r.dropped_requests;
  j["truncated_requests"] = r.truncated_requests;
  j["kv_budget_bytes"] = r.kv_budget_bytes;
  j["block_size"] = r.block_size;
  j["max_model_len"] = r.max_model_len;
  j["simulated_seconds"] = r.simulated_seconds;
  j["wall_seconds"] = r.wall_seconds;
  return j.dump(2) + "\n";
}

}  // namespace kvpage::sim
