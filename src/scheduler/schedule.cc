// Scheduler::Schedule: one token budget, running requests first, then waiting ones.
#include <algorithm>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "internal/prefetch.h"
#include "internal/status_macros.h"
#include "kvpage/scheduler.h"
#include "profile/step_phases.h"
#include "scheduler/scheduler_impl.h"

namespace kvpage {

using internal::RequestStatus;
using internal::SchedRequest;

const SchedulerOutput& Scheduler::Schedule() {
  Impl& s = *impl_;
  ++s.step;
  s.applied = false;
  s.rows_match_output = false;
  s.static_this_step = s.static_rows;
  s.static_rows = false;
  s.preempted_this_step = false;
  s.scheduled.clear();
  s.out.preempted_ids.clear();
  s.kv->NewStep();
  int64_t budget = s.config.max_num_batched_tokens;
  s.ReleaseOutOfWindowBlocks();
  s.ScheduleRunning(budget);
  if (!s.preempted_this_step && !(s.config.policy == SchedulingPolicy::kFcfs
                                      ? s.fcfs_waiting.empty()
                                      : s.priority_waiting.empty())) {
    s.ScheduleWaiting(budget);
  }
  s.BuildOutput(s.config.max_num_batched_tokens - budget);
  ++s.stats.steps;
  return s.out;
}

void Scheduler::Impl::ReleaseOutOfWindowBlocks() {
  // The manager frees a request's out-of-window blocks when the request next allocates. A
  // request that has just computed a long prompt chunk holds the window's blocks for all of it
  // until then, and it comes last in the running order: requests ahead of it that need memory
  // would preempt it (FCFS takes the last) for blocks it no longer needs. Release them all first.
  if (!has_sliding_groups) return;
  KVPAGE_STEP_PHASE(StepPhase::kReleaseWindows);
  for (int32_t q : running) {
    SchedRequest& r = reqs[q];
    // steady_until <= sync_release: most requests are let go by their first line alone.
    if (r.num_computed < r.steady_until || r.num_computed < r.sync_release) continue;
    const absl::Status released = kv->RemoveSkippedBlocks(r.id, r.num_computed, r.kv_handle);
    KVPAGE_DCHECK(released.ok());
    (void)released;
    RefreshQuiet(r);
  }
}

int32_t Scheduler::Impl::TokensToSchedule(const SchedRequest& r, int64_t budget) const {
  const int64_t remaining = r.num_tokens - r.num_computed;  // prompt or recompute left
  int64_t n = remaining + r.num_drafts;
  if (remaining > 1 && config.long_prefill_token_threshold > 0) {
    n = std::min<int64_t>(n, config.long_prefill_token_threshold);
  }
  n = std::min(n, budget);
  n = std::min(n, max_model_len - r.num_computed);
  // A prompt chunk of a model with recurrent state ends on a block boundary when it can, so
  // the state there is snapshotted and later requests can resume from it. That holds for the
  // last chunk too: a prompt of 100 tokens runs as 96 + 4, and the next turn of the
  // conversation resumes from the state after 96.
  if (has_state_groups && config.kv.enable_prefix_caching && remaining > 1) {
    const int64_t end = (r.num_computed + n) / cache_block_size * cache_block_size;
    if (end > r.num_computed) n = end - r.num_computed;
  }
  return static_cast<int32_t>(n);
}

void Scheduler::Impl::MarkScheduled(SchedRequest& r, int32_t n, int32_t drafts) {
  r.num_scheduled = n;
  r.num_scheduled_drafts = drafts;
  r.num_computed += n;
  r.scheduled_step = step;
}

void Scheduler::Impl::UnmarkScheduled(SchedRequest& r) {
  r.num_computed -= r.num_scheduled;
  r.scheduled_step = 0;
}

void Scheduler::Impl::RefreshQuiet(SchedRequest& r) {
  const absl::StatusOr<DecodeHorizon> h = kv->QuietDecodeHorizon(r.id, r.kv_handle);
  KVPAGE_DCHECK(h.ok());
  r.SetQuietHorizon(h.ok() ? *h : DecodeHorizon{});
}

void Scheduler::Impl::RecordScheduled(int32_t q, int32_t n, int32_t drafts, int64_t& budget) {
  MarkScheduled(reqs[q], n, drafts);
  budget -= n;
  scheduled.push_back(q);
}

int32_t Scheduler::Impl::PickVictim() const {
  if (config.policy == SchedulingPolicy::kFcfs) return running.back();
  // The worst running request: the largest (priority, arrival, add order).
  return *std::max_element(running.begin(), running.end(), [&](int32_t a, int32_t b) {
    return internal::PriorityLess{&reqs}(b, a);
  });
}

void Scheduler::Impl::Preempt(int32_t victim, int64_t& budget) {
  steady_output = false;  // rows move
  SchedRequest& r = reqs[victim];
  if (r.scheduled_step == step) {
    // Scheduled earlier in this step: give its tokens back.
    budget += r.num_scheduled;
    UnmarkScheduled(r);
    scheduled.erase(std::find(scheduled.begin(), scheduled.end(), victim));
  }
  // The cache forgets the request: keep its tokens (outputs included) to start over.
  absl::StatusOr<absl::Span<const int32_t>> tokens = kv->Tokens(r.id);
  KVPAGE_DCHECK(tokens.ok());
  if (tokens.ok()) r.tokens.assign(tokens->begin(), tokens->end());
  LeaveRunning(victim);
  r.num_computed = 0;
  r.num_drafts = 0;
  r.resumed = true;
  ++r.num_preemptions;
  ++stats.preemptions;
  preempted_this_step = true;
  out.preempted_ids.push_back(r.id);
  PushWaiting(victim, /*front=*/true);
}

bool Scheduler::Impl::AllocateOrPreempt(int32_t q, int32_t n, int64_t& budget) {
  SchedRequest& r = reqs[q];
  const int32_t drafts = std::max<int32_t>(
      0, static_cast<int32_t>(r.num_computed + n - r.num_tokens));
  while (true) {
    AllocationRequest req{.num_computed_tokens = r.num_computed,
                          .num_new_tokens = n,
                          .num_lookahead_tokens = std::min<int64_t>(
                              config.num_speculative_tokens,
                              max_model_len - r.num_computed - n)};
    absl::StatusOr<bool> ok = kv->AllocateSlots(r.id, req);
    KVPAGE_DCHECK(ok.ok());  // the scheduler only asks for valid steps
    if (ok.ok() && *ok) {
      RecordScheduled(q, n, drafts, budget);
      RefreshQuiet(r);
      return true;
    }
    const int32_t victim = PickVictim();
    Preempt(victim, budget);
    if (victim == q) return false;
  }
}

namespace {

// std::fill for int32, four at a time with SSE2 (at -O2 the compiler stores one by one).
void FillInt32(int32_t* first, int32_t* last, int32_t value) {
#if defined(__SSE2__)
  const __m128i v = _mm_set1_epi32(value);
  for (; last - first >= 4; first += 4) _mm_storeu_si128(reinterpret_cast<__m128i*>(first), v);
#endif
  for (; first != last; ++first) *first = value;
}

// Starts loading the two lines the running pass reads of the request 8 places ahead (the
// running list's order need not be the requests' order in memory).
inline void PrefetchRequestAhead(const SchedRequest* rq, const int32_t* run, size_t j,
                                 size_t end) {
  if (j + 8 < end) {
    const char* ahead = reinterpret_cast<const char*>(rq + run[j + 8]);
    Prefetch(ahead);
    Prefetch(ahead + 64);
  }
}

// Where the running pass puts the plain decode steps the KV cache must hear of (the
// AllocateDecodeStep batch and each entry's index in the running list): arrays sized for every
// running request, `size` entries so far.
struct DecodeBatchTargets {
  DecodeStep* steps;
  int32_t* index;
  size_t size;
};
// Where ScheduleSteadyRun stopped: the first request it did not take, and the batch's size.
struct SteadyRunEnd {
  size_t next;
  size_t batch_size;
};

// The running pass over requests run[j], run[j + 1], … while each is a plain decode step (one
// token, no drafts), the common case of steady decode: one within its quiet horizon whose row
// is steady is marked scheduled and its steady row written; any other goes to `batch` (its
// row is written once the cache has served it). Returns the index of the first request it did
// not take. A loop of its own (not inlined) with no call in it, the output addresses in a
// local copy, so that its values stay in registers; kTwoGroups: rows.slots1 is not null;
// kStatic: the output's entries hold all but the positions already
// (Scheduler::Impl::static_rows).
template <bool kTwoGroups, bool kStatic>
[[gnu::noinline]] SteadyRunEnd ScheduleSteadyRun(SchedRequest* rq, const int32_t* run, size_t j,
                                                 size_t end, uint64_t step,
                                                 const internal::PlainRows& targets,
                                                 const DecodeBatchTargets& batch) {
  const internal::PlainRows rows = targets;
  DecodeStep* const steps = batch.steps;
  int32_t* const index = batch.index;
  size_t nb = batch.size;
  // Takes request run[at]'s step if it is a plain decode step. The rows are steady, so there
  // is no speculative decoding: num_drafts and num_scheduled_drafts are 0.
  auto take = [&](size_t at) __attribute__((always_inline)) {
    SchedRequest& r = rq[run[at]];
    const int32_t c = r.num_computed;
    KVPAGE_DCHECK(r.num_drafts == 0 && r.num_scheduled_drafts == 0);
    if (r.QuietSteadyDecode()) [[likely]] {
      // The second line is neither read nor written.
      rows.WriteSteadyFor<kTwoGroups, kStatic>(r, c);
    } else {
      // Not a plain decode step, or one the cache need not hear of whose row is not steady:
      // the caller's general path.
      if (r.num_tokens != c + 1 || r.InQuietHorizon()) return false;
      steps[nb] = {r.id, c, 1, r.kv_handle};
      index[nb] = static_cast<int32_t>(at);
      ++nb;
    }
    // Scheduler::Impl::MarkScheduled(r, 1, 0).
    r.num_scheduled = 1;
    r.num_computed = c + 1;
    r.scheduled_step = step;
    return true;
  };
  // One group's quiet step reads the first line alone (SchedRequest), two groups' the second
  // too: those of the request 8 places ahead are fetched while this one is taken (two loops,
  // so that the main one does not test for the end of the run before each prefetch).
  const size_t prefetch_end = end > 8 ? end - 8 : 0;  // one bound: j + 8 is an address offset
  for (; j < prefetch_end; ++j) {
    const char* ahead = reinterpret_cast<const char*>(rq + run[j + 8]);
    Prefetch(ahead);
    if constexpr (kTwoGroups) Prefetch(ahead + 64);
    if (!take(j)) return {j, nb};
  }
  for (; j < end; ++j) {
    if (!take(j)) return {j, nb};
  }
  return {j, nb};
}

}  // namespace

void Scheduler::Impl::ScheduleRunning(int64_t& budget) {
  KVPAGE_STEP_PHASE(StepPhase::kScheduleRunning);
  // A run of plain decode steps (one token, no drafts) of consecutive running requests is
  // scheduled in one pass: a quiet step (within the request's quiet decode horizon) needs
  // nothing from the KV cache and is only counted; the others go to the cache together in one
  // AllocateDecodeStep call. Anything else, or a decode step that does not fit, goes through
  // AllocateOrPreempt.
  const bool batchable = config.num_speculative_tokens == 0;
  // Steady rows are written in place only when the budget lets every running request decode.
  steady_output = fast_rows && budget >= static_cast<int64_t>(running.size());
  internal::PlainRows steady;
  if (steady_output) steady = PrepareSteadyOutput();
  size_t i = 0;
  // Written by index (no capacity checks per entry): at most one entry per running request.
  if (decode_batch.size() < running.size()) {
    decode_batch.resize(running.size());
    decode_batch_index.resize(running.size());
  }
  while (i < running.size() && budget > 0) {
    if (batchable) {
      DecodeBatchTargets batch{decode_batch.data(), decode_batch_index.data(), 0};
      const size_t end = i + static_cast<size_t>(std::min<int64_t>(
                                 budget, static_cast<int64_t>(running.size() - i)));
      // Locals, not members: the loop's stores could alias the members, which the compiler
      // would then reload for every request.
      SchedRequest* const rq = reqs.data();
      const int32_t* const run = running.data();
      const uint64_t this_step = step;
      const bool write_steady = steady_output;
      const bool write_static = write_steady && static_this_step;
      KVPAGE_DCHECK(!write_static || out.requests.size() == running.size());
      size_t j = i;
      for (; j < end; ++j) {
        if (write_steady) {
          SteadyRunEnd e;
          if (steady.slots1 != nullptr) {
            e = write_static
                    ? ScheduleSteadyRun<true, true>(rq, run, j, end, this_step, steady, batch)
                    : ScheduleSteadyRun<true, false>(rq, run, j, end, this_step, steady, batch);
          } else {
            e = write_static
                    ? ScheduleSteadyRun<false, true>(rq, run, j, end, this_step, steady, batch)
                    : ScheduleSteadyRun<false, false>(rq, run, j, end, this_step, steady, batch);
          }
          j = e.next;
          batch.size = e.batch_size;
          if (j == end) break;
        }
        const int32_t q = run[j];
        PrefetchRequestAhead(rq, run, j, end);
        SchedRequest& r = rq[q];
        if (!r.PlainDecode()) break;
        const int64_t c = r.num_computed;
        if (!r.InQuietHorizon()) {
          decode_batch[batch.size] = {r.id, c, 1, r.kv_handle};
          decode_batch_index[batch.size] = static_cast<int32_t>(j);
          ++batch.size;
        } else if (write_steady) {
          if (r.SteadyRowAt(c)) {
            steady.WriteSteady(r, c);
          } else {
            deferred_rows.push_back(r.row);
          }
        }
        MarkScheduled(r, 1, 0);
      }
      scheduled.insert(scheduled.end(), running.begin() + static_cast<ptrdiff_t>(i),
                       running.begin() + static_cast<ptrdiff_t>(j));
      budget -= static_cast<int64_t>(j - i);
      if (batch.size > 0) {
        decode_horizons.resize(batch.size);
        const absl::StatusOr<int64_t> served = kv->AllocateDecodeStep(
            absl::MakeConstSpan(decode_batch.data(), batch.size), absl::MakeSpan(decode_horizons));
        KVPAGE_DCHECK(served.ok());
        const size_t k = served.ok() ? static_cast<size_t>(*served) : 0;
        for (size_t t = 0; t < k; ++t) {
          const int32_t q = running[decode_batch_index[t]];
          SchedRequest& r = reqs[q];
          r.SetQuietHorizon(decode_horizons[t]);
          if (!steady_output) continue;
          // A step that only cached a block left the row as it was; a crossing grew a table.
          const int64_t c = r.num_computed - 1;  // marked above
          if (r.SteadyRowAt(c)) {
            steady.WriteSteady(r, c);
          } else {
            deferred_rows.push_back(r.row);
          }
        }
        if (k < batch.size) {
          steady_output = false;
          // The request at position p did not fit. The run's steps from p on are undone (the
          // quiet ones among them touched nothing in the cache, the others were not served)
          // and the general path below preempts for it.
          const size_t p = static_cast<size_t>(decode_batch_index[k]);
          for (size_t x = p; x < j; ++x) UnmarkScheduled(reqs[running[x]]);
          scheduled.resize(scheduled.size() - (j - p));
          budget += static_cast<int64_t>(j - p);
          j = p;
        }
      }
      i = j;
      if (i == running.size() || budget <= 0) break;
    }
    steady_output = false;  // a request that is not a plain decode step
    const int32_t q = running[i];
    const int32_t n = TokensToSchedule(reqs[q], budget);
    if (n <= 0) {
      reqs[q].visited_step = step;
      ++i;
      continue;
    }
    // Preemption removes requests behind q (FCFS) or anywhere (priority), q itself included
    // when it is the victim; the running list keeps its order, visited requests first, so
    // the pass goes on at the first request not visited yet. (vLLM stops the pass when a
    // request preempts itself; under FCFS nothing follows it anyway, and under priority the
    // memory it gave back can serve the better requests after it.)
    if (AllocateOrPreempt(q, n, budget)) {
      ++i;
    } else {
      i = 0;
    }
    while (i < running.size() && Visited(reqs[running[i]])) ++i;
  }
}

void Scheduler::Impl::ScheduleWaiting(int64_t& budget) {
  // Prompt tokens that running requests still have to compute after this step: a new request
  // is admitted only if those fit as well (else admitting it would preempt one of them, or
  // itself, a few steps later).
  int64_t outstanding = 0;
  if (config.reserve_full_prompt) {
    for (int32_t q : running) {
      const SchedRequest& r = reqs[q];
      outstanding += std::max<int64_t>(0, r.num_tokens - r.num_computed - 1);
    }
  }
  while (budget > 0 && static_cast<int32_t>(running.size()) < config.max_num_seqs) {
    const int32_t q = PeekWaiting();
    if (q < 0) break;
    SchedRequest& r = reqs[q];
    if (!r.in_manager) {
      KvRequestSpec spec;
      spec.id = r.id;
      // Outputs too, after a preemption: they are recomputed. Room for the rest of the
      // outputs, so decode steps never regrow the vector.
      spec.prompt_tokens = std::move(r.tokens);
      // (In 64 bits, and no more than max_model_len: max_new_tokens may be as large as int32.)
      spec.prompt_tokens.reserve(static_cast<size_t>(std::min<int64_t>(
          max_model_len, r.prompt_len + r.max_new_tokens)));
      r.tokens = {};
      spec.extras.lora_id = r.lora_id;
      spec.extras.cache_salt = r.cache_salt;
      const absl::Status added = kv->AddRequest(std::move(spec));
      KVPAGE_DCHECK(added.ok());  // the id is not in the cache; the tokens were checked
      if (!added.ok()) break;
      r.in_manager = true;
      r.kv_handle = kv->RequestHandle(r.id);
    }
    absl::StatusOr<CacheHit> hit = kv->GetComputedBlocks(r.id);
    KVPAGE_DCHECK(hit.ok());
    const int64_t c = hit.ok() ? hit->num_tokens : 0;
    r.num_computed = c;
    const int64_t remaining = r.num_tokens - c;
    // A request that cannot start stays in the cache without blocks (its hashes are kept) and
    // asks for its hit again next step.
    if (!config.enable_chunked_prefill && remaining > budget) {
      r.num_computed = 0;
      break;  // nothing is scheduled ahead of it
    }
    const int32_t n = TokensToSchedule(r, budget);
    AllocationRequest req{.num_computed_tokens = c,
                          .num_new_tokens = n,
                          .num_reserve_tokens =
                              config.reserve_full_prompt ? remaining - n + outstanding : 0,
                          .hit = hit.ok() && c > 0 ? &*hit : nullptr};
    absl::StatusOr<bool> ok = n > 0 ? kv->AllocateSlots(r.id, req) : absl::StatusOr<bool>(false);
    KVPAGE_DCHECK(ok.ok());
    bool admitted = ok.ok() && *ok;
    if (admitted && config.watermark > 0 && !running.empty()) {
      const KvCacheUsage usage = kv->Usage();
      admitted = usage.used_bytes <= (1.0 - config.watermark) * usage.budget_bytes;
    }
    if (!admitted) {
      if (ok.ok() && *ok) {
        // Over the watermark: give the blocks back, and keep the request in the cache.
        const absl::Status freed = FreeKeepingTokens(q);
        KVPAGE_DCHECK(freed.ok());
      }
      r.num_computed = 0;
      break;  // waiting requests never preempt running ones
    }
    PopWaiting();
    if (config.reserve_full_prompt) outstanding += remaining - n;
    if (!r.resumed) {
      stats.admitted_prompt_tokens += r.num_tokens;
      stats.prefix_hit_tokens += c;
    }
    r.status = RequestStatus::kRunning;
    r.fresh = true;
    running.push_back(q);
    TakeRow(q);
    RecordScheduled(q, n, 0, budget);
    RefreshQuiet(r);
  }
}

void Scheduler::Impl::BuildOutput(int64_t total_tokens) {
  KVPAGE_STEP_PHASE(StepPhase::kBuildOutput);
  SchedulerOutput& o = out;
  o.step = step;
  o.num_rows = static_cast<int32_t>(running.size());
  o.row_moves.swap(pending_row_moves);
  pending_row_moves.clear();
  o.finished_ids.swap(pending_finished);
  pending_finished.clear();
  o.slots_to_zero = kv->TakeSlotsToZero();
  o.state_copies = kv->TakeStateCopies();

  // Every output array is sized first and written by index: in steady decode the sizes do not
  // change from step to step, so nothing is constructed or grown, and the loop below does no
  // capacity checks.
  const size_t rows = static_cast<size_t>(o.num_rows);
  const size_t num_scheduled = scheduled.size();
  // Rows in order; a row's tokens follow the previous row's. In steady decode every running
  // request is scheduled and the per-row flags are not needed.
  const bool every_row = num_scheduled == rows;
  if (!every_row) {
    row_scheduled.assign(rows, 0);
    for (int32_t q : scheduled) row_scheduled[reqs[q].row] = 1;
  }
  o.requests.resize(num_scheduled);
  o.query_start_loc.resize(rows + 1);
  o.seq_lens.resize(rows);
  for (size_t a = 0; a < attention.size(); ++a) {
    AttentionBatch& batch = o.attention[a];
    batch.block_table = absl::MakeConstSpan(attention[a].table.data(), rows * attention[a].stride);
    batch.slot_mapping.resize(static_cast<size_t>(total_tokens));
    batch.new_block_ids.clear();
    batch.new_block_offsets.resize(num_scheduled + 1);
    batch.new_block_offsets[0] = 0;
  }
  for (StateBatch& sb : o.states) {
    sb.read_slots.assign(rows, -1);
    sb.write_slots.assign(rows, -1);
  }
  if (steady_output && every_row && rows == steady_rows &&
      total_tokens == static_cast<int64_t>(rows)) {
    FinishSteadyOutput();
    return;
  }
  // The loop writes a plain decode row (one token, no drafts, its table row current, its
  // block the row's last, no state group) inline through PlainRows, from locals alone (the
  // loop's stores could alias the members the addresses come from, which the compiler would
  // then reload every row). Any other row goes to WriteRow.
  const size_t num_attention = attention.size();
  const bool two_groups = num_attention == 2;
  const bool fast = fast_rows;  // a local: the stores below could alias the member
  const internal::PlainRows plain = PlainRowTargets();
  int32_t* const offsets0 = fast ? o.attention[0].new_block_offsets.data() : nullptr;
  int32_t* const offsets1 =
      fast && two_groups ? o.attention[1].new_block_offsets.data() : nullptr;
  int32_t new_ids0 = 0, new_ids1 = 0;  // new_block_ids' sizes (only WriteRow appends)
  int32_t* const query_start = o.query_start_loc.data();
  int32_t* const seq_lens = o.seq_lens.data();
  ScheduledRequest* const srs = o.requests.data();
  const int32_t* const owners = row_owner.data();
  SchedRequest* const rq = reqs.data();
  int32_t tokens = 0;
  size_t k = 0;  // index in o.requests
  bool one_each = true;  // every request samples one token (Update's fast path)
  for (size_t row = 0; row < rows; ++row) {
    if (!every_row && !row_scheduled[row]) {
      query_start[row] = tokens;
      seq_lens[row] = 0;
      continue;
    }
    const int32_t q = owners[row];
    SchedRequest& r = rq[q];
    const int64_t c = r.num_computed - 1;
    if (fast && r.num_scheduled == 1 && r.SteadyRowAt(c)) {  // fast: no drafts
      const bool samples = r.num_computed >= r.num_tokens;
      plain.Write(r, c, k, tokens, samples);
      offsets0[k + 1] = new_ids0;
      if (two_groups) offsets1[k + 1] = new_ids1;
      one_each &= samples;
      ++tokens;
    } else {
      query_start[row] = tokens;
      tokens += WriteRow(q, row, k, tokens);
      one_each &= srs[k].samples;  // drafts make one_sample_each false below anyway
      if (fast) {
        new_ids0 = static_cast<int32_t>(o.attention[0].new_block_ids.size());
        if (two_groups) new_ids1 = static_cast<int32_t>(o.attention[1].new_block_ids.size());
      }
    }
    ++k;
  }
  // With speculative decoding, Update also takes the drafts for the next step.
  o.one_sample_each = one_each && config.num_speculative_tokens == 0;
  KVPAGE_DCHECK(k == num_scheduled && tokens == total_tokens);
  o.query_start_loc[rows] = tokens;
  o.total_num_scheduled_tokens = tokens;
}

internal::PlainRows Scheduler::Impl::PlainRowTargets() {
  SchedulerOutput& o = out;
  if (!fast_rows) return {};
  return {.requests = o.requests.data(),
          .slots0 = o.attention[0].slot_mapping.data(),
          .slots1 = o.attention.size() == 2 ? o.attention[1].slot_mapping.data() : nullptr,
          .seq_lens = o.seq_lens.data(),
          .query_start = o.query_start_loc.data()};
}

internal::PlainRows Scheduler::Impl::PrepareSteadyOutput() {
  SchedulerOutput& o = out;
  const size_t rows = running.size();
  steady_rows = rows;
  deferred_rows.clear();
  o.requests.resize(rows);
  o.query_start_loc.resize(rows + 1);
  o.seq_lens.resize(rows);
  for (AttentionBatch& batch : o.attention) batch.slot_mapping.resize(rows);
  return PlainRowTargets();
}

void Scheduler::Impl::FinishSteadyOutput() {
  SchedulerOutput& o = out;
  const size_t rows = steady_rows;
  // Usually in order already: rows follow admission order until a finished request's row is
  // refilled from the end.
  if (!std::is_sorted(deferred_rows.begin(), deferred_rows.end())) {
    std::sort(deferred_rows.begin(), deferred_rows.end());
  }
  // Steady rows add no blocks: their new-block offsets repeat the count so far.
  auto fill_offsets = [&](size_t from, size_t to) {
    for (AttentionBatch& batch : o.attention) {
      int32_t* const offsets = batch.new_block_offsets.data();
      FillInt32(offsets + from + 1, offsets + to + 1,
                static_cast<int32_t>(batch.new_block_ids.size()));
    }
  };
  // A deferred row is steady once synced (a crossing: the step's token opens the new last
  // block), unless a window released blocks or the step's block is not the last; WriteRow
  // takes those.
  const internal::PlainRows plain = PlainRowTargets();
  bool one_each = true;
  bool all_steady = true;  // no entry went through WriteRow
  size_t next = 0;  // rows [next, d) before the next deferred row d are steady
  for (const int32_t d : deferred_rows) {
    const size_t row = static_cast<size_t>(d);
    fill_offsets(next, row);
    const int32_t q = row_owner[row];
    SchedRequest& r = reqs[q];
    const int64_t c = r.num_computed - 1;
    if (!r.SteadyRowAt(c)) SyncRow(r);
    if (r.SteadyRowAt(c)) {
      plain.WriteSteady(r, c);
      for (AttentionBatch& batch : o.attention) {
        batch.new_block_offsets[row + 1] = static_cast<int32_t>(batch.new_block_ids.size());
      }
    } else {
      o.query_start_loc[row] = d;
      WriteRow(q, row, row, d);
      one_each &= o.requests[row].samples;
      all_steady = false;  // rare (see above): the next step writes whole entries
    }
    next = row + 1;
  }
  fill_offsets(next, rows);
  o.query_start_loc[rows] = static_cast<int32_t>(rows);
  o.total_num_scheduled_tokens = static_cast<int64_t>(rows);
  o.one_sample_each = one_each;  // fast_rows: no speculative decoding
  rows_match_output = true;
  static_rows = all_steady;
}

int32_t Scheduler::Impl::WriteRow(int32_t q, size_t row, size_t k, int32_t tokens) {
  SchedulerOutput& o = out;
  SchedRequest& r = reqs[q];
  const int32_t n = r.num_scheduled;
  const int64_t c = r.num_computed - n;
  const bool fresh = r.fresh;
  ScheduledRequest& sr = o.requests[k];
  sr.id = r.id;
  sr.row = static_cast<int32_t>(row);
  sr.is_new = fresh;
  sr.resumed = fresh && r.resumed;
  sr.num_computed_tokens = c;
  sr.num_scheduled_tokens = n;
  sr.num_draft_tokens = r.num_scheduled_drafts;
  sr.samples = r.num_computed - r.num_scheduled_drafts >= r.num_tokens;
  r.fresh = false;
  r.resumed = false;
  // The row is current unless the step grew a table or a window released blocks.
  const int64_t lookahead = std::min<int64_t>(config.num_speculative_tokens, max_model_len - c - n);
  if (fresh || c + n + lookahead > r.sync_tokens || c >= r.sync_release) {
    SyncRow(r);
  }
  for (size_t a = 0; a < attention.size(); ++a) {
    const GroupInfo& g = attention[a];
    AttentionBatch& batch = o.attention[a];
    int64_t* slots = batch.slot_mapping.data() + tokens;
    const int64_t bs = g.block_size;
    const int32_t* table = g.table.data() + row * g.stride;
    for (int64_t pos = c; pos < c + n; ++pos) {
      slots[pos - c] = int64_t{table[pos / bs * g.ratio]} / g.ratio * bs + pos % bs;
    }
    batch.new_block_offsets[k + 1] = static_cast<int32_t>(batch.new_block_ids.size());
  }
  for (size_t sgi = 0; sgi < state_groups.size(); ++sgi) {
    absl::StatusOr<StateSlots> slots = kv->GetStateSlots(r.id, state_groups[sgi]);
    KVPAGE_DCHECK(slots.ok());
    if (!slots.ok()) continue;
    o.states[sgi].read_slots[row] = slots->read_slot;
    o.states[sgi].write_slots[row] = slots->write_slot;
  }
  o.seq_lens[row] = static_cast<int32_t>(c + n);
  return n;
}

}  // namespace kvpage
