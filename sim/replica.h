// One simulated replica: a real Scheduler and KvCacheManager on its own virtual clock, stepped
// from outside. Simulate drives one; SimulateFleet drives many on one global clock.
//
// A replica is idle, waiting to start a step, or running one. A step has two halves:
//
//   begin (at the clock t)   every enqueued request is added to the scheduler, the scheduler
//                            decides the step, the cost model prices it: it ends at t + cost;
//   finish (at t + cost)     the clock moves to the step's end, every token the step samples
//                            is stamped with it, the scheduler applies the step (Update).
//
// Advance, called when the global clock reaches next_event_s(), finishes the step in flight
// and begins the next one at the same instant. With a host tier, a step's copies queue on
// the replica's HostLink (host_link.h); each step begins by completing the transfers whose
// copies have ended, and a replica with nothing to run but copies in flight waits for the
// first to end. Requests enqueued while a step runs wait for
// its end, as requests reaching a server mid-step do; an idle replica's clock moves to the
// arrival of the first request enqueued, and its step begins once every request arriving at
// that instant has been enqueued. Between Advance calls the replica is as a router would find
// it mid-step: the step's blocks allocated, its tokens not yet sampled nor its blocks cached.
//
// Request ids are trace positions, so a request samples the same tokens on any replica.
// Thread-compatible.
#ifndef KVPAGE_SIM_REPLICA_H_
#define KVPAGE_SIM_REPLICA_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kvpage/kv_events.h"
#include "kvpage/scheduler.h"
#include "sim/cost_model.h"
#include "sim/host_link.h"
#include "sim/simulator.h"
#include "sim/trace.h"

namespace kvpage::sim {

class Replica {
 public:
  // The replica's scheduler, built from `config` (hash_seed defaults to config.seed, as in
  // Simulate). `trace`, `config` and `cost` must outlive the replica. Errors: the scheduler's;
  // InvalidArgument when the model's max_model_len is above kMaxRequestTokens.
  static absl::StatusOr<std::unique_ptr<Replica>> Create(const std::vector<TraceRequest>& trace,
                                                         const SimConfig& config,
                                                         const CostModel& cost);
  Replica(const Replica&) = delete;
  Replica& operator=(const Replica&) = delete;

  // Hands the replica trace request `pos`, which has arrived. Its prompt's token ids are
  // built when it enters the scheduler: at once while the scheduler waits on fewer than
  // waiting_window() requests, else when it does (see below).
  // REQUIRES: positions enqueued in increasing order; the global clock at the arrival, and at
  // or before next_event_s().
  void Enqueue(size_t pos);
  // When Advance must next run: the end of the step in flight, the clock when enqueued
  // requests wait for a step, the end of the oldest host-tier transfer in flight, +infinity
  // when idle.
  double next_event_s() const;
  // Finishes the step in flight (if any) and begins the next. ResourceExhausted for a request
  // that can never run; Internal if the scheduler rejects a step (see simulator.h).
  absl::Status Advance();

  // Prompt tokens not yet prefilled (as of the last step begun) plus output tokens not yet
  // generated, over the requests enqueued here and not finished.
  int64_t outstanding_tokens() const { return outstanding_tokens_; }
  const KvCacheManager& kv_cache() const { return sched_->kv_cache(); }
  // The KV events since the last call (config.scheduler.kv.enable_kv_events).
  std::vector<KvEvent> DrainKvEvents() { return sched_->DrainKvEvents(); }
  int64_t max_model_len() const { return sched_->max_model_len(); }
  int64_t num_enqueued() const { return static_cast<int64_t>(live_.size()); }
  int64_t num_done() const { return done_; }
  int64_t num_steps() const { return result_.num_steps; }
  double clock_s() const { return t_; }
  double busy_s() const { return busy_s_; }
  // The scheduler's waiting queue is kept at least this long (or holding every request that
  // has arrived): one step admits at most max_num_seqs requests and looks at one more, so
  // the requests held back would not have been looked at, and every step is the one the
  // scheduler makes with all of them waiting. With a host tier a step may look further (at
  // requests whose prefix starts loading), so every arrival enters at once. The requests
  // held back keep no token ids: an overloaded run's memory follows what runs.
  int64_t waiting_window() const { return waiting_window_; }

  // The run's result (requests in trace order, usage statistics, summary); wall_seconds is
  // left 0. Call once, when next_event_s() is infinite. Errors: Summarize's.
  absl::StatusOr<SimResult> TakeResult();

 private:
  // Per enqueued request: where it is in its life, and its record.
  struct Live {
    RequestRecord record;
    int32_t generated = 0;      // output tokens sampled so far
    int32_t max_new_tokens = 0;
    int32_t prefilled = 0;      // prompt tokens computed as of the last step begun
    bool first_scheduled = false;
    bool finished = false;
  };

  Replica(const std::vector<TraceRequest>& trace, const SimConfig& config, const CostModel& cost,
          std::unique_ptr<Scheduler> scheduler);
  Live& LiveOf(RequestId id) { return live_[local_of_.at(id.value)]; }
  absl::Status AddPending();
  // Adds held requests to the scheduler while it waits on fewer than waiting_window_.
  absl::Status FeedScheduler();
  // Counts a request refused for max_model_len as done.
  void Drop(Live& l);
  bool HasUnfinished() const { return !held_.empty() || sched_->HasUnfinishedRequests(); }
  absl::Status BeginStep();
  // Completes the host-tier transfers whose copies have ended by the clock.
  absl::Status CompleteTransfers();
  // Queues the step's copies on the link; returns how long its forward pass waits for them.
  double QueueTransfers(const SchedulerOutput& out);
  // Applies a step that scheduled nothing while host-tier copies are in flight.
  absl::Status WaitForLink(const SchedulerOutput& out);
  absl::Status FinishStep();
  // Prices the step (`wait_s` before its forward pass), stamps its request hits and samples
  // (not yet applied).
  void PriceStep(const SchedulerOutput& out, double wait_s);
  void RecordUsage(const SchedulerOutput& out, double dt);
  absl::Status NeverRuns() const;
  SimHostTier HostTierResult() const;  // REQUIRES: link_

  const std::vector<TraceRequest>& trace_;
  const SimConfig& config_;
  const CostModel& cost_;
  std::unique_ptr<Scheduler> sched_;
  std::vector<Live> live_;                           // in enqueue (trace) order
  absl::flat_hash_map<int64_t, int32_t> local_of_;   // trace position -> live_ index
  std::deque<size_t> pending_;  // enqueued since the last step began
  std::deque<size_t> held_;     // arrived, not yet in the scheduler (no token ids built)
  int64_t waiting_window_ = 0;
  SimResult result_;
  std::vector<std::string> pool_names_;
  std::vector<int32_t> pool_first_group_;  // PoolUsage index standing for each pool
  std::optional<HostLink> link_;           // with a host tier
  double save_wait_s_ = 0;                 // Σ forward-pass waits for write-back saves
  const SchedulerOutput* step_ = nullptr;  // the step in flight
  double step_end_ = 0;
  double t_ = 0;           // the replica's clock, seconds
  int64_t done_ = 0;       // finished or dropped
  int64_t outstanding_tokens_ = 0;
  StepShape shape_;        // reused every step
  ModelOutput model_out_;
  std::vector<double> usage_;       // per step: total, then pools, then mapped
  std::vector<double> usage_peak_;
  std::vector<double> usage_time_;  // Σ usage · duration
  double busy_s_ = 0;               // Σ step durations
};

// Checks what Simulate and SimulateFleet check before running: the config, and arrival times
// that are finite and non-decreasing (InvalidArgument naming the request otherwise).
absl::Status ValidateRun(const std::vector<TraceRequest>& trace, const SimConfig& config);

// config.cost_model, else a cost model built from the config (the calibration when set, else
// the default), owned by *owned. Errors: the cost model's creation errors.
absl::StatusOr<const CostModel*> ResolveCostModel(const SimConfig& config,
                                                  std::unique_ptr<CostModel>* owned);

// The global loop: replays `trace` onto `replicas` on one clock. The next event is the earlier
// of the next arrival and the earliest replica event (next_event_s); an arrival at the same
// instant as a replica event comes first, so a step ending at t admits what arrived by t, as
// in Simulate. `route` picks each arrival's replica from its prompt's token ids (built for
// the call only when there is more than one replica, else empty);
// `after_advance(r)` runs after every Advance of replica r. Progress is reported (when set)
// about every config.progress_interval_steps steps, summed over replicas, and at the end.
// Errors: the first error of an Advance or after_advance, prefixed "replica <r>: " when
// `name_replicas`.
absl::Status RunOnOneClock(
    const std::vector<TraceRequest>& trace, absl::Span<Replica* const> replicas,
    const SimConfig& config, bool name_replicas,
    const std::function<int32_t(size_t pos, absl::Span<const int32_t> prompt)>& route,
    const std::function<absl::Status(int32_t replica)>& after_advance);

}  // namespace kvpage::sim

#endif  // KVPAGE_SIM_REPLICA_H_
