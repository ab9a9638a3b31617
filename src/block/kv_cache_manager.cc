// KvCacheManager's public API: requests and their tokens, steps, tables, accounting.
#include "kvpage/kv_cache_manager.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "block/manager_impl.h"
#include "internal/status_macros.h"
#include "internal/token_ids.h"

namespace kvpage {

using internal::GroupManager;
using internal::RequestState;

namespace {

using internal::BadToken;

absl::Status BadTokenError(int32_t token, uint32_t limit) {
  return absl::InvalidArgumentError(internal::DescribeBadToken(token, limit));
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
int64_t KvCacheManager::num_requests() const { return static_cast<int64_t>(impl_->slot_of.size()); }

// The group accessors answer a group id outside [0, num_groups()) with the values of no group
// (full attention, 0, 0, no blocks) rather than throwing.
const internal::GroupLayout* KvCacheManager::Impl::GroupLayoutOf(GroupId group) const {
  if (group.value < 0 || group.value >= static_cast<int32_t>(groups.size())) return nullptr;
  return &groups[group.value]->layout();
}

LayerKind KvCacheManager::group_kind(GroupId group) const {
  const internal::GroupLayout* g = impl_->GroupLayoutOf(group);
  return g != nullptr ? g->kind : LayerKind::kFullAttention;
}
int32_t KvCacheManager::group_block_size(GroupId group) const {
  const internal::GroupLayout* g = impl_->GroupLayoutOf(group);
  return g != nullptr ? g->block_size : 0;
}
int32_t KvCacheManager::group_window(GroupId group) const {
  return impl_->GroupLayoutOf(group) != nullptr ? impl_->groups[group.value]->window() : 0;
}

bool KvCacheManager::can_roll_back() const { return impl_->rolls_back; }
bool KvCacheManager::frees_skipped_blocks() const { return impl_->frees_skipped; }
int32_t KvCacheManager::prefill_alignment() const { return impl_->prefill_alignment; }

int64_t KvCacheManager::MinBytesFor(int64_t num_tokens) const {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  int64_t bytes = 0;
  for (const auto& g : impl_->groups) {
    const int64_t blocks = g->MinBlocksFor(std::max<int64_t>(num_tokens, 0));
    const int64_t block_bytes = g->pool().block_bytes();
    if (blocks == 0) continue;
    if (blocks > kMax / block_bytes - bytes / block_bytes) return kMax;
    bytes += blocks * block_bytes;
  }
  return bytes;
}

// ---- Requests ----

RequestState* KvCacheManager::Impl::Get(RequestHandle h) const {
  const uint32_t slot = static_cast<uint32_t>(h.slot_);
  if (h.manager_ != id || slot >= states.size() || generations[slot] != h.generation_) {
    return nullptr;
  }
  return states[slot].get();
}

absl::Status KvCacheManager::Impl::Stale(RequestHandle h) const {
  return absl::NotFoundError(absl::StrCat("request handle (slot ", h.slot_, ", generation ",
                                          h.generation_, ") names no live request"));
}

internal::RequestView KvCacheManager::Impl::View(const RequestState& st) const {
  internal::RequestView r{.slot = st.slot,
                          .hashes = st.hashes.hashes(),
                          .root = hasher->root(),
                          .prompt_len = st.prompt_len,
                          .allocated = st.allocated};
  if (events.enabled()) {  // what the events' detail reads (BlockPool::records_events)
    r.tokens = absl::MakeConstSpan(st.tokens.data(), st.tokens.size());
    r.lora_id = st.hashes.extras().lora_id;
  }
  return r;
}

namespace {

absl::Status ValidateSpec(const KvRequestSpec& spec, int64_t max_model_len, uint32_t token_limit) {
  if (!spec.id.valid()) {
    return absl::InvalidArgumentError(absl::StrCat("request id must be >= 0, got ", spec.id.value));
  }
  if (spec.prompt_tokens.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("request ", spec.id.value, " has an empty prompt"));
  }
  if (static_cast<int64_t>(spec.prompt_tokens.size()) > max_model_len) {
    return absl::OutOfRangeError(absl::StrCat("request ", spec.id.value, " has ",
                                              spec.prompt_tokens.size(),
                                              " prompt tokens, more than max_model_len ",
                                              max_model_len));
  }
  for (size_t i = 0; i < spec.prompt_tokens.size(); ++i) {
    if (BadToken(spec.prompt_tokens[i], token_limit)) {
      return absl::InvalidArgumentError(
          absl::StrCat("request ", spec.id.value, " prompt token ", i, ": ",
                       internal::DescribeBadToken(spec.prompt_tokens[i], token_limit)));
    }
  }
  if (absl::Status extras = spec.extras.Validate(static_cast<int64_t>(spec.prompt_tokens.size()));
      !extras.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("request ", spec.id.value, ": ",
                                                   extras.message()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<RequestHandle> KvCacheManager::AddRequest(KvRequestSpec spec) {
  Impl& m = *impl_;
  KVPAGE_RETURN_IF_ERROR(ValidateSpec(spec, m.max_model_len, m.token_limit));
  if (m.slot_of.contains(spec.id)) {
    return absl::AlreadyExistsError(absl::StrCat("request ", spec.id.value, " already exists"));
  }
  auto st = std::make_unique<RequestState>(spec.id, m.block_size, std::move(spec.extras), &m.arena);
  // Room for generated tokens (as much as the caller reserved, at least a quarter of the
  // prompt), so the first decode steps do not copy the prompt.
  const std::vector<int32_t>& prompt = spec.prompt_tokens;
  st->tokens.reserve(std::max(prompt.capacity(),
                              prompt.size() + std::max<size_t>(256, prompt.size() / 4)));
  st->tokens.assign(prompt.begin(), prompt.end());
  st->prompt_len = static_cast<int64_t>(st->tokens.size());
  st->skip_prefix_cache_read = spec.skip_prefix_cache_read;
  st->hashes.Update(*m.hasher, st->tokens);
  if (m.free_slots.empty()) {
    m.free_slots.push_back(static_cast<int32_t>(m.states.size()));
    m.states.emplace_back();
    m.generations.push_back(0);
    m.summaries.emplace_back();
    m.tails.resize(m.tails.size() + static_cast<size_t>(m.block_size));
    m.append_counts.push_back(0);
    m.held.emplace_back();
    for (const auto& g : m.groups) g->Resize(m.states.size());
  }
  const int32_t slot = m.free_slots.back();
  m.free_slots.pop_back();
  st->slot = slot;
  m.summaries[slot] = Impl::Summary{.num_tokens = st->prompt_len, .next_event = 0};
  m.slot_of.emplace(spec.id, slot);
  m.states[slot] = std::move(st);
  return RequestHandle(m.id, slot, m.generations[slot]);
}

std::optional<RequestHandle> KvCacheManager::Find(RequestId id) const {
  auto it = impl_->slot_of.find(id);
  if (it == impl_->slot_of.end()) return std::nullopt;
  return RequestHandle(impl_->id, it->second, impl_->generations[it->second]);
}

absl::StatusOr<RequestId> KvCacheManager::Id(RequestHandle request) const {
  const RequestState* st = impl_->Get(request);
  if (st == nullptr) return impl_->Stale(request);
  return st->id;
}

absl::StatusOr<absl::Span<const int32_t>> KvCacheManager::Tokens(RequestHandle request) const {
  RequestState* st = impl_->Get(request);
  if (st == nullptr) return impl_->Stale(request);
  impl_->FlushTokens(*st);  // changes no token and no count
  return absl::MakeConstSpan(st->tokens);
}

void KvCacheManager::Impl::FlushTokens(RequestState& st) const {
  // The tokens still in the tail all belong to the block the last of them is in (the vector
  // holds every earlier block), so they sit in consecutive places: one copy.
  const int64_t n = NumTokens(st.slot);
  const int64_t from = static_cast<int64_t>(st.tokens.size());
  if (from >= n) return;
  const int32_t* src = tails.data() + static_cast<size_t>(st.slot) * block_size + TailOffset(from);
  st.tokens.resize(static_cast<size_t>(n));
  std::memcpy(st.tokens.data() + from, src, static_cast<size_t>(n - from) * sizeof(int32_t));
}

void KvCacheManager::Impl::CompleteBlock(int32_t slot) {
  RequestState& st = *states[slot];
  FlushTokens(st);
  st.hashes.Update(*hasher, st.tokens);
}

absl::Status KvCacheManager::AppendTokens(RequestHandle request, absl::Span<const int32_t> tokens) {
  Impl& m = *impl_;
  RequestState* st = m.Get(request);
  if (st == nullptr) return m.Stale(request);
  const int64_t held = m.NumTokens(st->slot);
  if (static_cast<int64_t>(tokens.size()) > m.max_model_len - held) {
    return PastMaxModelLen(st->id, held + static_cast<int64_t>(tokens.size()), m.max_model_len);
  }
  for (int32_t t : tokens) {
    if (BadToken(t, m.token_limit)) return BadTokenError(t, m.token_limit);
  }
  for (int32_t t : tokens) m.PushToken(st->slot, t);
  return absl::OkStatus();
}

absl::Status KvCacheManager::AppendDecodeTokens(absl::Span<const DecodeToken> tokens) {
  Impl& m = *impl_;
  // Everything is checked first (all or nothing); append_counts[slot] counts a request's
  // tokens so far in the batch, which may name it more than once.
  auto fail = [&](size_t checked, absl::Status status) {
    for (size_t i = 0; i < checked; ++i) m.append_counts[tokens[i].request.slot_] = 0;
    return status;
  };
  for (size_t i = 0; i < tokens.size(); ++i) {
    const RequestState* st = m.Get(tokens[i].request);
    if (st == nullptr) return fail(i, m.Stale(tokens[i].request));
    if (BadToken(tokens[i].token, m.token_limit)) {
      return fail(i, BadTokenError(tokens[i].token, m.token_limit));
    }
    const int32_t slot = tokens[i].request.slot_;  // st's (Get checked the handle)
    const int64_t count = m.NumTokens(slot) + m.append_counts[slot]++;
    if (count >= m.max_model_len) {
      return fail(i + 1, PastMaxModelLen(st->id, count + 1, m.max_model_len));
    }
  }
  for (const DecodeToken& t : tokens) {
    m.append_counts[t.request.slot_] = 0;
    m.PushToken(t.request.slot_, t.token);
  }
  return absl::OkStatus();
}

absl::Status KvCacheManager::RollbackTokens(RequestHandle request, int64_t num_tokens) {
  Impl& m = *impl_;
  RequestState* st = m.Get(request);
  if (st == nullptr) return m.Stale(request);
  const int64_t generated = m.NumTokens(st->slot) - st->prompt_len;
  if (num_tokens < 0 || num_tokens > generated) {
    return absl::InvalidArgumentError(absl::StrCat("cannot roll back ", num_tokens,
                                                   " tokens of request ", st->id.value,
                                                   ": it has ", generated, " generated tokens"));
  }
  if (num_tokens == 0) return absl::OkStatus();
  const int64_t keep = m.NumTokens(st->slot) - num_tokens;
  const internal::RequestView r = m.View(*st);
  for (const auto& g : m.groups) KVPAGE_RETURN_IF_ERROR(g->CheckRollback(r, st->id, keep));
  // Blocks that were full only with the dropped tokens were cached under hashes that are now
  // wrong: they leave the prefix cache.
  const int64_t first = keep / m.block_size;
  for (const auto& g : m.groups) g->Uncache(st->slot, first);
  m.FlushTokens(*st);
  st->tokens.resize(keep);
  st->hashes.Truncate(keep);
  m.summaries[st->slot].num_tokens = keep;
  m.RefreshNextEvent(m.View(*st));
  return absl::OkStatus();
}

absl::Status KvCacheManager::Free(RequestHandle request) {
  Impl& m = *impl_;
  RequestState* st = m.Get(request);
  if (st == nullptr) return m.Stale(request);
  const int32_t slot = st->slot;
  if (m.has_host_tier()) {
    m.ReleaseHeld(slot);
    m.held[slot].loads_in_flight = 0;  // the loads give their blocks back when they complete
  }
  m.FreeRequestBlocks(*st);
  std::erase(m.pending_commits, slot);
  m.slot_of.erase(st->id);
  m.states[slot].reset();
  ++m.generations[slot];
  m.free_slots.push_back(slot);
  return absl::OkStatus();
}

// ---- Steps ----

void KvCacheManager::CompleteStep() {
  Impl& m = *impl_;
  // (Free takes a slot off the list, so every slot here is live.)
  for (int32_t slot : m.pending_commits) m.Commit(*m.states[slot]);
  m.pending_commits.clear();
  for (const auto& g : m.groups) g->StepCompleted();
  m.step_open = false;
  if (m.release_deferred) {
    m.release_deferred = false;
    ReleaseIdleChunks();
  }
}

void KvCacheManager::NewStep() { CompleteStep(); }

absl::Status KvCacheManager::CacheComputedBlocks(RequestHandle request, int64_t num_tokens) {
  Impl& m = *impl_;
  RequestState* st = m.Get(request);
  if (st == nullptr) return m.Stale(request);
  const int64_t known = m.NumTokens(st->slot);
  if (num_tokens < 0 || num_tokens > known) {
    return absl::InvalidArgumentError(absl::StrCat("num_tokens ", num_tokens, " is outside [0, ",
                                                   known, "] for request ", st->id.value));
  }
  if (!st->allocated) return absl::OkStatus();
  const internal::RequestView r = m.View(*st);
  const int64_t full =
      std::min<int64_t>(num_tokens / m.block_size, static_cast<int64_t>(r.hashes.size()));
  for (const auto& g : m.groups) g->CommitThrough(r, full);
  return absl::OkStatus();
}

absl::StatusOr<CacheHit> KvCacheManager::GetComputedBlocks(RequestHandle request) {
  Impl& m = *impl_;
  const RequestState* st = m.Get(request);
  if (st == nullptr) return m.Stale(request);
  if (st->allocated) {
    return absl::FailedPreconditionError(
        absl::StrCat("request ", st->id.value, " already holds blocks"));
  }
  CacheHit hit = m.FindLongestHit(*st);
  if (m.config.enable_prefix_caching && !st->skip_prefix_cache_read) {
    ++m.stats.queries;
    m.stats.queried_tokens += m.NumTokens(st->slot);
    m.stats.hit_tokens += hit.num_tokens;
  }
  return hit;
}

absl::StatusOr<bool> KvCacheManager::AllocateSlots(RequestHandle request,
                                                   const AllocationRequest& step) {
  RequestState* st = impl_->Get(request);
  if (st == nullptr) return impl_->Stale(request);
  if (impl_->has_host_tier() && impl_->held[st->slot].loads_in_flight > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "request ", st->id.value, " is loading its prefix from the host tier; complete the "
        "transfer first"));
  }
  return impl_->Allocate(*st, step);
}

absl::Status KvCacheManager::Impl::CheckDecodeBatch(absl::Span<const DecodeStep> steps) {
  // append_counts (0 between calls) marks the slots seen so far: one store per step.
  auto fail = [&](size_t checked, absl::Status status) {
    for (size_t i = 0; i < checked; ++i) append_counts[steps[i].request.slot_] = 0;
    return status;
  };
  for (size_t i = 0; i < steps.size(); ++i) {
    const RequestState* st = Get(steps[i].request);
    if (st == nullptr) return fail(i, Stale(steps[i].request));
    const int32_t slot = steps[i].request.slot_;  // st's (Get checked the handle)
    if (append_counts[slot] != 0) {
      return fail(i, absl::InvalidArgumentError(absl::StrCat(
                         "request ", st->id.value, " appears twice in one decode step (entry ",
                         i, ")")));
    }
    append_counts[slot] = 1;
  }
  return fail(steps.size(), absl::OkStatus());
}

absl::StatusOr<int64_t> KvCacheManager::AllocateDecodeStep(absl::Span<const DecodeStep> steps) {
  Impl& m = *impl_;
  KVPAGE_RETURN_IF_ERROR(m.CheckDecodeBatch(steps));
  m.step_open = true;
  for (size_t i = 0; i < steps.size(); ++i) {
    const DecodeStep& step = steps[i];
    const int32_t slot = step.request.slot_;
    if (m.IsQuiet(slot, step.num_computed_tokens, step.num_new_tokens)) {
      m.NoteStep(slot, step.num_computed_tokens);
      continue;
    }
    KVPAGE_ASSIGN_OR_RETURN(const bool ok,
                            m.AllocateStep(*m.states[slot],
                                           {.num_computed_tokens = step.num_computed_tokens,
                                            .num_new_tokens = step.num_new_tokens}));
    if (!ok) return static_cast<int64_t>(i);
  }
  return static_cast<int64_t>(steps.size());
}

absl::StatusOr<int64_t> KvCacheManager::NextEvent(RequestHandle request) const {
  const RequestState* st = impl_->Get(request);
  if (st == nullptr) return impl_->Stale(request);
  return impl_->summaries[st->slot].next_event;
}

absl::StatusOr<int64_t> KvCacheManager::BlocksNeeded(RequestHandle request,
                                                     const AllocationRequest& step) const {
  const RequestState* st = impl_->Get(request);
  if (st == nullptr) return impl_->Stale(request);
  return impl_->CountNeeded(*st, step);
}

absl::Status KvCacheManager::RemoveSkippedBlocks(RequestHandle request,
                                                 int64_t num_processed_tokens) {
  RequestState* st = impl_->Get(request);
  if (st == nullptr) return impl_->Stale(request);
  const int64_t num_tokens = impl_->NumTokens(st->slot);
  if (num_processed_tokens < 0 || num_processed_tokens > num_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("num_processed_tokens ", num_processed_tokens,
                                                   " is outside [0, ", num_tokens, "]"));
  }
  impl_->RemoveSkipped(*st, num_processed_tokens);
  return absl::OkStatus();
}

// ---- Tables ----

absl::StatusOr<absl::Span<const BlockId>> KvCacheManager::BlockTable(RequestHandle request,
                                                                     GroupId group) const {
  const RequestState* st = impl_->Get(request);
  if (st == nullptr) return impl_->Stale(request);
  if (group.value < 0 || group.value >= num_groups() ||
      !impl_->groups[group.value]->has_table()) {
    return absl::InvalidArgumentError(absl::StrCat("group ", group.value, " is not an attention group"));
  }
  return impl_->groups[group.value]->Table(st->slot);
}

absl::Status KvCacheManager::FillBlockTableRow(RequestHandle request, GroupId group,
                                               int32_t kernel_block_size,
                                               absl::Span<int32_t> row) const {
  KVPAGE_ASSIGN_OR_RETURN(absl::Span<const BlockId> table, BlockTable(request, group));
  const int32_t bs = group_block_size(group);
  if (kernel_block_size <= 0 || bs % kernel_block_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("kernel block size ", kernel_block_size,
                                                   " does not divide block size ", bs));
  }
  const int32_t ratio = bs / kernel_block_size;
  if (static_cast<int64_t>(table.size()) * ratio > static_cast<int64_t>(row.size())) {
    return absl::InvalidArgumentError(absl::StrCat("row of ", row.size(), " entries cannot hold ",
                                                   table.size() * ratio, " kernel blocks"));
  }
  size_t k = 0;
  for (BlockId b : table) {
    for (int32_t j = 0; j < ratio; ++j) row[k++] = KernelBlock(b, ratio, j);
  }
  std::fill(row.begin() + k, row.end(), 0);
  return absl::OkStatus();
}

absl::Status KvCacheManager::FillSlotMapping(RequestHandle request, GroupId group, int64_t start,
                                             absl::Span<int64_t> out) const {
  KVPAGE_ASSIGN_OR_RETURN(absl::Span<const BlockId> table, BlockTable(request, group));
  const int64_t bs = group_block_size(group);
  for (size_t i = 0; i < out.size(); ++i) {
    const int64_t pos = start + static_cast<int64_t>(i);
    const int64_t index = pos / bs;
    if (pos < 0 || index >= static_cast<int64_t>(table.size()) || table[index] == kNullBlock) {
      return absl::InvalidArgumentError(absl::StrCat("the request holds no block for position ",
                                                     pos, " in group ", group.value));
    }
    out[i] = SlotOf(table[index], bs, pos);
  }
  return absl::OkStatus();
}

absl::StatusOr<StateSlots> KvCacheManager::GetStateSlots(RequestHandle request,
                                                         GroupId group) const {
  const RequestState* st = impl_->Get(request);
  if (st == nullptr) return impl_->Stale(request);
  if (group.value < 0 || group.value >= num_groups() ||
      impl_->groups[group.value]->has_table()) {
    return absl::InvalidArgumentError(absl::StrCat("group ", group.value, " is not a linear-attention group"));
  }
  return impl_->groups[group.value]->Slots(st->slot);
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
  for (const auto& g : m.groups) {
    const BlockPool& pool = g->pool();
    u.pools.push_back(PoolUsage{.group = g->layout().id,
                                .kind = g->layout().kind,
                                .block_bytes = pool.block_bytes(),
                                .used_blocks = pool.num_used_blocks(),
                                .cached_free_blocks = pool.num_cached_free_blocks(),
                                .clean_blocks = pool.num_clean_blocks(),
                                .mapped_chunks = pool.num_mapped_chunks()});
  }
  for (const auto& pool : m.pools) u.used_bytes += int64_t{pool->num_used_blocks()} * pool->block_bytes();
  u.usage = u.budget_bytes > 0 ? static_cast<double>(u.used_bytes) / u.budget_bytes : 0.0;
  return u;
}

std::vector<BlockId> KvCacheManager::FreeBlockOrder(GroupId group) const {
  if (impl_->GroupLayoutOf(group) == nullptr) return {};
  return impl_->groups[group.value]->pool().FreeOrder();
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
  BlockPool& pool = impl_->groups[group.value]->pool();
  if (block.value <= 0 || block.value > pool.capacity()) {
    return absl::InvalidArgumentError(absl::StrCat("block ", block.value, " is not in group ",
                                                   group.value, "'s pool"));
  }
  pool.Uncache(block);
  return absl::OkStatus();
}

}  // namespace kvpage
