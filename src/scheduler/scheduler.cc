// Scheduler: configuration, requests, queues, Update and invariants.
#include "kvpage/scheduler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "internal/status_macros.h"
#include "internal/token_ids.h"
#include "scheduler/scheduler_impl.h"

namespace kvpage {

using internal::RequestStatus;
using internal::SchedRequest;

absl::string_view FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kMaxModelLen:
      return "max_model_len";
    case FinishReason::kAborted:
      return "aborted";
  }
  return "unknown";
}

absl::Status SchedulerConfig::Validate() const {
  if (max_num_batched_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_num_batched_tokens must be >= 1, got ", max_num_batched_tokens));
  }
  if (max_num_seqs < 1) {
    return absl::InvalidArgumentError(absl::StrCat("max_num_seqs must be >= 1, got ", max_num_seqs));
  }
  if (max_loras < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_loras must be >= 0 (0 = no limit), got ", max_loras));
  }
  if (max_model_len < 0 || max_model_len > kMaxSchedulerModelLen) {
    return absl::InvalidArgumentError(absl::StrCat("max_model_len must be in [0, ",
                                                   kMaxSchedulerModelLen, "], got ",
                                                   max_model_len));
  }
  if (long_prefill_token_threshold < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "long_prefill_token_threshold must be >= 0, got ", long_prefill_token_threshold));
  }
  if (!(watermark >= 0.0 && watermark < 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat("watermark must be in [0, 1), got ", watermark));
  }
  if (num_speculative_tokens < 0 || num_speculative_tokens >= max_num_batched_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("num_speculative_tokens ",
                                                   num_speculative_tokens, " must be in [0, ",
                                                   max_num_batched_tokens, ")"));
  }
  if (async_scheduling && num_speculative_tokens > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "async_scheduling does not support speculative decoding: num_speculative_tokens must "
        "be 0, got ", num_speculative_tokens));
  }
  if (policy != SchedulingPolicy::kFcfs && policy != SchedulingPolicy::kPriority) {
    return absl::InvalidArgumentError(absl::StrCat("policy ", static_cast<int>(policy),
                                                   " is not a SchedulingPolicy"));
  }
  if (kernel_block_size < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("kernel_block_size must be >= 0, got ", kernel_block_size));
  }
  KVPAGE_RETURN_IF_ERROR(internal::ValidateCaptureSizes(
      "cuda_graph_row_sizes", cuda_graph_row_sizes, "max_num_seqs", max_num_seqs));
  return internal::ValidateCaptureSizes("cuda_graph_token_sizes", cuda_graph_token_sizes,
                                        "max_num_batched_tokens", max_num_batched_tokens);
}

bool internal::PriorityLess::operator()(int32_t a, int32_t b) const {
  const SchedRequest& x = (*reqs)[a];
  const SchedRequest& y = (*reqs)[b];
  if (x.priority != y.priority) return x.priority > y.priority;
  if (x.arrival_time != y.arrival_time) return x.arrival_time > y.arrival_time;
  return x.seq > y.seq;
}

// ---- Construction ----

absl::StatusOr<std::unique_ptr<Scheduler::Impl>> Scheduler::Impl::Build(
    const ModelSpec& model, const SchedulerConfig& config) {
  KVPAGE_RETURN_IF_ERROR(config.Validate());
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  impl->waiting = std::set<int32_t, internal::WaitingOrder>(
      internal::WaitingOrder{&impl->reqs, config.policy == SchedulingPolicy::kFcfs});
  KvCacheConfig kv = config.kv;
  kv.max_num_batched_tokens = config.max_num_batched_tokens;
  kv.max_model_len = config.max_model_len;
  KVPAGE_ASSIGN_OR_RETURN(impl->kv, KvCacheManager::Create(model, kv));
  const KvCacheManager& m = *impl->kv;
  impl->max_model_len = m.config().max_model_len > 0 ? m.config().max_model_len
                                                      : model.max_position_embeddings;
  impl->max_model_len = std::min(impl->max_model_len, kMaxSchedulerModelLen);
  if (model.vocab_size > 0 && model.vocab_size < (int64_t{1} << 31)) {
    impl->token_limit = static_cast<uint32_t>(model.vocab_size);
  }
  for (int32_t g = 0; g < m.num_groups(); ++g) {
    GroupInfo info;
    info.id = GroupId(g);
    info.block_size = m.group_block_size(info.id);
    if (info.block_size == 0) {  // state slots, not a block table
      impl->state_groups.push_back(info.id);
      continue;
    }
    const int32_t kbs = config.kernel_block_size > 0 ? config.kernel_block_size : info.block_size;
    if (info.block_size % kbs != 0) {
      return absl::InvalidArgumentError(absl::StrCat("kernel_block_size ", kbs,
                                                     " does not divide the block size ",
                                                     info.block_size, " of group ", g));
    }
    info.ratio = info.block_size / kbs;
    impl->attention.push_back(std::move(info));
  }
  impl->prefill_alignment = m.prefill_alignment();
  if (!m.can_roll_back() && config.num_speculative_tokens > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_speculative_tokens ", config.num_speculative_tokens, " is not supported for ",
        model.name, ": its KV cache cannot roll back rejected drafts (a layer keeps one state "
        "that every step overwrites)"));
  }
  if (!config.enable_chunked_prefill && impl->max_model_len > config.max_num_batched_tokens) {
    // A prompt runs in one step: a longer one could never be scheduled, and would block the
    // queue behind it.
    if (config.max_model_len > 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "max_model_len ", config.max_model_len, " exceeds max_num_batched_tokens ",
          config.max_num_batched_tokens, " with chunked prefill off: such a prompt never runs"));
    }
    impl->max_model_len = config.max_num_batched_tokens;
  }
  KVPAGE_RETURN_IF_ERROR(impl->FitMaxModelLen(config.max_model_len > 0));
  // The probes left their chunks mapped (idle): memory follows what requests use. (vLLM holds
  // every block from the start, its free queue in id order: vllm accounting keeps them.)
  impl->kv->CompleteStep();  // the probes' step: no step is pending, so the release runs now
  if (config.kv.mode == AccountingMode::kKvpage) impl->kv->ReleaseIdleChunks();
  impl->InitTables();
  return impl;
}

bool Scheduler::Impl::RequestFits(int64_t len) {
  // What the growing groups alone need rules most lengths out without building a prompt.
  if (kv->MinBytesFor(len) > config.kv.kv_budget_bytes) return false;
  // A probe request of `len` tokens goes through the real allocator, in steps of the token
  // budget with windows advancing, as a prompt would; then everything is given back.
  const RequestId probe(std::numeric_limits<int64_t>::max());  // no request exists yet
  KvRequestSpec spec;
  spec.id = probe;
  spec.prompt_tokens.resize(static_cast<size_t>(len));
  const int64_t vocab = std::min<int64_t>(token_limit, 65536);  // ids the model accepts
  for (int64_t i = 0; i < len; ++i) spec.prompt_tokens[i] = static_cast<int32_t>(i % vocab);
  const absl::StatusOr<RequestHandle> h = kv->AddRequest(std::move(spec));
  if (!h.ok()) return false;
  // Admitted as a waiting request is (the whole prompt reserved when the scheduler does so),
  // then computed chunk by chunk.
  bool fits = true;
  for (int64_t c = 0; c < len && fits;) {
    const int64_t n = std::min<int64_t>(config.max_num_batched_tokens, len - c);
    const int64_t reserve = c == 0 && config.reserve_full_prompt ? len - n : 0;
    const absl::StatusOr<bool> ok = kv->AllocateSlots(
        *h, {.num_computed_tokens = c, .num_new_tokens = n, .num_reserve_tokens = reserve});
    fits = ok.ok() && *ok;
    c += n;
    DropTransfers();  // the probe's made-up blocks are not worth a host slot
  }
  const bool clean = kv->Free(*h).ok() && (DropTransfers(), kv->ResetPrefixCache().ok());
  KVPAGE_DCHECK(clean);
  (void)clean;
  kv->TakeSlotsToZero();
  kv->DrainEvents();
  return fits;
}

void Scheduler::Impl::DropTransfers() {
  const TierTransfers t = kv->TakeTransfers();
  if (t.id != 0) {
    [[maybe_unused]] const absl::Status dropped = kv->CompleteTransfers(t.id, /*succeeded=*/false);
    KVPAGE_DCHECK(dropped.ok());
  }
}

absl::Status Scheduler::Impl::FitMaxModelLen(bool explicit_len) {
  if (RequestFits(max_model_len)) return absl::OkStatus();
  KVPAGE_RETURN_IF_ERROR(ProbeBackingStatus());
  if (explicit_len) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_model_len ", max_model_len, " does not fit in the KV cache budget of ",
        config.kv.kv_budget_bytes, " bytes: one request of that length could never run"));
  }
  // The model's own limit: lower it to the longest request the cache can hold (vLLM fails
  // here instead and asks for a smaller max_model_len).
  if (!RequestFits(2)) {
    KVPAGE_RETURN_IF_ERROR(ProbeBackingStatus());
    return absl::ResourceExhaustedError(absl::StrCat(
        "the KV cache budget of ", config.kv.kv_budget_bytes, " bytes cannot hold a 2-token request"));
  }
  int64_t lo = 2, hi = max_model_len;  // fits(lo), !fits(hi)
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (RequestFits(mid) ? lo : hi) = mid;
    KVPAGE_RETURN_IF_ERROR(ProbeBackingStatus());
  }
  max_model_len = lo;
  return absl::OkStatus();
}

Scheduler::Scheduler(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Scheduler::~Scheduler() = default;

absl::StatusOr<std::unique_ptr<Scheduler>> Scheduler::Create(const ModelSpec& model,
                                                             const SchedulerConfig& config) {
  KVPAGE_ASSIGN_OR_RETURN(std::unique_ptr<Impl> impl, Impl::Build(model, config));
  return std::unique_ptr<Scheduler>(new Scheduler(std::move(impl)));
}

// ---- Requests ----

namespace {

using internal::BadToken;
using internal::DescribeBadToken;

absl::Status ValidateRequest(const RequestSpec& spec, int64_t max_model_len, uint32_t limit) {
  if (!spec.id.valid()) {
    return absl::InvalidArgumentError(absl::StrCat("request id must be >= 0, got ", spec.id.value));
  }
  if (spec.prompt_token_ids.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("request ", spec.id.value, " has an empty prompt"));
  }
  for (int32_t t : spec.prompt_token_ids) {
    if (BadToken(t, limit)) {
      return absl::InvalidArgumentError(
          absl::StrCat("request ", spec.id.value, " prompt: ", DescribeBadToken(t, limit)));
    }
  }
  if (!std::isfinite(spec.arrival_time)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "request ", spec.id.value, ": arrival_time must be finite, got ", spec.arrival_time));
  }
  if (spec.max_new_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat("request ", spec.id.value,
                                                   ": max_new_tokens must be >= 1, got ",
                                                   spec.max_new_tokens));
  }
  const int64_t len = static_cast<int64_t>(spec.prompt_token_ids.size());
  if (len >= max_model_len) {
    return absl::OutOfRangeError(absl::StrCat("request ", spec.id.value, " has a ", len,
                                              "-token prompt; max_model_len ", max_model_len,
                                              " leaves no room for an output token"));
  }
  if (!spec.mm_items.empty()) {
    BlockHashExtras extras;
    extras.mm_items = spec.mm_items;
    if (absl::Status items = extras.Validate(len); !items.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("request ", spec.id.value, ": ", items.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Scheduler::AddRequest(RequestSpec spec) {
  Impl& s = *impl_;
  KVPAGE_RETURN_IF_ERROR(ValidateRequest(spec, s.max_model_len, s.token_limit));
  if (s.index_of.contains(spec.id)) {
    return absl::AlreadyExistsError(absl::StrCat("request ", spec.id.value, " already exists"));
  }
  int32_t q;
  if (!s.free_indices.empty()) {
    q = s.free_indices.back();
    s.free_indices.pop_back();
  } else {
    q = static_cast<int32_t>(s.reqs.size());
    s.reqs.emplace_back();
  }
  SchedRequest& r = s.reqs[q];
  const int64_t len = static_cast<int64_t>(spec.prompt_token_ids.size());
  r = SchedRequest{};
  r.id = spec.id;
  r.tokens = std::move(spec.prompt_token_ids);
  r.num_tokens = len;
  r.prompt_len = len;
  r.max_new_tokens = spec.max_new_tokens;
  r.length_limit = std::min<int64_t>(s.max_model_len, len + spec.max_new_tokens);
  r.stop_token_ids = std::move(spec.stop_token_ids);
  r.has_stop_tokens = !r.stop_token_ids.empty();
  r.priority = spec.priority;
  r.arrival_time = spec.arrival_time;
  r.seq = s.next_seq++;
  r.cache_salt = std::move(spec.cache_salt);
  r.lora_id = spec.lora_id;
  r.mm_items = std::move(spec.mm_items);
  r.skip_prefix_cache_read = spec.skip_prefix_cache_read;
  s.index_of.emplace(r.id, q);
  s.PushWaiting(q, /*front=*/false);
  return absl::OkStatus();
}

absl::Status Scheduler::Abort(RequestId id) {
  absl::StatusOr<int32_t> q = impl_->Remove(id);
  if (!q.ok()) return q.status();
  ++impl_->stats.aborted;
  impl_->Release(*q);
  return absl::OkStatus();
}

absl::StatusOr<FinishedRequest> Scheduler::Finish(RequestId id, FinishReason reason) {
  Impl& s = *impl_;
  absl::StatusOr<int32_t> q = s.Remove(id);
  if (!q.ok()) return q.status();
  const SchedRequest& r = s.reqs[*q];
  const FinishedRequest finished{r.id, reason, static_cast<int32_t>(r.NumOutput()),
                                 std::max<int64_t>(0, r.num_cached_tokens)};
  ++(reason == FinishReason::kAborted ? s.stats.aborted : s.stats.finished);
  s.Release(*q);
  return finished;
}

absl::StatusOr<int32_t> Scheduler::Impl::Remove(RequestId id) {
  auto it = index_of.find(id);
  if (it == index_of.end()) {
    return absl::NotFoundError(absl::StrCat("request ", id.value, " is not queued or running"));
  }
  const int32_t q = it->second;
  ForgetInOutputs(q);
  if (reqs[q].status == RequestStatus::kWaiting || reqs[q].status == RequestStatus::kLoading) {
    waiting.erase(q);
    std::erase(loading, q);
    // A load in flight keeps its blocks until its transfer completes.
    if (reqs[q].in_manager) KVPAGE_RETURN_IF_ERROR(kv->Free(reqs[q].kv));
  } else {
    // The server may not have run the latest output yet: its block tables must not change
    // under it when the last row moves into this one's place.
    if (outstanding() > 0) FreezeOutputTables();
    LeaveRunning(q);
  }
  pending_finished.push_back(id);
  return q;
}

// ---- Queues ----

void Scheduler::Impl::PushWaiting(int32_t q, bool front) {
  reqs[q].status = RequestStatus::kWaiting;
  reqs[q].queue_key = front ? --front_key : ++back_key;
  waiting.insert(q);
}

void Scheduler::Impl::ForgetInOutputs(int32_t q) {
  // Scheduled in a step not yet applied: Update drops whatever the server sampled for it.
  if (outstanding() > 0) std::replace(scheduled.begin(), scheduled.end(), q, -1);
  if (outstanding() > 1) std::replace(prev_scheduled.begin(), prev_scheduled.end(), q, -1);
}

void Scheduler::Impl::FreezeOutputTables() {
  SchedulerOutput& out = Out();
  frozen_tables.resize(out.attention.size());
  for (size_t a = 0; a < out.attention.size(); ++a) {
    absl::Span<const int32_t>& table = out.attention[a].block_table;
    if (table.data() == frozen_tables[a].data()) continue;  // frozen by an earlier abort
    frozen_tables[a].assign(table.begin(), table.end());
    table = absl::MakeConstSpan(frozen_tables[a]);
  }
}

void Scheduler::Impl::LeaveRunning(int32_t q) {
  SchedRequest& r = reqs[q];
  const absl::Status freed = kv->Free(r.kv);
  KVPAGE_DCHECK(freed.ok());
  (void)freed;
  r.in_manager = false;
  FreeRow(q);
  running.erase(std::find(running.begin(), running.end(), q));
  r.status = RequestStatus::kWaiting;
}

void Scheduler::Impl::FreeKeepingTokens(int32_t q) {
  SchedRequest& r = reqs[q];
  const absl::StatusOr<absl::Span<const int32_t>> tokens = kv->Tokens(r.kv);
  KVPAGE_DCHECK(tokens.ok());
  if (tokens.ok()) r.tokens.assign(tokens->begin(), tokens->end());
  const absl::Status freed = kv->Free(r.kv);
  KVPAGE_DCHECK(freed.ok());
  (void)freed;
  r.in_manager = false;
}

void Scheduler::Impl::Release(int32_t q) {
  SchedRequest& r = reqs[q];
  index_of.erase(r.id);
  r = SchedRequest{};
  free_indices.push_back(q);
}

// ---- Update ----

namespace {

absl::Status CheckCsr(absl::Span<const int32_t> offsets, size_t values, size_t rows,
                      absl::string_view name) {
  if (offsets.empty() && values == 0) return absl::OkStatus();
  if (offsets.size() != rows + 1 || offsets.front() != 0 ||
      static_cast<size_t>(offsets.back()) != values) {
    return absl::InvalidArgumentError(absl::StrCat(name, " offsets must have ", rows + 1,
                                                   " entries from 0 to ", values, ", got ",
                                                   offsets.size(), " entries"));
  }
  for (size_t i = 0; i < rows; ++i) {
    if (offsets[i + 1] < offsets[i]) {
      return absl::InvalidArgumentError(absl::StrCat(name, " offsets decrease at ", i));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckTokenIds(absl::Span<const int32_t> tokens, uint32_t limit,
                           absl::string_view name) {
  for (int32_t t : tokens) {
    if (BadToken(t, limit)) {
      return absl::InvalidArgumentError(absl::StrCat(name, " ", DescribeBadToken(t, limit)));
    }
  }
  return absl::OkStatus();
}

int32_t CsrCount(absl::Span<const int32_t> offsets, size_t i) {
  return offsets.empty() ? 0 : offsets[i + 1] - offsets[i];
}

// Puts the finishing requests (all running) in running order, in one pass over `running`.
void SortByRunningOrder(const std::vector<int32_t>& running,
                        std::vector<std::pair<int32_t, FinishReason>>& finishing) {
  if (finishing.size() < 2) return;
  absl::flat_hash_map<int32_t, FinishReason> reason(finishing.begin(), finishing.end());
  finishing.clear();
  for (int32_t q : running) {
    if (auto it = reason.find(q); it != reason.end()) finishing.emplace_back(q, it->second);
  }
}

}  // namespace

absl::Status Scheduler::Impl::CheckModelOutput(const SchedulerOutput& output,
                                               const ModelOutput& result,
                                               absl::Span<const int32_t> indices) const {
  const size_t n = output.requests.size();
  const size_t num_sampled = result.sampled_token_ids.size();
  if (result.sampled_offsets.empty()) {
    // Left out: every request samples one token, in order, or none samples.
    if (num_sampled != 0 && !(output.one_sample_each && num_sampled == n)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sampled offsets are empty with ", num_sampled, " sampled tokens for ", n,
          " scheduled requests: they may be left out only when every request samples one token "
          "(SchedulerOutput::one_sample_each)"));
    }
  } else {
    KVPAGE_RETURN_IF_ERROR(CheckCsr(result.sampled_offsets, num_sampled, n, "sampled"));
  }
  // One token for each request of a batch in which every request samples is right as it is.
  const bool one_each = result.sampled_offsets.empty() && output.one_sample_each && num_sampled == n;
  for (size_t i = 0; i < n && !one_each; ++i) {
    const ScheduledRequest& sr = output.requests[i];
    const int32_t k = result.sampled_offsets.empty() ? (num_sampled == n ? 1 : 0)
                                                     : CsrCount(result.sampled_offsets, i);
    if (sr.samples ? k >= 1 && k <= sr.num_draft_tokens + 1 : k == 0) continue;
    // Aborted since Schedule: whatever the server sampled for it (or not) is dropped.
    if (k == 0 && indices[i] < 0) continue;
    if (!sr.samples) {
      return absl::InvalidArgumentError(absl::StrCat(
          "request ", sr.id.value, " computed a prompt chunk and samples nothing, got ", k, " tokens"));
    }
    return absl::InvalidArgumentError(absl::StrCat("request ", sr.id.value, " must sample 1 to ",
                                                   sr.num_draft_tokens + 1, " tokens, got ", k));
  }
  if (config.num_speculative_tokens == 0 && !result.draft_token_ids.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the model output carries ", result.draft_token_ids.size(),
        " draft tokens but speculative decoding is off (num_speculative_tokens 0)"));
  }
  KVPAGE_RETURN_IF_ERROR(CheckCsr(result.draft_offsets, result.draft_token_ids.size(), n, "draft"));
  KVPAGE_RETURN_IF_ERROR(CheckDraftCounts(output, result));
  KVPAGE_RETURN_IF_ERROR(CheckTokenIds(result.sampled_token_ids, token_limit, "sampled"));
  return CheckTokenIds(result.draft_token_ids, token_limit, "draft");
}

void Scheduler::Impl::Finish(int32_t q, FinishReason reason, UpdateResult& update) {
  SchedRequest& r = reqs[q];
  update.finished.push_back({r.id, reason, static_cast<int32_t>(r.NumOutput()),
                             std::max<int64_t>(0, r.num_cached_tokens)});
  pending_finished.push_back(r.id);
  if (r.status == RequestStatus::kRunning) {
    // Async scheduling: a later output, maybe not run yet, may hold its row.
    if (outstanding() > 1) {
      std::replace(scheduled.begin(), scheduled.end(), q, -1);
      FreezeOutputTables();
    }
    LeaveRunning(q);
  } else {
    waiting.erase(q);  // preempted while its step was in flight (holds no blocks)
  }
  Release(q);
  ++stats.finished;
}

namespace {

// Why a request that just reached a stop token or its length limit ends.
FinishReason EndReason(const SchedRequest& r, bool stopped) {
  if (stopped) return FinishReason::kStop;
  return r.NumOutput() >= r.max_new_tokens ? FinishReason::kLength : FinishReason::kMaxModelLen;
}

bool IsStopToken(const SchedRequest& r, int32_t token) {
  return std::find(r.stop_token_ids.begin(), r.stop_token_ids.end(), token) !=
         r.stop_token_ids.end();
}

// How many of the k sampled tokens a request keeps: up to the first that ends it, by length or
// a stop token (which is output too). A sampling request is below its length limit.
int32_t KeptTokens(const SchedRequest& r, const int32_t* sampled, int32_t k, bool* stopped) {
  int32_t keep = static_cast<int32_t>(std::clamp<int64_t>(r.length_limit - r.num_tokens, 1, k));
  *stopped = false;
  for (int32_t j = 0; r.has_stop_tokens && j < keep; ++j) {
    if (IsStopToken(r, sampled[j])) {
      *stopped = true;
      return j + 1;
    }
  }
  return keep;
}

}  // namespace

void Scheduler::Impl::ApplyStaleSamples(int32_t q, const int32_t* sampled, int32_t k,
                                        UpdateResult& update) {
  // The request starts over when it resumes, its outputs recomputed: the tokens only join
  // them, and may end it (as vLLM delivers a preempted request's output in flight).
  SchedRequest& r = reqs[q];
  KVPAGE_DCHECK(!r.in_manager);  // preempted in the step after: no waiting pass admitted it
  for (int32_t j = 0; j < k; ++j) {
    r.tokens.push_back(sampled[j]);
    ++r.num_tokens;
    const bool stopped = IsStopToken(r, sampled[j]);
    if (stopped || r.num_tokens >= r.length_limit) {
      Finish(q, EndReason(r, stopped), update);
      return;
    }
  }
}

void Scheduler::Impl::ApplySamples(const SchedulerOutput& output, const ModelOutput& result,
                                   absl::Span<const int32_t> indices, UpdateResult& update) {
  const bool has_offsets = !result.sampled_offsets.empty();
  const bool drafts = config.num_speculative_tokens > 0;
  // One-token appends go to the KV cache together, written in place (at most one a request).
  append_tokens.resize(output.requests.size());
  size_t appended = 0;
  finishing.clear();
  for (size_t i = 0; i < output.requests.size(); ++i) {
    const ScheduledRequest& sr = output.requests[i];
    const int32_t q = indices[i];
    if (q < 0) continue;
    SchedRequest& r = reqs[q];
    const bool stale = r.status != RequestStatus::kRunning;  // preempted since (async)
    if (!stale) r.num_in_flight -= sr.num_scheduled_tokens;
    if (!sr.samples) continue;
    const int32_t k = has_offsets ? CsrCount(result.sampled_offsets, i) : 1;
    const int32_t* sampled =
        result.sampled_token_ids.data() + (has_offsets ? result.sampled_offsets[i] : i);
    if (stale) {
      ApplyStaleSamples(q, sampled, k, update);
      continue;
    }
    --r.num_placeholders;
    if (config.async_scheduling) {
      // The steps applied so far wrote blocks whose last token was a placeholder when they
      // were allocated: cached now that it is known (vLLM's cache_blocks after an output).
      [[maybe_unused]] const absl::Status cached =
          kv->CacheComputedBlocks(r.kv, r.NumProcessed());
      KVPAGE_DCHECK(cached.ok());
    }
    if (drafts) {
      const int32_t rejected = sr.num_draft_tokens - (k - 1);
      r.num_computed -= rejected;
      update.stats.num_rejected_drafts += rejected;
      update.stats.num_accepted_drafts += k - 1;
    }
    bool stopped = false;
    const int32_t keep = KeptTokens(r, sampled, k, &stopped);
    r.num_tokens += keep;
    if (stopped || r.num_tokens >= r.length_limit) {
      finishing.emplace_back(q, EndReason(r, stopped));  // after the appends, in this order
      continue;
    }
    if (keep == 1) {
      append_tokens[appended++] = DecodeToken{r.kv, sampled[0]};
    } else {
      [[maybe_unused]] const absl::Status status =
          kv->AppendTokens(r.kv, {sampled, static_cast<size_t>(keep)});
      KVPAGE_DCHECK(status.ok());  // lengths were checked against max_model_len above
    }
    if (!drafts) continue;  // r.num_drafts stays 0
    const int32_t d = CsrCount(result.draft_offsets, i);
    const int64_t room = max_model_len - r.num_tokens - config.num_speculative_tokens;
    r.num_drafts = static_cast<int32_t>(std::clamp<int64_t>(
        std::min<int64_t>(d, config.num_speculative_tokens), 0, std::max<int64_t>(0, room)));
  }
  [[maybe_unused]] const absl::Status status =
      kv->AppendDecodeTokens({append_tokens.data(), appended});
  KVPAGE_DCHECK(status.ok());  // every request is running, lengths were checked above
  // vLLM frees finished requests in the order it scheduled them (running order), and that
  // order sets their blocks' places in the free queue; the output's rows need not follow it.
  if (config.kv.mode == AccountingMode::kVllm) SortByRunningOrder(running, finishing);
  for (const auto& [q, reason] : finishing) Finish(q, reason, update);
}

absl::StatusOr<UpdateResult> Scheduler::Update(const SchedulerOutput& output,
                                               const ModelOutput& result) {
  Impl& s = *impl_;
  // Outputs apply in order: the oldest not applied (async: the latest's other buffer when two
  // are outstanding).
  const uint64_t expected = s.applied_step + 1;
  const bool latest = expected == s.step;
  const SchedulerOutput* want = latest ? &s.Out() : &s.outputs[s.cur ^ 1];
  if (s.outstanding() == 0 || &output != want || output.step != expected) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Update expects the output of Schedule() step ", expected, " (each output once, in "
        "order; the latest step is ", s.step, "), got step ", output.step));
  }
  const std::vector<int32_t>& indices = latest ? s.scheduled : s.prev_scheduled;
  KVPAGE_RETURN_IF_ERROR(s.CheckModelOutput(output, result, indices));
  // The forward pass has run: the blocks it filled become prefix hits, before finished
  // requests free them. (Async scheduling: the next Schedule() completed this step in the KV
  // cache when it started its own; the later step may not have run.)
  if (latest) s.kv->CompleteStep();
  UpdateResult update;
  s.ApplySamples(output, result, indices, update);
  s.applied_step = expected;
  update.stats.num_running = static_cast<int32_t>(s.running.size());
  update.stats.num_waiting = num_waiting();
  update.stats.num_scheduled_tokens = output.total_num_scheduled_tokens;
  update.stats.num_preempted = static_cast<int32_t>(output.preempted_ids.size());
  return update;
}

bool Scheduler::HasUnfinishedRequests() const { return !impl_->index_of.empty(); }
int32_t Scheduler::num_running() const { return static_cast<int32_t>(impl_->running.size()); }
absl::Status Scheduler::CompleteTransfers(uint64_t id, bool succeeded) {
  Impl& s = *impl_;
  KVPAGE_RETURN_IF_ERROR(s.kv->CompleteTransfers(id, succeeded));
  // Loaded requests go back to the queue under their old key: their place in it.
  std::erase_if(s.loading, [&s, succeeded](int32_t q) {
    SchedRequest& r = s.reqs[q];
    const absl::StatusOr<bool> loading = s.kv->IsLoading(r.kv);
    if (loading.ok() && *loading) return false;
    r.host_load_failed |= !succeeded;
    if (!succeeded) r.loaded_tokens = 0;
    r.status = RequestStatus::kWaiting;
    s.waiting.insert(q);
    return true;
  });
  return absl::OkStatus();
}

int32_t Scheduler::num_waiting() const {
  return static_cast<int32_t>(impl_->waiting.size() + impl_->loading.size());
}
const SchedulerStats& Scheduler::stats() const { return impl_->stats; }
const KvCacheManager& Scheduler::kv_cache() const { return *impl_->kv; }
std::vector<KvEvent> Scheduler::DrainKvEvents() { return impl_->kv->DrainEvents(); }
int64_t Scheduler::ReleaseIdleChunks() { return impl_->kv->ReleaseIdleChunks(); }
const SchedulerConfig& Scheduler::config() const { return impl_->config; }
int64_t Scheduler::max_model_len() const { return impl_->max_model_len; }

absl::Status Scheduler::CheckInvariants() const {
  const Impl& s = *impl_;
  KVPAGE_RETURN_IF_ERROR(s.kv->CheckInvariants());
  const std::vector<int32_t> waiting(s.waiting.begin(), s.waiting.end());
  size_t live = 0;
  int64_t in_manager = 0;
  for (size_t q = 0; q < s.reqs.size(); ++q) {
    const SchedRequest& r = s.reqs[q];
    if (r.status == RequestStatus::kFree) continue;
    ++live;
    auto it = s.index_of.find(r.id);
    if (it == s.index_of.end() || it->second != static_cast<int32_t>(q)) {
      return absl::InternalError(absl::StrCat("request ", r.id.value, " is not indexed"));
    }
    const int64_t in_waiting =
        std::count(waiting.begin(), waiting.end(), static_cast<int32_t>(q)) +
        std::count(s.loading.begin(), s.loading.end(), static_cast<int32_t>(q));
    const int64_t in_running = std::count(s.running.begin(), s.running.end(), static_cast<int32_t>(q));
    const bool is_running = r.status == RequestStatus::kRunning;
    if (in_waiting != (is_running ? 0 : 1) || in_running != (is_running ? 1 : 0)) {
      return absl::InternalError(absl::StrCat("request ", r.id.value, " is queued ", in_waiting,
                                              " times and running ", in_running, " times"));
    }
    if ((is_running && !r.in_manager) || s.kv->Find(r.id).has_value() != r.in_manager) {
      return absl::InternalError(absl::StrCat("request ", r.id.value,
                                              " disagrees with the KV cache on being admitted"));
    }
    in_manager += r.in_manager ? 1 : 0;
    if (is_running) {
      // The kept NextEvent must be the cache's: a stale one could skip a step that needs it.
      const absl::StatusOr<int64_t> next = s.kv->NextEvent(r.kv);
      if (!next.ok() || *next != r.next_event) {
        return absl::InternalError(absl::StrCat("request ", r.id.value, " keeps next event ",
                                                r.next_event, " where the KV cache has ",
                                                next.ok() ? *next : -1));
      }
    }
    if (r.in_manager && s.kv->Find(r.id) != r.kv) {
      return absl::InternalError(absl::StrCat("request ", r.id.value, " has a stale cache handle"));
    }
    // Tokens live in exactly one place: the KV cache while it holds the request, here otherwise.
    const int64_t held = r.in_manager ? static_cast<int64_t>(s.kv->Tokens(r.kv)->size())
                                      : static_cast<int64_t>(r.tokens.size());
    if (held != r.num_tokens || (r.in_manager && !r.tokens.empty())) {
      return absl::InternalError(absl::StrCat("request ", r.id.value, " has ", r.num_tokens,
                                              " tokens but ", held, " are held"));
    }
    if (r.num_computed > r.num_tokens + r.num_placeholders + r.num_drafts +
                             s.config.num_speculative_tokens ||
        r.NumOutput() > r.max_new_tokens) {
      return absl::InternalError(absl::StrCat("request ", r.id.value, " computed ", r.num_computed,
                                              " of ", r.num_tokens, " tokens"));
    }
    if (r.length_limit != std::min<int64_t>(s.max_model_len, r.prompt_len + r.max_new_tokens)) {
      return absl::InternalError(absl::StrCat("request ", r.id.value, " has length limit ",
                                              r.length_limit, " for a prompt of ", r.prompt_len,
                                              " and ", r.max_new_tokens, " new tokens"));
    }
  }
  if (live != s.index_of.size() || live + s.free_indices.size() != s.reqs.size()) {
    return absl::InternalError("request index and free list disagree");
  }
  if (s.running.size() > static_cast<size_t>(s.config.max_num_seqs)) {
    return absl::InternalError(absl::StrCat(s.running.size(), " running requests exceed max_num_seqs"));
  }
  absl::flat_hash_set<int64_t> loras;
  for (const int32_t q : s.running) {
    if (s.reqs[q].lora_id > 0) loras.insert(s.reqs[q].lora_id);
  }
  if (s.config.max_loras > 0 && static_cast<int32_t>(loras.size()) > s.config.max_loras) {
    return absl::InternalError(absl::StrCat("running requests use ", loras.size(),
                                            " LoRA adapters, more than max_loras"));
  }
  if (s.kv->num_requests() != in_manager) {
    return absl::InternalError(absl::StrCat("the KV cache holds ", s.kv->num_requests(),
                                            " requests, the scheduler ", in_manager));
  }
  return s.CheckTables();
}

}  // namespace kvpage
