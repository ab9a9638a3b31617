// Scheduler::Schedule: one token budget, running requests first, then waiting ones.
#include <algorithm>

#include "internal/status_macros.h"
#include "kvpage/scheduler.h"
#include "scheduler/scheduler_impl.h"

namespace kvpage {

using internal::RequestStatus;
using internal::SchedRequest;

const SchedulerOutput& Scheduler::Schedule() {
  Impl& s = *impl_;
  // The latest step is still to be applied (async: and the one before it).
  if (s.outstanding() >= (s.config.async_scheduling ? 2u : 1u)) return s.Out();
  if (s.config.async_scheduling) {
    // The previous output stays as it is until its Update.
    s.cur ^= 1;
    s.prev_scheduled.swap(s.scheduled);
  }
  ++s.step;
  s.preempted_this_step = false;
  s.scheduled.clear();
  s.Out().preempted_ids.clear();
  s.kv->NewStep();
  int64_t budget = s.config.max_num_batched_tokens;
  s.ReleaseOutOfWindowBlocks();
  s.ScheduleRunning(budget);
  if (!s.preempted_this_step && !s.waiting.empty()) s.ScheduleWaiting(budget);
  s.BuildOutput(s.config.max_num_batched_tokens - budget);
  ++s.stats.steps;
  return s.Out();
}

void Scheduler::Impl::RefreshNextEvent(SchedRequest& r) {
  const absl::StatusOr<int64_t> next = kv->NextEvent(r.kv);
  KVPAGE_DCHECK(next.ok());
  r.next_event = next.ok() ? *next : 0;
  r.row_stale = true;
}

void Scheduler::Impl::ReleaseOutOfWindowBlocks() {
  // The manager frees a request's out-of-window blocks when the request next allocates. A
  // request that has just computed a long prompt chunk holds the window's blocks for all of it
  // until then, and it comes last in the running order: requests ahead of it that need memory
  // would preempt it (FCFS takes the last) for blocks it no longer needs. Release them all first.
  // (vLLM releases a request's blocks only in its own allocate_slots, so vllm accounting waits.)
  if (!kv->frees_skipped_blocks() || config.kv.mode == AccountingMode::kVllm) return;
  for (int32_t q : running) {
    SchedRequest& r = reqs[q];
    if (r.QuietStep(1)) continue;  // nothing due
    [[maybe_unused]] const absl::Status released = kv->RemoveSkippedBlocks(r.kv, r.NumProcessed());
    KVPAGE_DCHECK(released.ok());
    RefreshNextEvent(r);
    SyncRow(r);  // only zeroes released entries: nothing grew
  }
}

int32_t Scheduler::Impl::TokensToSchedule(const SchedRequest& r, int64_t budget) const {
  // Async scheduling: the step in flight samples the token that ends the request by length
  // (vLLM's rule, counting the sampled token only: drafts may all be rejected).
  if (r.num_placeholders > 0 && r.num_computed + 2 - r.num_placeholders >= r.length_limit) {
    return 0;
  }
  // Prompt or recompute left, and the placeholders: tokens the steps in flight sample.
  const int64_t remaining = r.num_tokens + r.num_placeholders - r.num_computed;
  int64_t n = remaining + r.num_drafts;
  if (remaining > 1 && config.long_prefill_token_threshold > 0) {
    n = std::min<int64_t>(n, config.long_prefill_token_threshold);
  }
  n = std::min({n, budget, max_model_len - r.num_computed});
  if (prefill_alignment > 0) n = AlignedChunk(r, n);
  return static_cast<int32_t>(n);
}

int64_t Scheduler::Impl::AlignedChunk(const SchedRequest& r, int64_t n) const {
  const int64_t bs = prefill_alignment;
  const int64_t start = r.num_computed;
  if (config.kv.mode == AccountingMode::kKvpage) {
    // A prompt chunk ends on a block boundary when it can, so the state there is snapshotted
    // and later requests can resume from it. First where the prompt diverges from everything
    // the cache knows (chunk_stop: a later request sharing the prefix resumes exactly there),
    // else at the last boundary the chunk reaches. That holds for the last chunk too: a prompt
    // of 100 tokens runs as 96 + 4, and the next turn resumes from the state after 96.
    if (r.num_tokens - start <= 1) return n;
    if (start < r.chunk_stop && r.chunk_stop < start + n) n = r.chunk_stop - start;
    const int64_t end = (start + n) / bs * bs;
    return end > start ? end - start : n;
  }
  // vLLM 0.33's Scheduler._mamba_block_aligned_split in align mode, as it runs for a model
  // without EAGLE, lookahead hashes or in-kernel prefill checkpoints. It splits the prefill: the
  // prompt, and after a preemption every token but the last.
  const int64_t prefill_end = std::max(r.prompt_len, r.num_tokens - 1);
  if (start >= prefill_end) return n;
  int64_t end = start + n;
  if (end < prefill_end) {
    // Not the last chunk: it ends on a block boundary even when that leaves no tokens (the
    // request is held back until a step has budget for a block), unless a block is wider than
    // any chunk can be.
    int64_t max_chunk = config.max_num_batched_tokens;
    if (config.long_prefill_token_threshold > 0) {
      max_chunk = std::min<int64_t>(max_chunk, config.long_prefill_token_threshold);
    }
    const int64_t aligned = end / bs * bs;
    if (aligned > start || bs <= max_chunk) end = aligned;
  }
  // Then it stops at the first of these strictly inside the chunk.
  const int64_t stops[] = {
      // A chunk that starts mid-block (a block wider than a chunk): that block's end.
      start % bs != 0 ? (start / bs + 1) * bs : 0,
      // The last boundary whose state can be cached: before the last token, always computed.
      std::max<int64_t>(r.num_tokens - 1, 0) / bs * bs,
      // Where full attention's prefix hit ended at admission (chunk_stop), whole blocks from
      // the start: a later request with that prefix resumes there.
      start < r.chunk_stop && r.chunk_stop < end ? start + (r.chunk_stop - start) / bs * bs : 0,
  };
  for (const int64_t stop : stops) {
    if (start < stop && stop < end) end = stop;
  }
  return std::max<int64_t>(end - start, 0);
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
  SchedRequest& r = reqs[victim];
  if (r.scheduled_step == step) {
    // Scheduled earlier in this step: give its tokens back.
    budget += r.num_scheduled;
    UnmarkScheduled(r);
    scheduled.erase(std::find(scheduled.begin(), scheduled.end(), victim));
  }
  // The cache forgets the request: its tokens (outputs included) come back here to start over.
  FreeKeepingTokens(victim);
  FreeRow(victim);
  running.erase(std::find(running.begin(), running.end(), victim));
  r.num_computed = 0;
  r.num_drafts = 0;
  r.resumed = true;
  ++r.num_preemptions;
  ++stats.preemptions;
  preempted_this_step = true;
  r.num_placeholders = 0;  // what its steps in flight sample is appended as it comes (Update)
  r.num_in_flight = 0;
  Out().preempted_ids.push_back(r.id);
  PushWaiting(victim, /*front=*/true);
}

bool Scheduler::Impl::AllocateOrPreempt(int32_t q, int32_t n, int64_t& budget) {
  SchedRequest& r = reqs[q];
  const int32_t drafts = std::max<int32_t>(
      0, static_cast<int32_t>(r.num_computed + n - r.num_tokens - r.num_placeholders));
  while (true) {
    const AllocationRequest req{
        .num_computed_tokens = r.num_computed,
        .num_new_tokens = n,
        .num_lookahead_tokens =
            std::min<int64_t>(config.num_speculative_tokens, max_model_len - r.num_computed - n),
        // A window keeps what steps in flight read (-1: none in flight).
        .num_processed_tokens = r.num_in_flight > 0 ? r.NumProcessed() : -1};
    const absl::StatusOr<bool> ok = kv->AllocateSlots(r.kv, req);
    KVPAGE_DCHECK(ok.ok());  // the scheduler only asks for valid steps
    if (ok.ok() && *ok) {
      RecordScheduled(q, n, drafts, budget);
      RefreshNextEvent(r);
      return true;
    }
    const int32_t victim = PickVictim();
    Preempt(victim, budget);
    if (victim == q) return false;
  }
}

size_t Scheduler::Impl::ScheduleDecodeRun(size_t i, int64_t& budget) {
  const size_t end = i + static_cast<size_t>(
                             std::min<int64_t>(budget, static_cast<int64_t>(running.size() - i)));
  // Only the steps that reach their request's next event go to the KV cache: a step that
  // ends before it changes nothing there.
  decode_batch.clear();
  decode_events.clear();
  size_t j = i;
  for (; j < end && reqs[running[j]].PlainDecode(); ++j) {
    SchedRequest& r = reqs[running[j]];
    const bool quiet = r.QuietStep(1);
    MarkScheduled(r, 1, 0);
    if (quiet) continue;
    decode_batch.push_back(DecodeStep{.request = r.kv, .num_computed_tokens = r.num_computed - 1});
    decode_events.push_back(j);
  }
  const absl::StatusOr<int64_t> served = kv->AllocateDecodeStep(decode_batch);
  KVPAGE_DCHECK(served.ok());
  const size_t k = served.ok() ? static_cast<size_t>(*served) : 0;
  for (size_t e = 0; e < k; ++e) RefreshNextEvent(reqs[running[decode_events[e]]]);
  // The k-th event did not fit: its step and the ones after it are undone (the cache left
  // them unchanged), and the general path preempts for it.
  const size_t stop = k < decode_events.size() ? decode_events[k] : j;
  for (size_t x = stop; x < j; ++x) UnmarkScheduled(reqs[running[x]]);
  j = stop;
  scheduled.insert(scheduled.end(), running.begin() + static_cast<ptrdiff_t>(i),
                   running.begin() + static_cast<ptrdiff_t>(j));
  budget -= static_cast<int64_t>(j - i);
  return j;
}

void Scheduler::Impl::ScheduleRunning(int64_t& budget) {
  // Runs of plain decode steps (one token, no drafts) go to the KV cache together; anything
  // else, or a decode step that does not fit, goes through AllocateOrPreempt.
  // (Async scheduling: decode steps carry tokens in flight, which AllocateDecodeStep does not
  // take, so each goes through AllocateSlots.)
  const bool batchable = config.num_speculative_tokens == 0 && !config.async_scheduling;
  size_t i = 0;
  while (i < running.size() && budget > 0) {
    if (batchable) {
      i = ScheduleDecodeRun(i, budget);
      if (i == running.size() || budget <= 0) break;
    }
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
    i = AllocateOrPreempt(q, n, budget) ? i + 1 : 0;
    while (i < running.size() && Visited(reqs[running[i]])) ++i;
  }
}

CacheHit Scheduler::Impl::Admit(SchedRequest& r) {
  if (!r.in_manager) {
    KvRequestSpec spec;
    spec.id = r.id;
    // Outputs too, after a preemption: they are recomputed.
    spec.prompt_tokens = std::move(r.tokens);
    // Room for the rest of the outputs, so decode steps never regrow the vector (in 64 bits,
    // and no more than max_model_len: max_new_tokens may be as large as int32).
    spec.prompt_tokens.reserve(static_cast<size_t>(
        std::min<int64_t>(max_model_len, r.prompt_len + r.max_new_tokens)));
    r.tokens = {};
    spec.extras.lora_id = r.lora_id;
    spec.extras.cache_salt = r.cache_salt;
    spec.extras.mm_items = r.mm_items;  // kept: a preempted request is added again
    spec.skip_prefix_cache_read = r.skip_prefix_cache_read;
    absl::StatusOr<RequestHandle> added = kv->AddRequest(std::move(spec));
    KVPAGE_DCHECK(added.ok());  // the id is not in the cache; the tokens were checked
    r.kv = added.ok() ? *added : RequestHandle();
    r.in_manager = added.ok();
  }
  absl::StatusOr<CacheHit> hit = kv->GetComputedBlocks(r.kv);
  KVPAGE_DCHECK(hit.ok());
  return hit.ok() ? *std::move(hit) : CacheHit{};
}

bool Scheduler::Impl::StartLoad(int32_t q) {
  SchedRequest& r = reqs[q];
  if (r.host_load_failed) return false;
  const absl::StatusOr<int64_t> loaded = kv->LoadFromHost(r.kv);
  KVPAGE_DCHECK(loaded.ok());
  if (!loaded.ok() || *loaded == 0) return false;
  r.loaded_tokens = *loaded;
  waiting.erase(q);
  r.status = RequestStatus::kLoading;
  loading.push_back(q);
  return true;
}

int64_t Scheduler::Impl::RunningPromptTokensLeft() const {
  int64_t left = 0;
  for (int32_t q : running) {
    const SchedRequest& r = reqs[q];
    left += std::max<int64_t>(0, r.num_tokens - r.num_computed - 1);
  }
  return left;
}

bool Scheduler::Impl::OverWatermark() const {
  const KvCacheUsage usage = kv->Usage();
  return usage.used_bytes > (1.0 - config.watermark) * usage.budget_bytes;
}

void Scheduler::Impl::ScheduleWaiting(int64_t& budget) {
  // Prompt tokens that running requests still have to compute after this step: a new request
  // is admitted only if those fit as well (else admitting it would preempt one of them, or
  // itself, a few steps later). vLLM's gate (scheduler_reserve_full_isl) counts the admitted
  // request's own prompt alone, and so does vllm accounting.
  const bool reserve_others =
      config.reserve_full_prompt && config.kv.mode == AccountingMode::kKvpage;
  int64_t outstanding = reserve_others ? RunningPromptTokensLeft() : 0;
  CollectBatchLoras();
  size_t skipped = 0;  // waiting requests passed over for their adapter (they keep their place)
  while (budget > 0 && static_cast<int32_t>(running.size()) < config.max_num_seqs) {
    if (skipped >= waiting.size()) break;
    const int32_t q = *std::next(waiting.begin(), static_cast<std::ptrdiff_t>(skipped));
    SchedRequest& r = reqs[q];
    if (!LoraFits(r.lora_id)) {
      ++skipped;
      continue;
    }
    const CacheHit hit = Admit(r);
    if (!r.in_manager) break;
    if (StartLoad(q)) continue;  // it waits for its loads outside the queue
    const int64_t c = hit.num_tokens;
    const int64_t remaining = r.num_tokens - c;
    // A request that cannot start stays in the cache without blocks (its hashes are kept) and
    // asks for its hit again next step; nothing is scheduled ahead of it.
    if (!config.enable_chunked_prefill && remaining > budget) break;
    r.num_computed = c;
    r.chunk_stop = hit.match_tokens;
    const int32_t n = TokensToSchedule(r, budget);
    const AllocationRequest req{
        .num_computed_tokens = c,
        .num_new_tokens = n,
        .num_reserve_tokens = config.reserve_full_prompt ? remaining - n + outstanding : 0,
        .hit = c > 0 ? &hit : nullptr};
    if (!AllocateAdmission(q, req)) {
      r.num_computed = 0;
      break;  // waiting requests never preempt running ones
    }
    if (reserve_others) outstanding += remaining - n;
    StartRunning(q, c, n, budget);
  }
}

bool Scheduler::Impl::AllocateAdmission(int32_t q, const AllocationRequest& req) {
  const absl::StatusOr<bool> ok =
      req.num_new_tokens > 0 ? kv->AllocateSlots(reqs[q].kv, req) : false;
  KVPAGE_DCHECK(ok.ok());
  if (!ok.ok() || !*ok) return false;
  if (config.watermark > 0 && !running.empty() && OverWatermark()) {
    FreeKeepingTokens(q);  // give the blocks back
    return false;
  }
  return true;
}

void Scheduler::Impl::CollectBatchLoras() {
  batch_loras.clear();
  if (config.max_loras == 0) return;
  for (const int32_t q : running) {
    if (reqs[q].lora_id > 0) batch_loras.insert(reqs[q].lora_id);
  }
}

bool Scheduler::Impl::LoraFits(int64_t lora_id) const {
  return config.max_loras == 0 || lora_id <= 0 || batch_loras.contains(lora_id) ||
         static_cast<int32_t>(batch_loras.size()) < config.max_loras;
}

void Scheduler::Impl::StartRunning(int32_t q, int64_t hit_tokens, int32_t n, int64_t& budget) {
  SchedRequest& r = reqs[q];
  waiting.erase(q);
  if (config.max_loras > 0 && r.lora_id > 0) batch_loras.insert(r.lora_id);
  if (!r.resumed) {
    r.num_cached_tokens = hit_tokens;
    stats.admitted_prompt_tokens += r.num_tokens;
    stats.prefix_hit_tokens += hit_tokens;
    stats.host_hit_tokens += std::min(r.loaded_tokens, hit_tokens);
  }
  r.loaded_tokens = 0;
  r.status = RequestStatus::kRunning;
  r.fresh = true;
  running.push_back(q);
  TakeRow(q);
  RecordScheduled(q, n, 0, budget);
  RefreshNextEvent(r);
}

void Scheduler::Impl::BuildOutput(int64_t total_tokens) {
  SchedulerOutput& o = Out();
  o.step = step;
  o.num_rows = static_cast<int32_t>(running.size());
  o.row_moves.swap(pending_row_moves);
  pending_row_moves.clear();
  o.finished_ids.swap(pending_finished);
  pending_finished.clear();
  o.slots_to_zero = kv->TakeSlotsToZero();
  o.transfers = kv->TakeTransfers();
  const size_t rows = static_cast<size_t>(o.num_rows);
  o.requests.resize(scheduled.size());
  o.query_start_loc.resize(rows + 1);
  o.seq_lens.resize(rows);
  for (size_t a = 0; a < attention.size(); ++a) {
    AttentionBatch& batch = o.attention[a];
    batch.block_table = absl::MakeConstSpan(attention[a].table.data(), rows * attention[a].stride);
    batch.slot_mapping.resize(static_cast<size_t>(total_tokens));
  }
  for (StateBatch& sb : o.states) {
    sb.read_slots.assign(rows, -1);
    sb.write_slots.assign(rows, -1);
  }
  // Rows in order; a row's tokens follow the previous row's.
  int32_t tokens = 0;
  size_t k = 0;  // index in o.requests
  bool one_each = true;
  for (size_t row = 0; row < rows; ++row) {
    o.query_start_loc[row] = tokens;
    const int32_t q = row_owner[row];
    if (reqs[q].scheduled_step != step) {
      o.seq_lens[row] = 0;
      continue;
    }
    scheduled[k] = q;  // from now on in the output's order
    SchedRequest& r = reqs[q];
    if (r.row_stale) SyncRow(r);
    for (size_t i = 0; i < state_groups.size(); ++i) {
      const absl::StatusOr<StateSlots> slots = kv->GetStateSlots(r.kv, state_groups[i]);
      KVPAGE_DCHECK(slots.ok());
      o.states[i].read_slots[row] = slots.ok() ? slots->read_slot : -1;
      o.states[i].write_slots[row] = slots.ok() ? slots->write_slot : -1;
    }
    tokens += WriteRow(r, row, o.requests[k]);
    one_each &= o.requests[k].samples;
    ++k;
  }
  // With speculative decoding, Update also takes the drafts for the next step.
  o.one_sample_each = one_each && config.num_speculative_tokens == 0;
  KVPAGE_DCHECK(k == scheduled.size() && tokens == total_tokens);
  o.query_start_loc[rows] = tokens;
  o.total_num_scheduled_tokens = tokens;
  for (size_t a = 0; a < attention.size(); ++a) {
    WriteSlots(attention[a], o.attention[a]);
    WriteTableRuns(attention[a], o.attention[a]);
  }
  PadForCudaGraph();
}

void Scheduler::Impl::WriteSlots(const GroupInfo& g, AttentionBatch& batch) {
  // A token's slot is KvCacheManager::SlotOf its cache block, whatever the kernel block size
  // (the row holds kernel block b·r + j, the j-th part of cache block b).
  const int64_t bs = g.block_size;
  const SchedulerOutput& out = Out();
  for (const ScheduledRequest& sr : out.requests) {
    const size_t row = static_cast<size_t>(sr.row);
    const internal::RowSync& sync = g.sync[row];
    const int32_t* table = g.table.data() + row * g.stride;
    int64_t* slots = batch.slot_mapping.data() + out.query_start_loc[row];
    const int64_t c = sr.num_computed_tokens;
    const int64_t last_block_start = (sync.blocks - 1) * bs;
    for (int64_t pos = c; pos < c + sr.num_scheduled_tokens; ++pos) {
      slots[pos - c] = pos >= last_block_start && sync.blocks > 0
                           ? pos + sync.last_block_offset
                           : KvCacheManager::SlotOf(BlockId(table[pos / bs * g.ratio] / g.ratio),
                                                    bs, pos);
    }
  }
}

int32_t Scheduler::Impl::WriteRow(SchedRequest& r, size_t row, ScheduledRequest& sr) {
  const int32_t n = r.num_scheduled;
  const int64_t c = r.num_computed - n;
  sr.id = r.id;
  sr.row = static_cast<int32_t>(row);
  sr.is_new = r.fresh;
  sr.resumed = r.fresh && r.resumed;
  sr.num_computed_tokens = c;
  sr.num_scheduled_tokens = n;
  sr.num_draft_tokens = r.num_scheduled_drafts;
  sr.samples = r.num_computed - r.num_scheduled_drafts >= r.num_tokens + r.num_placeholders;
  // Until Update applies the step (async scheduling: a later step may be scheduled first, at
  // the position of the token this one samples).
  r.num_in_flight += n;
  r.num_placeholders += sr.samples ? 1 : 0;
  r.fresh = false;
  r.resumed = false;
  Out().seq_lens[row] = static_cast<int32_t>(c + n);
  return n;
}

}  // namespace kvpage
