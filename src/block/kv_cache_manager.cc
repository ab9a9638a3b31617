#include "kvpage/kv_cache_manager.h"

#include <algorithm>
#include <array>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "block/manager_impl.h"
#include "internal/prefetch.h"
#include "internal/status_macros.h"
#include "model/kv_sizing.h"
#include "profile/step_phases.h"

namespace kvpage {

using internal::GroupLayout;
using internal::GroupState;
using internal::RequestState;

namespace {

absl::Status UnknownRequest(RequestId id) {
  return absl::NotFoundError(absl::StrCat("unknown request ", id.value));
}

absl::Status NegativeToken(int32_t token) {
  return absl::InvalidArgumentError(absl::StrCat("token id ", token, " is negative"));
}

// An append that would give the request `num_tokens` tokens.
absl::Status PastMaxModelLen(RequestId id, int64_t num_tokens, int64_t max_model_len) {
  return absl::OutOfRangeError(absl::StrCat("request ", id.value, " would have ", num_tokens,
                                            " tokens, more than max_model_len ",
                                            max_model_len));
}

}  // namespace

absl::StatusOr<std::unique_ptr<KvCacheManager>> KvCacheManager::Create(
    const ModelSpec& model, const KvCacheConfig& config) {
  KVPAGE_ASSIGN_OR_RETURN(std::unique_ptr<Impl> impl, Impl::Build(model, config));
  return std::unique_ptr<KvCacheManager>(new KvCacheManager(std::move(impl)));
}

KvCacheManager::KvCacheManager(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
KvCacheManager::~KvCacheManager() = default;

const KvCacheConfig& KvCacheManager::config() const { return impl_->config; }
int32_t KvCacheManager::num_groups() const { return static_cast<int32_t>(impl_->groups.size()); }
int64_t KvCacheManager::num_requests() const { return static_cast<int64_t>(impl_->requests.size()); }
bool KvCacheManager::HasRequest(RequestId id) const { return impl_->requests.contains(id); }

LayerKind KvCacheManager::group_kind(GroupId group) const {
  return impl_->groups.at(group.value).kind;
}
int32_t KvCacheManager::group_block_size(GroupId group) const {
  return impl_->groups.at(group.value).block_size;
}
int32_t KvCacheManager::group_window(GroupId group) const {
  const internal::GroupLayout& g = impl_->groups.at(group.value);
  return g.kind == LayerKind::kSlidingWindow ? g.window : 0;
}

// ---- Requests ----

absl::Status KvCacheManager::AddRequest(KvRequestSpec spec) {
  Impl& m = *impl_;
  if (!spec.id.valid()) {
    return absl::InvalidArgumentError(absl::StrCat("request id must be >= 0, got ", spec.id.value));
  }
  if (m.requests.contains(spec.id)) {
    return absl::AlreadyExistsError(absl::StrCat("request ", spec.id.value, " already exists"));
  }
  if (spec.prompt_tokens.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("request ", spec.id.value, " has an empty prompt"));
  }
  if (static_cast<int64_t>(spec.prompt_tokens.size()) > m.max_model_len) {
    return absl::OutOfRangeError(absl::StrCat("request ", spec.id.value, " has ",
                                              spec.prompt_tokens.size(),
                                              " prompt tokens, more than max_model_len ",
                                              m.max_model_len));
  }
  for (size_t i = 0; i < spec.prompt_tokens.size(); ++i) {
    if (spec.prompt_tokens[i] < 0) {
      return absl::InvalidArgumentError(absl::StrCat("request ", spec.id.value, " token ", i,
                                                     " is negative (", spec.prompt_tokens[i], ")"));
    }
  }
  for (size_t i = 1; i < spec.extras.mm_items.size(); ++i) {
    if (spec.extras.mm_items[i].offset < spec.extras.mm_items[i - 1].offset) {
      return absl::InvalidArgumentError(
          absl::StrCat("request ", spec.id.value, " multimodal items are not sorted by offset"));
    }
  }
  auto st = std::make_unique<RequestState>(spec.id, m.block_size,
                                           std::move(spec.extras), &m.arena);
  // Room for generated tokens (as much as the caller reserved, at least a quarter of the
  // prompt), so the first decode steps do not copy the prompt.
  const std::vector<int32_t>& prompt = spec.prompt_tokens;
  st->tokens.reserve(std::max(prompt.capacity(),
                              prompt.size() + std::max<size_t>(256, prompt.size() / 4)));
  st->tokens.assign(prompt.begin(), prompt.end());
  st->prompt_len = static_cast<int64_t>(st->tokens.size());
  st->skip_prefix_cache_read = spec.skip_prefix_cache_read;
  st->groups.resize(m.groups.size());
  st->hashes.Update(*m.hasher, st->tokens);
  if (m.free_handles.empty()) {
    m.free_handles.push_back(static_cast<int32_t>(m.by_handle.size()));
    m.by_handle.push_back(nullptr);
    m.handle_ids.push_back(RequestId(-1));
    m.summaries.emplace_back();
    m.token_counts.push_back(0);
    m.token_tails.resize(m.token_tails.size() + static_cast<size_t>(m.block_size));
    m.cache_hash_hint.emplace_back();
    m.completion_due.push_back(0);
    m.append_counts.push_back(0);
  }
  st->handle = m.free_handles.back();
  m.free_handles.pop_back();
  m.by_handle[st->handle] = st.get();
  m.handle_ids[st->handle] = spec.id;
  m.token_counts[st->handle] = st->prompt_len;  // the vector holds every token
  m.RefreshSummary(*st);
  m.requests.emplace(spec.id, std::move(st));
  return absl::OkStatus();
}

int32_t KvCacheManager::Impl::HandleOfId(RequestId id) const {
  auto it = requests.find(id);
  return it == requests.end() ? -1 : it->second->handle;
}

int32_t KvCacheManager::RequestHandle(RequestId id) const { return impl_->HandleOfId(id); }

absl::StatusOr<absl::Span<const int32_t>> KvCacheManager::Tokens(RequestId id) const {
  auto it = impl_->requests.find(id);
  if (it == impl_->requests.end()) return UnknownRequest(id);
  impl_->FlushTokens(*it->second);  // changes no token and no count
  return absl::MakeConstSpan(it->second->tokens);
}

absl::Status KvCacheManager::AppendTokens(RequestId id, absl::Span<const int32_t> tokens) {
  auto it = impl_->requests.find(id);
  if (it == impl_->requests.end()) return UnknownRequest(id);
  RequestState& st = *it->second;
  const int64_t held = impl_->NumTokens(st);
  if (tokens.size() == 1 && tokens[0] >= 0 && held < impl_->max_model_len) {
    impl_->PushToken(st.handle, tokens[0]);  // the decode case: no range insert
    return absl::OkStatus();
  }
  if (held + static_cast<int64_t>(tokens.size()) > impl_->max_model_len) {
    return PastMaxModelLen(id, held + static_cast<int64_t>(tokens.size()), impl_->max_model_len);
  }
  for (int32_t t : tokens) {
    if (t < 0) return NegativeToken(t);
  }
  impl_->FlushTokens(st);
  st.tokens.insert(st.tokens.end(), tokens.begin(), tokens.end());
  st.hashes.Update(*impl_->hasher, st.tokens);
  impl_->token_counts[st.handle] = static_cast<int64_t>(st.tokens.size());
  return absl::OkStatus();
}

absl::Status KvCacheManager::AppendDecodeTokens(absl::Span<const DecodeToken> tokens) {
  KVPAGE_STEP_PHASE(StepPhase::kAppendDecodeTokens);
  Impl& m = *impl_;
  // One pass checks each token and appends it to its request's tail (a flat per-handle
  // array, so this pass reads no request state). Appends are undone if a later entry is bad:
  // until a completed block moves out of its tail, an append is only a count. A request named
  // again after its token completed a block would overwrite that tail; the rare batch that
  // does so is undone and taken by the two-pass path.
  const size_t n = tokens.size();
  std::vector<int32_t>& handles = m.scratch_indices;
  std::vector<int32_t>& completed = m.scratch_completed;
  handles.resize(n);
  completed.clear();
  auto undo = [&](size_t appended) {
    for (size_t i = 0; i < appended; ++i) --m.token_counts[handles[i]];
    for (int32_t h : completed) m.completion_due[h] = 0;
    completed.clear();
  };
  const DecodeToken* const entries = tokens.data();  // (Span's operator[] checks bounds)
  for (size_t i = 0; i < n; ++i) {
    const DecodeToken& t = entries[i];
    const int32_t h = m.HandleOf(t.id, t.handle);
    if (h < 0 || t.token < 0 || m.token_counts[h] >= m.max_model_len ||
        m.completion_due[h]) {
      undo(i);
      if (h < 0) return UnknownRequest(t.id);
      if (t.token < 0) return NegativeToken(t.token);
      // Too long (counting the request's earlier tokens in the batch), or named again after
      // completing a block: the two-pass path reports the first, or appends.
      return m.AppendDecodeTokensInTwoPasses(tokens);
    }
    handles[i] = h;
    if (m.AppendToTail(h, t.token)) m.DeferCompletion(h, completed);
  }
  m.CompleteBlocks(completed);
  return absl::OkStatus();
}

// ---- DecodeAppender ----

KvCacheManager::DecodeAppender KvCacheManager::StartDecodeAppend() {
  return DecodeAppender(impl_.get());
}

KvCacheManager::DecodeAppender::DecodeAppender(Impl* impl) : impl_(impl) {
  impl->scratch_completed.clear();
  if (impl->block_mask < 0 || impl->summaries.empty()) return;  // every append is slow
  num_handles_ = static_cast<uint32_t>(impl->handle_ids.size());
  ids_ = impl->handle_ids.data();
  due_ = impl->completion_due.data();
  counts_ = impl->token_counts.data();
  tails_ = impl->token_tails.data();
  tail_stride_ = static_cast<size_t>(impl->block_size);
  tail_mask_ = impl->block_mask;
  max_model_len_ = impl->max_model_len;
}

void KvCacheManager::DecodeAppender::Completed(uint32_t h) {
  impl_->DeferCompletion(static_cast<int32_t>(h), impl_->scratch_completed);
}

absl::Status KvCacheManager::DecodeAppender::AppendSlow(RequestId id, int32_t handle,
                                                        int32_t token) {
  Impl& m = *impl_;
  const int32_t h = m.HandleOf(id, handle);
  if (h < 0) return UnknownRequest(id);
  if (token < 0) return NegativeToken(token);
  const int64_t held = m.token_counts[h];
  if (held >= m.max_model_len) return PastMaxModelLen(id, held + 1, m.max_model_len);
  m.AppendDeferringCompletion(h, token, m.scratch_completed);
  return absl::OkStatus();
}

void KvCacheManager::DecodeAppender::Finish() {
  if (impl_ == nullptr) return;
  impl_->CompleteBlocks(impl_->scratch_completed);
  impl_->scratch_completed.clear();
  impl_ = nullptr;
}

absl::Status KvCacheManager::Impl::AppendDecodeTokensInTwoPasses(
    absl::Span<const DecodeToken> tokens) {
  // Check everything first (all or nothing): append_counts[h] counts the tokens so far in the
  // batch for the request with handle h.
  const size_t n = tokens.size();
  std::vector<int32_t>& handles = scratch_indices;
  handles.resize(n);
  auto fail = [&](size_t checked, absl::Status status) {
    for (size_t i = 0; i < checked; ++i) append_counts[handles[i]] = 0;
    return status;
  };
  for (size_t i = 0; i < n; ++i) {
    const int32_t h = HandleOf(tokens[i].id, tokens[i].handle);
    if (h < 0) return fail(i, UnknownRequest(tokens[i].id));
    if (tokens[i].token < 0) return fail(i, NegativeToken(tokens[i].token));
    handles[i] = h;
    const int64_t num_tokens = token_counts[h] + append_counts[h]++;
    if (num_tokens >= max_model_len) {
      return fail(i + 1, PastMaxModelLen(tokens[i].id, num_tokens + 1, max_model_len));
    }
  }
  // Then the appends; a request named again after its block completed has that block
  // completed first (its tail is about to be reused).
  std::vector<int32_t>& completed = scratch_completed;
  completed.clear();
  for (size_t i = 0; i < n; ++i) {
    const int32_t h = handles[i];
    append_counts[h] = 0;
    AppendDeferringCompletion(h, tokens[i].token, completed);
  }
  CompleteBlocks(completed);
  return absl::OkStatus();
}

void KvCacheManager::Impl::CompleteBlocks(absl::Span<const int32_t> completed) {
  // Only a token that completes a block needs the request's state, to move the block into
  // the token vector and hash it: one token in block_size. The state line those completions
  // read first was fetched when each was deferred (DeferCompletion, which every completion
  // here went through); from it, the ends of the vectors are fetched D completions ahead.
  // The distance counts completions, each of which waits on misses, so the prefetches have
  // time to land; counted in tokens, they would not.
  KVPAGE_STEP_PHASE(StepPhase::kCompleteBlocks);
  constexpr size_t kD = 4;
  const size_t c = completed.size();
  for (size_t j = 0; j < std::min(c, kD); ++j) PrefetchFlushEnds(completed[j]);
  for (size_t j = 0; j < c; ++j) {
    if (j + kD < c) PrefetchFlushEnds(completed[j + kD]);
    CompleteBlock(completed[j]);
    completion_due[completed[j]] = 0;
  }
}

absl::Status KvCacheManager::RollbackTokens(RequestId id, int64_t num_tokens) {
  Impl& m = *impl_;
  auto it = m.requests.find(id);
  if (it == m.requests.end()) return UnknownRequest(id);
  RequestState& st = *it->second;
  const int64_t keep = m.NumTokens(st) - num_tokens;
  if (num_tokens < 0 || keep < st.prompt_len) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot roll back ", num_tokens, " tokens of request ", id.value, ": it has ",
        m.NumTokens(st) - st.prompt_len, " generated tokens"));
  }
  if (num_tokens == 0) return absl::OkStatus();
  if (m.has_state_groups && st.allocated) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot roll back request ", id.value, ": its linear-attention state already includes "
        "those tokens and has no checkpoint to return to"));
  }
  // Blocks that were full only with the dropped tokens were cached under hashes that are now
  // wrong. The request will rewrite them, so no other request may share them.
  const int64_t first = keep / m.block_size;
  for (const GroupLayout& g : m.groups) {
    if (!g.IsAttention()) continue;
    const GroupState& gs = st.groups[g.id.value];
    for (int64_t i = first; i < gs.num_cached_blocks; ++i) {
      const BlockId b = gs.blocks[i];
      if (b != kNullBlock && m.pools[g.pool]->ref_count(b) > 1) {
        return absl::FailedPreconditionError(absl::StrCat(
            "cannot roll back request ", id.value, ": block ", b.value, " of group ", g.id.value,
            " holding those tokens is shared with another request"));
      }
    }
  }
  for (const GroupLayout& g : m.groups) {
    if (!g.IsAttention()) continue;
    GroupState& gs = st.groups[g.id.value];
    for (int64_t i = first; i < gs.num_cached_blocks; ++i) {
      if (gs.blocks[i] != kNullBlock) m.pools[g.pool]->Uncache(gs.blocks[i]);
    }
    gs.num_cached_blocks = std::min(gs.num_cached_blocks, first);
  }
  m.FlushTokens(st);
  st.tokens.resize(keep);
  st.hashes.Truncate(keep);
  m.token_counts[st.handle] = keep;
  m.RefreshSummary(st);
  return absl::OkStatus();
}

absl::Status KvCacheManager::Free(RequestId id) {
  Impl& m = *impl_;
  auto it = m.requests.find(id);
  if (it == m.requests.end()) return UnknownRequest(id);
  m.FreeRequestBlocks(*it->second);
  std::erase(m.pending_commits, it->second.get());
  const int32_t handle = it->second->handle;
  m.by_handle[handle] = nullptr;
  m.handle_ids[handle] = RequestId(-1);
  m.free_handles.push_back(handle);
  m.requests.erase(it);
  return absl::OkStatus();
}

// ---- Steps ----

void KvCacheManager::NewStep() {
  Impl& m = *impl_;
  for (RequestState* st : m.pending_commits) m.CommitStep(*st);
  m.pending_commits.clear();
}

absl::StatusOr<CacheHit> KvCacheManager::GetComputedBlocks(RequestId id) {
  Impl& m = *impl_;
  auto it = m.requests.find(id);
  if (it == m.requests.end()) return UnknownRequest(id);
  const RequestState& st = *it->second;
  if (st.allocated) {
    return absl::FailedPreconditionError(
        absl::StrCat("request ", id.value, " already holds blocks"));
  }
  CacheHit hit = m.FindLongestHit(st);
  if (m.config.enable_prefix_caching && !st.skip_prefix_cache_read) {
    ++m.stats.queries;
    m.stats.queried_tokens += m.NumTokens(st);
    m.stats.hit_tokens += hit.num_tokens;
  }
  return hit;
}

namespace {

// A miss (num_tokens == 0) passed as a hit is the same as no hit.
AllocationRequest WithoutEmptyHit(const AllocationRequest& request) {
  AllocationRequest r = request;
  if (r.hit != nullptr && r.hit->num_tokens == 0) r.hit = nullptr;
  return r;
}

}  // namespace

absl::StatusOr<bool> KvCacheManager::AllocateSlots(RequestId id, const AllocationRequest& request) {
  auto it = impl_->requests.find(id);
  if (it == impl_->requests.end()) return UnknownRequest(id);
  return impl_->Allocate(*it->second, WithoutEmptyHit(request));
}

absl::StatusOr<int64_t> KvCacheManager::AllocateDecodeStep(absl::Span<const DecodeStep> steps,
                                                           absl::Span<DecodeHorizon> horizons) {
  KVPAGE_STEP_PHASE(StepPhase::kAllocateDecodeStep);
  Impl& m = *impl_;
  const bool want_horizons = !horizons.empty();
  if (want_horizons && horizons.size() != steps.size()) {
    return absl::InvalidArgumentError(absl::StrCat("horizons has ", horizons.size(),
                                                   " entries for ", steps.size(), " steps"));
  }
  // First resolve every id (an unknown id is reported before anything changes) and, from the
  // flat per-handle summaries, set aside the requests whose step needs nothing: in steady
  // decode all but the few that fill or cross a block. Skipping them early changes nothing:
  // their steps would leave every table as it is.
  const size_t n = steps.size();
  // Written by index into arrays sized for every step (no capacity checks per entry), through
  // raw pointers held in locals: a vector's own pointer would be reloaded after each store the
  // loops make to memory it could alias.
  m.scratch_indices.resize(n);
  m.scratch_states.resize(n);
  m.scratch_handles.resize(n);
  m.scratch_kinds.resize(n);
  m.scratch_computed.resize(n);
  int32_t* const work = m.scratch_indices.data();  // steps that need the manager
  RequestState** const states = m.scratch_states.data();
  int32_t* const handles = m.scratch_handles.data();
  Impl::DecodeStepKind* const kinds = m.scratch_kinds.data();
  int64_t* const computed = m.scratch_computed.data();  // the steps' num_computed_tokens
  size_t w = 0;
  // Raw pointers in the loops: Span's operator[] checks bounds (hardened Abseil).
  const DecodeStep* const step_at = steps.data();
  DecodeHorizon* const horizon_at = horizons.data();
  // The pool records each crossing's block takes, fetched into L2 as the crossing is found:
  // the serve loop's own prefetch, a few takes ahead, is too late for them
  // (BlockPool::TakePrefetcher).
  // (Two named prefetchers, not an array indexed in the loop: they stay in registers.)
  const size_t prefetch_pools = m.one_block_takes ? m.pools.size() : 0;  // at most 2
  BlockPool::TakePrefetcher take_prefetch0, take_prefetch1;
  if (prefetch_pools > 0) take_prefetch0 = BlockPool::TakePrefetcher(*m.pools[0]);
  if (prefetch_pools > 1) take_prefetch1 = BlockPool::TakePrefetcher(*m.pools[1]);
  for (size_t i = 0; i < n; ++i) {
    const DecodeStep& step = step_at[i];
    const int32_t h = m.HandleOf(step.id, step.handle);
    if (h < 0) return UnknownRequest(step.id);
    const Impl::DecodeSummary& s = m.summaries[h];
    const int64_t num_tokens = m.token_counts[h];
    const int64_t c = step.num_computed_tokens;
    // One comparison tells the cases apart: a step that ends within the tables has nothing
    // to do or caches a block; one that ends past them crosses into a new block.
    Impl::DecodeStepKind kind;
    if (c + step.num_new_tokens <= s.covered_tokens) {
      if (m.SummaryNothingToDo(s, num_tokens, c, step.num_new_tokens, /*processed=*/c)) {
        if (want_horizons) horizon_at[i] = m.HorizonOf(s);
        continue;
      }
      kind = Impl::kGeneralStep;
      if (m.SummaryPureCache(s, num_tokens, c, step.num_new_tokens)) {
        kind = Impl::kPureCache;
        m.PrefetchHintedCacheSlots(h);
      }
    } else {
      kind = m.SummaryPureCross(s, num_tokens, c, step.num_new_tokens) ? Impl::kPureCross
                                                                        : Impl::kGeneralStep;
      if (kind == Impl::kPureCross) {
        take_prefetch0.PrefetchNext();  // nothing for a prefetcher of no pool
        take_prefetch1.PrefetchNext();
      }
    }
    work[w] = static_cast<int32_t>(i);
    states[w] = m.by_handle[h];
    handles[w] = h;
    kinds[w] = kind;
    computed[w] = c;
    ++w;
  }
  // Then the rest, in order, through a software pipeline of four prefetch stages, each
  // reading only what the stage before loaded kD requests earlier: (1) the state, with the
  // records of its first two groups; (2) the records of any further groups (a model with more
  // than two); (3) its table ends, next block hash and, when a sliding window is due to
  // release a block, that table entry; (4) the prefix-cache slot the next full block takes
  // and the pool record of the block to release. Request j is served while request j + 4·kD
  // is being fetched, so the misses of consecutive requests overlap. A pure crossing reads
  // only each group's table header and end (it pushes one block) and, when it goes through
  // TakeCrossingBlocks (G = 0 below), the state's first line.
  //
  // With one_block_takes, G is the number of groups (one or two; 0 = any other model), and
  // pure crossings take their blocks through OneBlockTakes, one per pool, opened at the first
  // crossing and finished before a step that takes or frees blocks any other way (pure cache
  // steps leave them open: caching a block reads no free structure).
  constexpr size_t kD = 4;
  auto serve = [&](auto num_groups) -> absl::StatusOr<int64_t> {
    constexpr size_t G = decltype(num_groups)::value;
    const size_t groups = G > 0 ? G : m.groups.size();
    // A crossing through OneBlockTakes does not read the state's first line; one through
    // TakeCrossingBlocks does, and so do all of them while a pool has no clean block.
    bool crossings_read_state = G == 0;
    for (size_t g = 0; g < G; ++g) crossings_read_state |= m.pools[g]->num_clean_blocks() == 0;
    auto state = [&](size_t j) __attribute__((always_inline)) {
      m.PrefetchState(states[j], kinds[j] == Impl::kPureCross, crossings_read_state, groups);
    };
    // The first two groups' records are inside the state (RequestState::groups): PrefetchState
    // fetched them.
    auto group_records = [&](size_t j) __attribute__((always_inline)) {
      if (G > 0 || groups <= 2) return;
      const char* g = reinterpret_cast<const char*>(states[j]->groups.data());
      const size_t group_bytes = groups * sizeof(GroupState);
      if (kinds[j] == Impl::kPureCross) {
        for (size_t off = 0; off < group_bytes; off += sizeof(GroupState)) Prefetch(g + off);
      } else {
        for (size_t off = 0; off < group_bytes; off += 64) Prefetch(g + off);
      }
    };
    auto tables = [&](size_t j) __attribute__((always_inline)) {
      if (kinds[j] == Impl::kPureCross) {
        const GroupState* const records = states[j]->groups.data();
        for (size_t g = 0; g < groups; ++g) {
          PrefetchForWrite(records[g].blocks.data() + records[g].blocks.size());
        }
      } else {
        m.PrefetchStepTables(*states[j], computed[j]);
      }
    };
    // A pure crossing caches nothing; it reads a pool record only for a due window release.
    // A pure cache step (one pool per group) reads the records of the block each group
    // caches; the first pass fetched the map's bucket from the hint.
    const bool windows = m.has_windows;
    auto pools = [&](size_t j) __attribute__((always_inline)) {
      if (kinds[j] == Impl::kPureCross) {
        if (windows && computed[j] >= m.summaries[handles[j]].next_release) {
          m.PrefetchStepPools(*states[j], computed[j]);
        }
        return;
      }
      const RequestState& st = *states[j];
      if (kinds[j] == Impl::kPureCache) {
        const int64_t i = st.cached_blocks;
        const GroupState* const records = st.groups.data();
        for (size_t g = 0; g < m.pools.size(); ++g) {
          const std::vector<BlockId>& blocks = records[g].blocks;
          if (i < static_cast<int64_t>(blocks.size())) {
            m.pools[g]->PrefetchCacheRecords(blocks[i]);
          }
        }
        return;
      }
      m.PrefetchStepPools(st, computed[j]);
    };
    // Prime the pipeline: request j has been through the stages below level L when
    // j < (5−L)·kD.
    for (size_t j = 0; j < std::min(w, 4 * kD); ++j) state(j);
    for (size_t j = 0; j < std::min(w, 3 * kD); ++j) group_records(j);
    for (size_t j = 0; j < std::min(w, 2 * kD); ++j) tables(j);
    for (size_t j = 0; j < std::min(w, kD); ++j) pools(j);
    std::array<BlockPool::OneBlockTakes, G> takes;
    bool taking = false;
    auto finish_takes = [&] {
      if (!taking) return;
      for (BlockPool::OneBlockTakes& t : takes) t.Finish();
      taking = false;
    };
    for (size_t j = 0; j < w; ++j) {
      if (j + 4 * kD < w) state(j + 4 * kD);
      if (j + 3 * kD < w) group_records(j + 3 * kD);
      if (j + 2 * kD < w) tables(j + 2 * kD);
      if (j + kD < w) pools(j + kD);
      RequestState& st = *states[j];
      const int64_t c = computed[j];
      bool fast;
      if (kinds[j] == Impl::kPureCross) {
        if constexpr (G > 0) {
          // Open only when every pool has a clean block: a pool that grows (maps a chunk for
          // each block) has none, and its crossings go straight to TakeCrossingBlocks.
          if (!taking) {
            bool clean = true;
            for (size_t g = 0; g < G; ++g) clean &= m.pools[g]->num_clean_blocks() > 0;
            if (clean) {
              for (size_t g = 0; g < G; ++g) takes[g] = BlockPool::OneBlockTakes(*m.pools[g]);
              taking = true;
            }
          }
          if (taking) {
            if (m.TakeCrossingBlocksFrom<G>(st, handles[j], c, takes)) {
              if (want_horizons) {
                horizon_at[work[j]] = m.HorizonOf(m.summaries[handles[j]]);
              }
              continue;
            }
            finish_takes();
          }
        }
        fast = m.TakeCrossingBlocks(st, c);
      } else {
        // Caching a block reads none of a pool's free structures: open takes may stay open.
        fast = kinds[j] == Impl::kPureCache && m.CacheNextBlock(st, c);
      }
      if (!fast) {
        finish_takes();
        const AllocationRequest req{.num_computed_tokens = c,
                                    .num_new_tokens = step_at[work[j]].num_new_tokens};
        KVPAGE_ASSIGN_OR_RETURN(bool ok, m.Allocate(st, req));
        if (!ok) return static_cast<int64_t>(work[j]);
      }
      if (want_horizons) horizon_at[work[j]] = m.HorizonOf(m.summaries[handles[j]]);
    }
    finish_takes();
    return static_cast<int64_t>(n);
  };
  if (m.one_block_takes) {
    if (m.groups.size() == 1) return serve(std::integral_constant<size_t, 1>());
    return serve(std::integral_constant<size_t, 2>());
  }
  return serve(std::integral_constant<size_t, 0>());
}

absl::StatusOr<DecodeHorizon> KvCacheManager::QuietDecodeHorizon(RequestId id,
                                                                 int32_t handle) const {
  const Impl& m = *impl_;
  const int32_t h = m.HandleOf(id, handle);
  if (h < 0) return UnknownRequest(id);
  return m.HorizonOf(m.summaries[h]);
}

absl::StatusOr<int64_t> KvCacheManager::BlocksNeeded(RequestId id,
                                                     const AllocationRequest& request) const {
  auto it = impl_->requests.find(id);
  if (it == impl_->requests.end()) return UnknownRequest(id);
  return impl_->CountNeeded(*it->second, WithoutEmptyHit(request));
}

absl::Status KvCacheManager::RemoveSkippedBlocks(RequestId id, int64_t num_processed_tokens,
                                                 int32_t handle) {
  RequestState* st = impl_->Find(id, handle);
  if (st == nullptr) return UnknownRequest(id);
  if (num_processed_tokens < 0 || num_processed_tokens > impl_->NumTokens(*st)) {
    return absl::InvalidArgumentError(absl::StrCat("num_processed_tokens ", num_processed_tokens,
                                                   " is outside [0, ", impl_->NumTokens(*st),
                                                   "]"));
  }
  impl_->ReleaseSkipped(*st, num_processed_tokens);
  return absl::OkStatus();
}

// ---- Tables ----

absl::StatusOr<absl::Span<const BlockId>> KvCacheManager::BlockTable(RequestId id, GroupId group,
                                                                     int32_t handle) const {
  const RequestState* st = impl_->Find(id, handle);
  if (st == nullptr) return UnknownRequest(id);
  if (group.value < 0 || group.value >= num_groups() || !impl_->groups[group.value].IsAttention()) {
    return absl::InvalidArgumentError(absl::StrCat("group ", group.value, " is not an attention group"));
  }
  return absl::Span<const BlockId>(st->groups[group.value].blocks);
}

absl::Span<const BlockId> KvCacheManager::BlockTableOrEmpty(RequestId id, GroupId group,
                                                            int32_t handle) const {
  const RequestState* st = impl_->Find(id, handle);
  if (st == nullptr || static_cast<uint32_t>(group.value) >= impl_->groups.size() ||
      !impl_->groups[group.value].IsAttention()) {
    return {};
  }
  return absl::Span<const BlockId>(st->groups[group.value].blocks);
}

absl::Status KvCacheManager::FillBlockTableRow(RequestId id, GroupId group,
                                               int32_t kernel_block_size,
                                               absl::Span<int32_t> row) const {
  KVPAGE_ASSIGN_OR_RETURN(absl::Span<const BlockId> table, BlockTable(id, group));
  const int32_t bs = impl_->groups[group.value].block_size;
  if (kernel_block_size <= 0 || bs % kernel_block_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("kernel block size ", kernel_block_size,
                                                   " does not divide block size ", bs));
  }
  const int64_t ratio = bs / kernel_block_size;
  if (static_cast<int64_t>(table.size()) * ratio > static_cast<int64_t>(row.size())) {
    return absl::InvalidArgumentError(absl::StrCat("row of ", row.size(), " entries cannot hold ",
                                                   table.size() * ratio, " kernel blocks"));
  }
  size_t k = 0;
  for (BlockId b : table) {
    for (int64_t j = 0; j < ratio; ++j) row[k++] = static_cast<int32_t>(b.value * ratio + j);
  }
  std::fill(row.begin() + k, row.end(), 0);
  return absl::OkStatus();
}

absl::Status KvCacheManager::FillSlotMapping(RequestId id, GroupId group, int64_t start,
                                             absl::Span<int64_t> out) const {
  KVPAGE_ASSIGN_OR_RETURN(absl::Span<const BlockId> table, BlockTable(id, group));
  const int64_t bs = impl_->groups[group.value].block_size;
  for (size_t i = 0; i < out.size(); ++i) {
    const int64_t pos = start + static_cast<int64_t>(i);
    const int64_t index = pos / bs;
    if (pos < 0 || index >= static_cast<int64_t>(table.size()) || table[index] == kNullBlock) {
      return absl::InvalidArgumentError(absl::StrCat("request ", id.value, " holds no block for position ",
                                                     pos, " in group ", group.value));
    }
    out[i] = int64_t{table[index].value} * bs + pos % bs;
  }
  return absl::OkStatus();
}

absl::StatusOr<StateSlots> KvCacheManager::GetStateSlots(RequestId id, GroupId group) const {
  auto it = impl_->requests.find(id);
  if (it == impl_->requests.end()) return UnknownRequest(id);
  if (group.value < 0 || group.value >= num_groups() ||
      impl_->groups[group.value].kind != LayerKind::kLinearAttention) {
    return absl::InvalidArgumentError(absl::StrCat("group ", group.value, " is not a linear-attention group"));
  }
  const GroupState& gs = it->second->groups[group.value];
  return StateSlots{gs.read, gs.write};
}

std::vector<StateCopy> KvCacheManager::TakeStateCopies() {
  std::vector<StateCopy> out;
  out.swap(impl_->state_copies);
  return out;
}

std::vector<SlotToZero> KvCacheManager::TakeSlotsToZero() {
  std::vector<SlotToZero> out;
  out.swap(impl_->slots_to_zero);
  return out;
}

// ---- Accounting ----

KvCacheUsage KvCacheManager::Usage() const {
  const Impl& m = *impl_;
  KvCacheUsage u;
  u.budget_bytes = m.budget->total_bytes();
  u.mapped_bytes = m.budget->used_bytes();
  for (const GroupLayout& g : m.groups) {
    const BlockPool& pool = *m.pools[g.pool];
    PoolUsage p;
    p.group = g.id;
    p.kind = g.kind;
    p.block_bytes = pool.block_bytes();
    p.used_blocks = pool.num_used_blocks();
    p.cached_free_blocks = pool.num_cached_free_blocks();
    p.clean_blocks = pool.num_clean_blocks();
    p.mapped_chunks = pool.num_mapped_chunks();
    u.pools.push_back(p);
  }
  for (const auto& pool : m.pools) u.used_bytes += int64_t{pool->num_used_blocks()} * pool->block_bytes();
  u.usage = u.budget_bytes > 0 ? static_cast<double>(u.used_bytes) / u.budget_bytes : 0.0;
  return u;
}

std::vector<BlockId> KvCacheManager::FreeBlockOrder(GroupId group) const {
  return impl_->pools[impl_->groups.at(group.value).pool]->FreeOrder();
}

PrefixCacheStats KvCacheManager::prefix_cache_stats() const { return impl_->stats; }
std::vector<KvEvent> KvCacheManager::DrainEvents() { return impl_->events.Drain(); }

absl::Status KvCacheManager::ResetPrefixCache() {
  for (const auto& pool : impl_->pools) {
    if (pool->num_used_blocks() > 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot reset the prefix cache while ", pool->num_used_blocks(), " blocks are in use"));
    }
  }
  for (const auto& pool : impl_->pools) KVPAGE_RETURN_IF_ERROR(pool->ResetPrefixCache());
  return absl::OkStatus();
}

absl::Status KvCacheManager::EvictCachedBlock(GroupId group, BlockId block) {
  if (group.value < 0 || group.value >= num_groups()) {
    return absl::InvalidArgumentError(absl::StrCat("unknown group ", group.value));
  }
  BlockPool& pool = *impl_->pools[impl_->groups[group.value].pool];
  if (block.value <= 0 || block.value > pool.capacity()) {
    return absl::InvalidArgumentError(absl::StrCat("block ", block.value, " is not in group ",
                                                   group.value, "'s pool"));
  }
  pool.Uncache(block);
  return absl::OkStatus();
}

absl::Status KvCacheManager::CheckInvariants() const {
  const Impl& m = *impl_;
  int64_t mapped_bytes = 0;
  std::vector<std::vector<int32_t>> refs(m.pools.size());
  for (size_t p = 0; p < m.pools.size(); ++p) {
    KVPAGE_RETURN_IF_ERROR(m.pools[p]->CheckInvariants());
    mapped_bytes += int64_t{m.pools[p]->num_mapped_chunks()} * m.pools[p]->chunk_bytes();
    refs[p].assign(m.pools[p]->capacity() + 1, 0);
  }
  if (mapped_bytes != m.budget->used_bytes()) {
    return absl::InternalError(absl::StrCat("pools map ", mapped_bytes, " bytes but the budget lent ",
                                            m.budget->used_bytes()));
  }
  // Handles: one per live request, naming it both ways; the rest are free.
  if (m.by_handle.size() != m.requests.size() + m.free_handles.size()) {
    return absl::InternalError(absl::StrCat(m.by_handle.size(), " handles for ", m.requests.size(),
                                            " requests and ", m.free_handles.size(), " free"));
  }
  for (const auto& [id, st] : m.requests) {
    if (st->handle < 0 || m.by_handle[st->handle] != st.get() || m.handle_ids[st->handle] != id) {
      return absl::InternalError(absl::StrCat("request ", id.value, " has a broken handle ", st->handle));
    }
    if (!(m.summaries[st->handle] == m.MakeSummary(*st))) {
      return absl::InternalError(absl::StrCat("request ", id.value, "'s decode summary is stale"));
    }
  }
  // AppendDecodeTokens' per-handle scratch is clear between calls.
  for (size_t h = 0; h < m.completion_due.size(); ++h) {
    if (m.completion_due[h] != 0 || m.append_counts[h] != 0) {
      return absl::InternalError(absl::StrCat("handle ", h, " keeps decode-append scratch: ",
                                              int{m.completion_due[h]}, " completions due, ",
                                              m.append_counts[h], " tokens counted"));
    }
  }
  for (const auto& [id, st] : m.requests) {
    // The vector holds every token up to the last full block at least; the tail, the rest.
    const int64_t num_tokens = m.NumTokens(*st);
    const int64_t in_vector = static_cast<int64_t>(st->tokens.size());
    if (in_vector > num_tokens || in_vector < num_tokens / m.block_size * m.block_size ||
        in_vector < st->prompt_len) {
      return absl::InternalError(absl::StrCat("request ", id.value, " has ", num_tokens,
                                              " tokens, ", in_vector, " of them in its vector"));
    }
    const int64_t full_blocks = num_tokens / m.block_size;
    if (static_cast<int64_t>(st->hashes.hashes().size()) != full_blocks) {
      return absl::InternalError(absl::StrCat("request ", id.value, " has ", st->hashes.hashes().size(),
                                              " block hashes for ", full_blocks, " full blocks"));
    }
    for (const GroupLayout& g : m.groups) {
      const GroupState& gs = st->groups[g.id.value];
      std::vector<int32_t>& r = refs[g.pool];
      auto count = [&](int32_t b) -> absl::Status {
        if (b < 0) return absl::OkStatus();
        if (b == 0 || b >= static_cast<int32_t>(r.size()) || !m.pools[g.pool]->is_mapped(BlockId(b))) {
          return absl::InternalError(absl::StrCat("request ", id.value, " group ", g.id.value,
                                                  " holds invalid block ", b));
        }
        ++r[b];
        return absl::OkStatus();
      };
      for (BlockId b : gs.blocks) {
        if (b != kNullBlock) KVPAGE_RETURN_IF_ERROR(count(b.value));
      }
      KVPAGE_RETURN_IF_ERROR(count(gs.cur));
      if (gs.step_pending && gs.write != gs.cur) KVPAGE_RETURN_IF_ERROR(count(gs.write));
      for (int32_t slot : gs.extra) KVPAGE_RETURN_IF_ERROR(count(slot));
    }
  }
  for (size_t p = 0; p < m.pools.size(); ++p) {
    for (int32_t b = 1; b < static_cast<int32_t>(refs[p].size()); ++b) {
      if (refs[p][b] != m.pools[p]->ref_count(BlockId(b))) {
        return absl::InternalError(absl::StrCat("pool ", p, " block ", b, " has ref count ",
                                                m.pools[p]->ref_count(BlockId(b)), " but requests hold ",
                                                refs[p][b], " references"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace kvpage
