// One replica's half-steps (see replica.h and docs/simulator.md, "Event loop").
#include "sim/replica.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "internal/status_macros.h"
#include "sim/calibrated_cost_model.h"
#include "sim/random.h"

namespace kvpage::sim {
namespace {

// Token times reserved up front per request; more grow with the tokens generated.
constexpr int64_t kTokenTimesReserve = 4096;

// The sampled token for output position `pos` of request `index`: no allocation, no state.
int32_t SampledToken(uint64_t seed, int64_t index, int32_t pos, int32_t vocab) {
  const uint64_t h = SplitMix64Finalize(seed ^ SplitMix64Finalize(
                                                   static_cast<uint64_t>(index) * kSplitMix64Gamma +
                                                   static_cast<uint64_t>(pos)));
  return static_cast<int32_t>(h % static_cast<uint64_t>(vocab));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Replica>> Replica::Create(const std::vector<TraceRequest>& trace,
                                                         const SimConfig& config,
                                                         const CostModel& cost) {
  SchedulerConfig sc = config.scheduler;
  if (!sc.kv.hash_seed.has_value()) sc.kv.hash_seed = config.seed;
  KVPAGE_ASSIGN_OR_RETURN(std::unique_ptr<Scheduler> scheduler,
                          Scheduler::Create(config.model, sc));
  if (scheduler->max_model_len() > kMaxRequestTokens) {  // the model's own length
    return MaxModelLenError(scheduler->max_model_len());
  }
  return std::unique_ptr<Replica>(new Replica(trace, config, cost, std::move(scheduler)));
}

Replica::Replica(const std::vector<TraceRequest>& trace, const SimConfig& config,
                 const CostModel& cost, std::unique_ptr<Scheduler> scheduler)
    : trace_(trace), config_(config), cost_(cost), sched_(std::move(scheduler)) {
  const KvCacheManager& kv = sched_->kv_cache();
  result_.kv_budget_bytes = kv.config().kv_budget_bytes;
  result_.block_size = kv.group_block_size(GroupId(0));
  // The length in effect: the scheduler lowers the model's when the KV budget cannot hold it.
  result_.max_model_len = sched_->max_model_len();
  // Pools, for usage reporting. kvpage mode has one pool per group; vLLM mode one block-id
  // space that every group shares (manager_layout.cc), reported once.
  const KvCacheUsage u = kv.Usage();
  if (kv.config().mode == AccountingMode::kVllm) {
    pool_names_.push_back("shared");
    pool_first_group_.push_back(0);
  } else {
    for (size_t i = 0; i < u.pools.size(); ++i) {
      pool_names_.push_back(absl::StrCat("g", u.pools[i].group.value, "_",
                                         LayerKindName(u.pools[i].kind)));
      pool_first_group_.push_back(static_cast<int32_t>(i));
    }
  }
  result_.pool_names = pool_names_;
  if (kv.config().host_cache.budget_bytes > 0) {
    // Usage lists every group, each with its pool's block bytes: what one copy moves.
    std::vector<int64_t> group_block_bytes;
    for (const PoolUsage& p : u.pools) group_block_bytes.push_back(p.block_bytes);
    link_.emplace(std::move(group_block_bytes), config_.pcie_gbps * 1e9);
  }
  // total, pools, mapped
  usage_peak_.assign(pool_names_.size() + 2, 0.0);
  usage_time_.assign(pool_names_.size() + 2, 0.0);
  waiting_window_ = kv.config().host_cache.budget_bytes > 0
                        ? std::numeric_limits<int64_t>::max()
                        : int64_t{sched_->config().max_num_seqs} + 1;
}

void Replica::Enqueue(size_t pos) {
  const TraceRequest& tr = trace_[pos];
  // Idle, or waiting for host-tier copies with nothing to run: the clock moves to the arrival.
  if (step_ == nullptr && pending_.empty() &&
      (!HasUnfinished() || (link_.has_value() && !link_->empty()))) {
    t_ = std::max(t_, tr.arrival_s);
  }
  outstanding_tokens_ += int64_t{tr.prompt_len} + tr.output_len;
  pending_.push_back(pos);
}

double Replica::next_event_s() const {
  if (step_ != nullptr) return step_end_;
  if (!pending_.empty()) return t_;
  if (link_.has_value() && !link_->empty()) return std::max(t_, link_->next_done_s());
  return std::numeric_limits<double>::infinity();
}

absl::Status Replica::Advance() {
  if (step_ != nullptr) {
    KVPAGE_RETURN_IF_ERROR(FinishStep());
  } else if (pending_.empty() && link_.has_value() && !link_->empty()) {
    t_ = std::max(t_, link_->next_done_s());  // woken by the link
  }
  return BeginStep();
}

absl::Status Replica::AddPending() {
  for (; !pending_.empty(); pending_.pop_front()) {
    const size_t pos = pending_.front();
    const TraceRequest& tr = trace_[pos];
    local_of_[static_cast<int64_t>(pos)] = static_cast<int32_t>(live_.size());
    Live& l = live_.emplace_back();
    l.record.index = tr.index;
    l.record.arrival_s = tr.arrival_s;
    l.record.prompt_len = tr.prompt_len;
    l.max_new_tokens = tr.output_len;
    if (tr.prompt_len >= sched_->max_model_len()) {
      // No room for an output token: vLLM rejects such a request (the scheduler's
      // OutOfRange); it is counted and its tokens are never built.
      Drop(l);
      continue;
    }
    // Room for the tokens the request can produce, not for what the row claims (2^31 − 1
    // outputs would reserve 16 GiB): past that the times grow with the tokens generated.
    if (config_.record_token_times) {
      l.record.token_times_s.reserve(static_cast<size_t>(std::min<int64_t>(
          {tr.output_len, sched_->max_model_len() - tr.prompt_len, kTokenTimesReserve})));
    }
    held_.push_back(pos);
  }
  return FeedScheduler();
}

absl::Status Replica::FeedScheduler() {
  for (; !held_.empty() && sched_->num_waiting() < waiting_window_; held_.pop_front()) {
    const size_t pos = held_.front();
    const TraceRequest& tr = trace_[pos];
    const RequestId id(static_cast<int64_t>(pos));
    RequestSpec spec;
    spec.id = id;
    spec.prompt_token_ids = PromptTokens(tr);
    spec.max_new_tokens = tr.output_len;
    spec.arrival_time = tr.arrival_s;
    const absl::Status s = sched_->AddRequest(std::move(spec));
    if (absl::IsOutOfRange(s)) {
      Drop(LiveOf(id));
    } else if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat("request ", tr.index, ": ", s.message()));
    } else {
      result_.prefix_cache.queried_tokens += tr.prompt_len;
    }
  }
  return absl::OkStatus();
}

void Replica::Drop(Live& l) {
  ++result_.dropped_requests;
  ++done_;
  l.finished = true;
  outstanding_tokens_ -= int64_t{l.record.prompt_len} + l.max_new_tokens;
}

absl::Status Replica::NeverRuns() const {
  // Nothing runs and nothing was preempted, yet nothing was scheduled: the request at the
  // head of the queue does not fit in an empty cache. FCFS (and equal priorities) admit in
  // trace order, so that is the earliest live request.
  for (const Live& l : live_) {
    if (l.finished) continue;
    return absl::ResourceExhaustedError(absl::StrCat(
        "request ", l.record.index, " (", l.record.prompt_len, " prompt tokens, ",
        l.max_new_tokens, " output tokens) can never be scheduled: the KV budget of ",
        sched_->kv_cache().config().kv_budget_bytes,
        " bytes cannot hold its prompt even with nothing else running"));
  }
  return absl::InternalError("the scheduler scheduled nothing with no waiting request");
}

absl::Status Replica::BeginStep() {
  KVPAGE_RETURN_IF_ERROR(CompleteTransfers());
  int32_t empty_steps = 0;
  while (true) {
    KVPAGE_RETURN_IF_ERROR(AddPending());
    if (!HasUnfinished()) return absl::OkStatus();  // idle
    const SchedulerOutput& out = sched_->Schedule();
    for (RequestId id : out.preempted_ids) {
      ++LiveOf(id).record.num_preemptions;
      ++result_.preemptions;
    }
    const double wait_s = QueueTransfers(out);
    if (!out.requests.empty()) {
      PriceStep(out, wait_s);
      return absl::OkStatus();
    }
    // Requests loading from the host tier, or memory held by saves: the link's next
    // completion changes what can run.
    if (link_.has_value() && !link_->empty()) return WaitForLink(out);
    // A step that preempted everything it ran schedules nothing; the next one admits again.
    // Without preemptions and with nothing running, nothing will ever change.
    if ((out.preempted_ids.empty() && sched_->num_running() == 0) || ++empty_steps > 2) {
      return NeverRuns();
    }
  }
}

absl::Status Replica::CompleteTransfers() {
  if (!link_.has_value()) return absl::OkStatus();
  for (uint64_t id : link_->TakeDone(t_)) {
    if (absl::Status s = sched_->CompleteTransfers(id); !s.ok()) {
      return absl::InternalError(
          absl::StrCat("scheduler rejected host-tier transfer ", id, ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

double Replica::QueueTransfers(const SchedulerOutput& out) {
  if (!link_.has_value() || out.transfers.id == 0) return 0;
  const double saves_end = link_->Queue(out.transfers, t_);
  // Write-back saves read blocks this step's forward pass may overwrite: it waits for them.
  // Write-through saves read pinned blocks, and loads fill blocks no step reads yet.
  const bool forward_waits =
      sched_->kv_cache().config().host_cache.policy == HostTierPolicy::kWriteBack;
  return forward_waits && !out.requests.empty() ? saves_end - t_ : 0;
}

absl::Status Replica::WaitForLink(const SchedulerOutput& out) {
  absl::StatusOr<UpdateResult> update = sched_->Update(out, ModelOutput{});
  if (!update.ok()) {
    return absl::InternalError(absl::StrCat("scheduler rejected empty step ", out.step, ": ",
                                            update.status().message()));
  }
  if (config_.check_invariants) KVPAGE_RETURN_IF_ERROR(sched_->CheckInvariants());
  return absl::OkStatus();
}

void Replica::PriceStep(const SchedulerOutput& out, double wait_s) {
  shape_.requests.resize(out.requests.size());
  model_out_.sampled_token_ids.clear();
  model_out_.sampled_offsets.assign(1, 0);
  for (size_t i = 0; i < out.requests.size(); ++i) {
    const kvpage::ScheduledRequest& r = out.requests[i];
    shape_.requests[i] = {r.num_computed_tokens, r.num_scheduled_tokens};
    Live& l = LiveOf(r.id);
    if (r.is_new && !r.resumed && !l.first_scheduled) {
      l.first_scheduled = true;
      l.record.hit_tokens = r.num_computed_tokens;
      result_.prefix_cache.hit_tokens += r.num_computed_tokens;
    }
    const int32_t prefilled = static_cast<int32_t>(std::min<int64_t>(
        l.record.prompt_len, r.num_computed_tokens + r.num_scheduled_tokens));
    outstanding_tokens_ -= prefilled - l.prefilled;
    l.prefilled = prefilled;
    if (r.samples) {
      model_out_.sampled_token_ids.push_back(
          SampledToken(config_.seed, r.id.value, l.generated, config_.vocab_size));
    }
    model_out_.sampled_offsets.push_back(
        static_cast<int32_t>(model_out_.sampled_token_ids.size()));
  }
  const double dt = cost_.StepTime(shape_) + wait_s;
  save_wait_s_ += wait_s;
  RecordUsage(out, dt);
  result_.max_concurrency = std::max(result_.max_concurrency, out.num_rows);
  ++result_.num_steps;
  step_ = &out;
  step_end_ = t_ + dt;
}

void Replica::RecordUsage(const SchedulerOutput& out, double dt) {
  const KvCacheUsage u = sched_->kv_cache().Usage();
  usage_.clear();
  usage_.push_back(u.usage);
  for (int32_t g : pool_first_group_) {
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
    s.num_waiting = sched_->num_waiting() + static_cast<int32_t>(held_.size());
    s.num_scheduled_tokens = out.total_num_scheduled_tokens;
    s.num_preemptions = static_cast<int32_t>(out.preempted_ids.size());
    s.kv_usage.assign(usage_.begin() + 1, usage_.end() - 1);  // pools only
    result_.steps.push_back(std::move(s));
  }
}

absl::Status Replica::FinishStep() {
  const SchedulerOutput& out = *step_;
  step_ = nullptr;
  t_ = step_end_;
  for (const kvpage::ScheduledRequest& r : out.requests) {
    if (!r.samples) continue;
    Live& l = LiveOf(r.id);
    if (l.generated == 0) l.record.first_token_s = t_;
    ++l.generated;
    --outstanding_tokens_;
    if (config_.record_token_times) l.record.token_times_s.push_back(t_);
  }
  absl::StatusOr<UpdateResult> update = sched_->Update(out, model_out_);
  if (!update.ok()) {
    return absl::InternalError(
        absl::StrCat("scheduler rejected step ", out.step, ": ", update.status().message()));
  }
  for (const FinishedRequest& f : update->finished) {
    Live& l = LiveOf(f.id);
    l.finished = true;
    l.record.finish_s = t_;
    l.record.output_len = f.num_output_tokens;
    outstanding_tokens_ -= int64_t{l.record.prompt_len} - l.prefilled;
    outstanding_tokens_ -= int64_t{l.max_new_tokens} - l.generated;
    if (f.reason == FinishReason::kMaxModelLen) ++result_.truncated_requests;
    ++done_;
  }
  if (config_.check_invariants) KVPAGE_RETURN_IF_ERROR(sched_->CheckInvariants());
  return absl::OkStatus();
}

absl::StatusOr<SimResult> Replica::TakeResult() {
  SimResult result = std::move(result_);
  result.simulated_seconds = t_;
  auto stats = [&](size_t i, std::string name) {
    return PoolUsageStats{std::move(name), usage_peak_[i],
                          busy_s_ > 0 ? usage_time_[i] / busy_s_ : 0.0};
  };
  result.kv_usage.push_back(stats(0, "total"));
  for (size_t i = 0; i < pool_names_.size(); ++i) {
    result.kv_usage.push_back(stats(i + 1, pool_names_[i]));
  }
  result.kv_mapped = stats(usage_peak_.size() - 1, "mapped");
  for (Live& l : live_) {
    if (l.record.output_len > 0) result.requests.push_back(std::move(l.record));
  }
  const PrefixCacheStats stats_now = sched_->kv_cache().prefix_cache_stats();
  result.manager_queried_tokens = stats_now.queried_tokens;
  result.manager_hit_tokens = stats_now.hit_tokens;
  if (link_.has_value()) result.host_tier = HostTierResult();
  if (result.prefix_cache.queried_tokens > 0) {
    result.prefix_cache.hit_rate = static_cast<double>(result.prefix_cache.hit_tokens) /
                                   static_cast<double>(result.prefix_cache.queried_tokens);
  }
  KVPAGE_ASSIGN_OR_RETURN(result.summary, Summarize(result.requests));
  return result;
}

SimHostTier Replica::HostTierResult() const {
  const KvCacheManager& kv = sched_->kv_cache();
  SimHostTier h;
  h.budget_bytes = kv.config().host_cache.budget_bytes;
  h.policy = kv.config().host_cache.policy;
  h.pcie_gbps = config_.pcie_gbps;
  h.host_hit_tokens = sched_->stats().host_hit_tokens;
  h.device_hit_tokens = sched_->stats().prefix_hit_tokens - h.host_hit_tokens;
  h.stats = kv.host_cache_stats();
  if (t_ > 0) h.bytes_per_s = static_cast<double>(h.stats.saved_bytes + h.stats.loaded_bytes) / t_;
  h.link_busy_s = link_->busy_s();
  h.save_wait_s = save_wait_s_;
  return h;
}

absl::Status ValidateRun(const std::vector<TraceRequest>& trace, const SimConfig& config) {
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
  return absl::OkStatus();
}

absl::StatusOr<const CostModel*> ResolveCostModel(const SimConfig& config,
                                                  std::unique_ptr<CostModel>* owned) {
  if (config.cost_model != nullptr) return config.cost_model;
  if (config.calibration.has_value()) {
    KVPAGE_ASSIGN_OR_RETURN(*owned, CalibratedCostModel::Create(config.model, config.gpu,
                                                                *config.calibration,
                                                                config.cost));
  } else {
    KVPAGE_ASSIGN_OR_RETURN(*owned,
                            CreateDefaultCostModel(config.model, config.gpu, config.cost));
  }
  return owned->get();
}

absl::Status RunOnOneClock(
    const std::vector<TraceRequest>& trace, absl::Span<Replica* const> replicas,
    const SimConfig& config, bool name_replicas,
    const std::function<int32_t(size_t pos, absl::Span<const int32_t> prompt)>& route,
    const std::function<absl::Status(int32_t replica)>& after_advance) {
  const auto named = [&](int32_t r, const absl::Status& s) {
    if (!name_replicas) return s;
    return absl::Status(s.code(), absl::StrCat("replica ", r, ": ", s.message()));
  };
  int64_t steps = 0;
  int64_t next_report = config.progress_interval_steps;
  double clock = 0;
  const auto report = [&] {
    int64_t done = 0;
    for (const Replica* r : replicas) done += r->num_done();
    config.progress(SimProgress{done, static_cast<int64_t>(trace.size()), clock});
  };
  size_t next = 0;
  while (true) {
    int32_t first = 0;
    for (size_t r = 1; r < replicas.size(); ++r) {
      if (replicas[r]->next_event_s() < replicas[first]->next_event_s()) {
        first = static_cast<int32_t>(r);
      }
    }
    const double event_s = replicas[first]->next_event_s();
    if (next < trace.size() && trace[next].arrival_s <= event_s) {
      clock = std::max(clock, trace[next].arrival_s);
      // Only a choice between replicas needs the prompt; the replica builds its own copy
      // when the request enters its scheduler.
      std::vector<int32_t> prompt;
      if (replicas.size() > 1 && trace[next].prompt_len < replicas[0]->max_model_len()) {
        prompt = PromptTokens(trace[next]);
      }
      const int32_t r = route(next, prompt);
      replicas[r]->Enqueue(next);
      ++next;
      continue;
    }
    if (std::isinf(event_s)) break;
    clock = std::max(clock, event_s);
    const int64_t before = replicas[first]->num_steps();
    if (absl::Status s = replicas[first]->Advance(); !s.ok()) return named(first, s);
    if (absl::Status s = after_advance(first); !s.ok()) return named(first, s);
    steps += replicas[first]->num_steps() - before;
    if (config.progress && steps >= next_report) {
      next_report += config.progress_interval_steps;
      report();
    }
  }
  if (config.progress) report();
  return absl::OkStatus();
}

}  // namespace kvpage::sim
