// AllocateSlots: one step of one request, phase by phase over the group managers.
//
//   1. Release   sliding windows free what no unprocessed token can reach;
//   2. Plan      every group counts the blocks it must take (hit blocks sitting free included)
//                and those the request's reserve will need; the pools must be able to hand
//                them all out, moving chunks between pools if need be (all or nothing);
//   3. Hits      every group takes its hit blocks before anything is allocated, so one group's
//                allocation cannot evict another group's hit;
//   4. Fresh     every group takes its new blocks and slots;
//   5. Cache     full blocks of known tokens are offered to the prefix cache; they join it
//                when the step commits (KvCacheManager::CompleteStep).
#include <algorithm>
#include <limits>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "block/manager_impl.h"
#include "internal/status_macros.h"

namespace kvpage {

using internal::GroupManager;
using internal::RequestState;
using internal::RequestView;
using internal::StepArgs;

namespace {

using PoolCounts = absl::InlinedVector<int64_t, 8>;  // one count per pool

// A miss (num_tokens == 0) passed as a hit is the same as no hit.
const CacheHit* RealHit(const AllocationRequest& req) {
  return req.hit != nullptr && req.hit->num_tokens > 0 ? req.hit : nullptr;
}

StepArgs ArgsFor(const AllocationRequest& req, const GroupManager& g) {
  const int64_t end = req.num_computed_tokens + req.num_new_tokens;
  const CacheHit* hit = RealHit(req);
  return StepArgs{.computed = req.num_computed_tokens,
                  .verified_end = end,
                  .total = end + req.num_lookahead_tokens,
                  .reserve = req.num_reserve_tokens,
                  .hit = hit != nullptr ? &hit->blocks[g.layout().id.value] : nullptr};
}

}  // namespace

absl::Status KvCacheManager::Impl::ValidateAllocation(const RequestState& st,
                                                      const RequestView& r,
                                                      const AllocationRequest& req) const {
  KVPAGE_RETURN_IF_ERROR(ValidateCounts(st, req));
  KVPAGE_RETURN_IF_ERROR(ValidateStart(st, req));
  const CacheHit* hit = RealHit(req);
  for (const auto& g : groups) {
    const StepArgs step = ArgsFor(req, *g);
    KVPAGE_RETURN_IF_ERROR(hit != nullptr ? g->CheckHit(r, step) : g->Validate(r, step));
  }
  return absl::OkStatus();
}

absl::Status KvCacheManager::Impl::ValidateCounts(const RequestState& st,
                                                  const AllocationRequest& req) const {
  const int64_t c = req.num_computed_tokens, n = req.num_new_tokens;
  const int64_t known = NumTokens(st.slot);
  if (n <= 0) return absl::InvalidArgumentError(absl::StrCat("num_new_tokens must be > 0, got ", n));
  if (c < 0 || c > known) {
    return absl::InvalidArgumentError(absl::StrCat("num_computed_tokens ", c, " is outside [0, ",
                                                   known, "] for request ", st.id.value));
  }
  if (req.num_lookahead_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_lookahead_tokens must be >= 0, got ", req.num_lookahead_tokens));
  }
  // The reserve may exceed max_model_len (a scheduler adds other requests' outstanding
  // prompts), but not so far that token counts overflow.
  constexpr int64_t kMaxReserve = int64_t{1} << 62;
  if (req.num_reserve_tokens < 0 || req.num_reserve_tokens >= kMaxReserve) {
    return absl::InvalidArgumentError(absl::StrCat("num_reserve_tokens must be in [0, 2^62), got ",
                                                   req.num_reserve_tokens));
  }
  // Each term against what is left, so that no sum can overflow.
  if (n > max_model_len - c) {
    return absl::OutOfRangeError(absl::StrCat("num_new_tokens ", n, " after ", c,
                                              " computed tokens of request ", st.id.value,
                                              " goes past max_model_len ", max_model_len));
  }
  if (req.num_lookahead_tokens > max_model_len - c - n) {
    return absl::OutOfRangeError(absl::StrCat("num_lookahead_tokens ", req.num_lookahead_tokens,
                                              " after ", c + n, " tokens of request ",
                                              st.id.value, " goes past max_model_len ",
                                              max_model_len));
  }
  if (req.num_processed_tokens > c) {
    return absl::InvalidArgumentError(absl::StrCat("num_processed_tokens ", req.num_processed_tokens,
                                                   " exceeds num_computed_tokens ", c));
  }
  if (req.num_processed_tokens < -1) {
    return absl::InvalidArgumentError(absl::StrCat("num_processed_tokens must be >= 0 (or -1 for ",
                                                   "num_computed_tokens), got ",
                                                   req.num_processed_tokens));
  }
  return absl::OkStatus();
}

absl::Status KvCacheManager::Impl::ValidateStart(const RequestState& st,
                                                 const AllocationRequest& req) const {
  const int64_t c = req.num_computed_tokens;
  const CacheHit* hit = RealHit(req);
  if (hit == nullptr) {
    if (st.allocated) return CheckStepOrder(st, c);
    if (c > 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "request ", st.id.value, " holds no blocks, so num_computed_tokens must be 0 or come "
          "from a hit, got ", c));
    }
    return absl::OkStatus();
  }
  if (st.allocated) {
    return absl::FailedPreconditionError(absl::StrCat(
        "request ", st.id.value, " already holds blocks; a hit is only for its first allocation"));
  }
  if (hit->num_tokens != c || hit->blocks.size() != groups.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the hit covers ", hit->num_tokens, " tokens but num_computed_tokens is ", c));
  }
  return absl::OkStatus();
}

absl::Status KvCacheManager::Impl::CheckStepOrder(const RequestState& st, int64_t c) const {
  if (c >= summaries[st.slot].step_begin) return absl::OkStatus();
  // Going back (a recompute after a failed KV load, say): each group says whether it can
  // compute token c again (a window already moved on, state that cannot go back). The
  // tokens stay, so blocks shared with other requests are rewritten with what they hold.
  const RequestView r = View(st);
  for (const auto& g : groups) KVPAGE_RETURN_IF_ERROR(g->CheckRecompute(r, st.id, c));
  return absl::OkStatus();
}

absl::StatusOr<int64_t> KvCacheManager::Impl::CountNeeded(const RequestState& st,
                                                          const AllocationRequest& req) const {
  const RequestView r = View(st);
  KVPAGE_RETURN_IF_ERROR(ValidateAllocation(st, r, req));
  int64_t needed = 0;
  for (const auto& g : groups) needed += g->Count(r, ArgsFor(req, *g));
  return needed;
}

namespace {

// Idle chunks holding hit blocks stop being idle when the hits are touched: they cannot be
// given away to serve this step.
PoolCounts PinnedIdleChunks(const ManagerImpl& m, const CacheHit* hit) {
  PoolCounts pinned(m.pools.size(), 0);
  if (hit == nullptr) return pinned;
  std::vector<std::pair<int32_t, int32_t>> chunks;  // (pool, chunk)
  for (const auto& g : m.groups) {
    const BlockPool& pool = g->pool();
    for (BlockId b : hit->blocks[g->layout().id.value]) {
      if (b == kNullBlock || pool.ref_count(b) != 0) continue;
      const int32_t chunk = pool.ChunkIndex(b);
      if (pool.IsIdleChunk(chunk)) chunks.emplace_back(g->layout().pool, chunk);
    }
  }
  std::sort(chunks.begin(), chunks.end());
  chunks.erase(std::unique(chunks.begin(), chunks.end()), chunks.end());
  for (const auto& [pool, chunk] : chunks) ++pinned[pool];
  return pinned;
}

}  // namespace

namespace {

// No hit, lookahead or reserve, and a valid processed count: a running request's decode step.
bool IsPlain(const AllocationRequest& req) {
  return RealHit(req) == nullptr && req.num_lookahead_tokens == 0 &&
         req.num_reserve_tokens == 0 &&
         (req.num_processed_tokens == -1 ||
          (req.num_processed_tokens >= 0 && req.num_processed_tokens <= req.num_computed_tokens));
}

}  // namespace

absl::StatusOr<bool> KvCacheManager::Impl::Allocate(RequestState& st, const AllocationRequest& req) {
  step_open = true;
  if (IsPlain(req) && IsQuiet(st.slot, req.num_computed_tokens, req.num_new_tokens)) {
    NoteStep(st.slot, req.num_computed_tokens);
    return true;
  }
  return AllocateStep(st, req);
}

absl::StatusOr<bool> KvCacheManager::Impl::AllocateStep(RequestState& st,
                                                        const AllocationRequest& req) {
  const int64_t c = req.num_computed_tokens;
  const bool plain = IsPlain(req);
  RequestView r = View(st);
  KVPAGE_RETURN_IF_ERROR(ValidateAllocation(st, r, req));
  // vllm accounting: vLLM's MambaManager.get_num_blocks_to_allocate asks for more blocks than
  // the pool has (single_type_kv_cache_manager.py, cached_blocks_this_step).
  if (!st.allocated && HitWaitsForStep(st)) return false;
  const int64_t processed = req.num_processed_tokens < 0 ? c : req.num_processed_tokens;
  // A running request's plain step takes what its own pools have at hand, judged before the
  // window release.
  const bool at_hand = plain && st.allocated && own_pool_steps && AllAtHand(r, req);
  // Free what no unprocessed token can reach before asking for more (done even if the
  // allocation then fails, as vLLM does: those blocks are dead either way).
  if (st.allocated) {
    for (const auto& g : groups) g->Release(r, processed);
  }
  const bool ok = at_hand ? TakeAtHand(r) : TakeAcrossPools(r, req);
  if (ok) {
    // Newly full blocks of known tokens (and a state step) commit once the step has run.
    if (CacheFullBlocks(r, c + req.num_new_tokens)) {
      pending_commits.push_back(st.slot);
    }
    st.allocated = r.allocated = true;
    NoteStep(st.slot, c);
    if (has_host_tier()) ReleaseHeld(st.slot);  // the hit holds its own references now
  }
  RefreshNextEvent(r);  // a failed step may still have released window blocks
  return ok;
}

bool KvCacheManager::Impl::AllAtHand(const RequestView& r, const AllocationRequest& req) {
  // (ValidateAllocation has checked that every table covers the computed tokens.)
  for (size_t i = 0; i < groups.size(); ++i) {
    const GroupManager& g = *groups[i];
    step_fresh[i] = g.FreshBlocks(r, ArgsFor(req, g));
    if (!HasBlocksAtHand(g.layout().pool, step_fresh[i])) return false;
  }
  return true;
}

bool KvCacheManager::Impl::TakeAtHand(const RequestView& r) {
  if (!PremapFresh()) return false;
  for (size_t i = 0; i < groups.size(); ++i) {
    if (step_fresh[i] > 0) groups[i]->Grow(r, step_fresh[i]);
  }
  budget->DropPremapped();
  return true;
}

bool KvCacheManager::Impl::TakeAcrossPools(const RequestView& r, const AllocationRequest& req) {
  // Plan: what each pool must hand out, and what the reserve adds to the step_check.
  std::fill(step_need.begin(), step_need.end(), 0);
  std::fill(step_check.begin(), step_check.end(), 0);
  for (const auto& g : groups) {
    const StepArgs step = ArgsFor(req, *g);
    const int64_t n = g->Plan(r, step);
    step_need[g->layout().pool] += n;
    step_check[g->layout().pool] += n + (req.num_reserve_tokens > 0 ? g->Reserve(r, step) : 0);
  }
  // The reserve is a second check, not an addition: a vllm-mode window may ask less of it
  // than of the step (a negative Reserve), and the pool must pass both.
  for (size_t p = 0; p < pools.size(); ++p) step_check[p] = std::max(step_check[p], step_need[p]);
  // Enough clean blocks in every pool is the common case and moves no chunk.
  bool clean = true;
  for (size_t p = 0; p < pools.size(); ++p) clean &= step_check[p] <= pools[p]->num_clean_blocks();
  if (!clean && !CanTake(step_check, PinnedIdleChunks(*this, RealHit(req)))) return false;
  // The backing is asked for the chunks the step needs before anything changes when the
  // budget's free bytes hold them, else once idle chunks have made room (below).
  const bool premap_now = CanPremapNow(step_need);
  if (premap_now && !PremapChunks(step_need)) return false;
  if (const CacheHit* hit = RealHit(req)) {
    for (const auto& g : groups) g->TakeHit(r, hit->blocks[g->layout().id.value]);
  }
  // What is left to take, per group and per pool: new blocks and slots only.
  std::fill(step_need.begin(), step_need.end(), 0);
  for (size_t i = 0; i < groups.size(); ++i) {
    step_fresh[i] = groups[i]->FreshBlocks(r, ArgsFor(req, *groups[i]));
    step_need[groups[i]->layout().pool] += step_fresh[i];
  }
  if (!clean) MakeRoom(step_need);
  if (!premap_now && !PremapChunks(step_need)) {
    if (RealHit(req) != nullptr) ReturnHit(r);
    return false;
  }
  const internal::StateOutputs outputs{.slots_to_zero = &slots_to_zero};
  for (size_t i = 0; i < groups.size(); ++i) {
    GroupManager& g = *groups[i];
    const int32_t p = g.layout().pool;
    scratch_blocks.clear();
    if (step_fresh[i] > 0) {
      TakeFromPool(p, step_fresh[i], absl::MakeSpan(step_need), ReservedForOthers(p, step_need), &scratch_blocks);
    }
    // Async scheduling: the previous step's write is the state now.
    if (g.HasPendingStep(r.slot)) Commit(*states[r.slot]);
    g.Install(r, scratch_blocks, outputs);
  }
  budget->DropPremapped();  // what the pools ended up not needing
  return true;
}

bool KvCacheManager::Impl::CacheFullBlocks(const RequestView& r, int64_t end) {
  // (hashes.size() is the number of full blocks of known tokens: no divide.)
  const int64_t full = std::min(end, NumTokens(r.slot)) >= NumTokens(r.slot)
                           ? static_cast<int64_t>(r.hashes.size())
                           : std::min<int64_t>(end / block_size,
                                               static_cast<int64_t>(r.hashes.size()));
  bool pending = false;
  for (const auto& g : groups) pending |= g->CacheFull(r, full);
  return pending;
}

void KvCacheManager::Impl::RemoveSkipped(RequestState& st, int64_t num_processed) {
  const RequestView r = View(st);
  for (const auto& g : groups) g->Release(r, num_processed);
  RefreshNextEvent(r);
}

void KvCacheManager::Impl::Commit(const RequestState& st) {
  const RequestView r = View(st);
  for (const auto& g : groups) g->Commit(r);
}

void KvCacheManager::Impl::FreeRequestBlocks(RequestState& st) {
  const RequestView r = View(st);
  if (st.allocated) {
    // A step not completed yet is treated as never run: nothing it wrote is cached.
    for (const auto& g : groups) g->DropPending(r);
    Commit(st);
  }
  for (const auto& g : groups) g->Free(r);
  st.allocated = false;
  NoteStep(st.slot, 0);
  RefreshNextEvent(View(st));
}

void KvCacheManager::Impl::RefreshNextEvent(const RequestView& r) {
  int64_t next = 0;
  if (r.allocated) {
    next = max_model_len + 1;
    for (const auto& g : groups) next = std::min(next, g->NextEvent(r));
  }
  summaries[r.slot].next_event = next;
}

}  // namespace kvpage
