// AllocateSlots and everything it touches: sliding-window frees, recurrent state slots and
// snapshots, and moving chunks between pools through the shared budget.
#include <algorithm>
#include <limits>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "block/manager_impl.h"
#include "internal/prefetch.h"
#include "internal/status_macros.h"
#include "model/kv_sizing.h"

namespace kvpage {

using internal::CeilDiv;
using internal::GroupLayout;
using internal::GroupState;
using internal::RequestState;

namespace {

// Room for `size` blocks and half as many again. A table filled by a prompt (or a hit) then
// grows by one block every block_size decode steps; an exact fit would be reallocated and
// copied at the first of them, in the middle of a batched decode step.
void ReserveTable(std::vector<BlockId>& table, size_t size) {
  if (table.capacity() < size) table.reserve(size + size / 2 + 8);
}

// Where a linear-attention group writes this step's state.
struct StatePlan {
  int32_t fresh_slots = 0;        // slots to take from the pool (write slot, vllm reserve)
  bool write_in_place = false;    // write into the request's own scratch `cur`
  int64_t snapshot_block = -1;    // register the written state under this block's hash
  bool hit_needs_touch = false;   // the hit snapshot is cached-free and must leave the LRU
};

}  // namespace

// ---- Chunk moves between pools ----

bool KvCacheManager::Impl::CanTake(absl::Span<const int64_t> need,
                                   absl::Span<const int64_t> pinned_idle) const {
  int64_t bytes_needed = 0;
  int64_t bytes_available = budget->free_bytes();
  for (size_t p = 0; p < pools.size(); ++p) {
    const BlockPool& pool = *pools[p];
    const int64_t avail = pool.num_free_blocks();
    if (need[p] > avail) {
      const int64_t chunks = CeilDiv(need[p] - avail, pool.blocks_per_chunk());
      if (chunks > pool.num_unmapped_chunks()) return false;
      bytes_needed += chunks * pool.chunk_bytes();
    } else {
      // Idle chunks this pool can give up and still serve its own need.
      const int64_t spare = (avail - need[p]) / pool.blocks_per_chunk();
      const int64_t idle = pool.num_idle_chunks() - pinned_idle[p];
      bytes_available += std::min<int64_t>(spare, idle) * pool.chunk_bytes();
    }
  }
  return bytes_needed <= bytes_available;
}

void KvCacheManager::Impl::TakeFromPool(int32_t p, int64_t n, absl::Span<int64_t> need,
                                        int64_t reserved_bytes, std::vector<BlockId>* out) {
  BlockPool& pool = *pools[p];
  need[p] = std::max<int64_t>(0, need[p] - n);
  if (n <= pool.num_clean_blocks()) {  // the common case: no chunk has to move
    pool.Allocate(static_cast<int32_t>(n), out);
    return;
  }
  // Bytes later pools of this allocation must map are off limits for keeping our cache: raise
  // the headroom by them while this pool allocates (it still maps what it must).
  const int64_t base_headroom = budget->headroom_bytes();
  budget->set_headroom_bytes(base_headroom + reserved_bytes);
  auto release_from_others = [&](bool allow_cache_loss) {
    return ReleaseSpareChunk(need, allow_cache_loss, /*except=*/p);
  };
  // Prefer fresh memory over evicting this pool's cache: free other pools' clean idle chunks.
  const int64_t want_chunks = CeilDiv(std::max<int64_t>(0, n - pool.num_clean_blocks()),
                                      pool.blocks_per_chunk());
  const int64_t want_bytes = std::min<int64_t>(want_chunks, pool.num_unmapped_chunks()) *
                             pool.chunk_bytes();
  while (budget->free_bytes() < want_bytes + budget->headroom_bytes() &&
         release_from_others(/*allow_cache_loss=*/false)) {
  }
  // Still short even after evicting our own cache: take other pools' idle chunks with theirs.
  auto available_to_us = [&]() {
    const int64_t bytes = std::max<int64_t>(0, budget->free_bytes() - reserved_bytes);
    return pool.num_free_blocks() +
           std::min<int64_t>(pool.num_unmapped_chunks(), bytes / pool.chunk_bytes()) *
               pool.blocks_per_chunk();
  };
  while (available_to_us() < n && release_from_others(/*allow_cache_loss=*/true)) {
  }
  KVPAGE_DCHECK(pool.AllocatableNow() >= n);
  pool.Allocate(static_cast<int32_t>(n), out);
  budget->set_headroom_bytes(base_headroom);
}

int64_t KvCacheManager::Impl::ReservedForOthers(int32_t p, absl::Span<const int64_t> need) const {
  int64_t bytes = 0;
  for (size_t q = 0; q < pools.size(); ++q) {
    if (static_cast<int32_t>(q) == p || need[q] <= pools[q]->num_free_blocks()) continue;
    bytes += CeilDiv(need[q] - pools[q]->num_free_blocks(), pools[q]->blocks_per_chunk()) *
             pools[q]->chunk_bytes();
  }
  return bytes;
}

bool KvCacheManager::Impl::ReleaseSpareChunk(absl::Span<const int64_t> need, bool allow_cache_loss,
                                             int32_t except) {
  for (size_t q = 0; q < pools.size(); ++q) {
    if (static_cast<int32_t>(q) == except) continue;
    BlockPool& pool = *pools[q];
    if (pool.num_free_blocks() - need[q] < pool.blocks_per_chunk()) continue;
    if (pool.ReleaseIdleChunk(allow_cache_loss)) return true;
  }
  return false;
}

// ---- Sliding windows ----

void KvCacheManager::Impl::RemoveSkipped(RequestState& st, int64_t num_processed) {
  for (const GroupLayout& g : groups) {
    if (g.kind != LayerKind::kSlidingWindow) continue;
    GroupState& gs = st.groups[g.id.value];
    // The first unprocessed token attends to [p − W + 1, p]; blocks wholly before are dead.
    const int64_t skipped = std::max<int64_t>(0, num_processed - g.window + 1);
    const int64_t dead = std::min<int64_t>(skipped / g.block_size,
                                           static_cast<int64_t>(gs.blocks.size()));
    // Last-to-first, so the later blocks of the prefix are evicted first; blocks before
    // num_released went in earlier calls.
    for (int64_t i = dead - 1; i >= gs.num_released; --i) {
      pools[g.pool]->Free({gs.blocks[i]});
      gs.blocks[i] = kNullBlock;
    }
    gs.num_released = std::max(gs.num_released, dead);
  }
}

void KvCacheManager::Impl::ReleaseSkipped(RequestState& st, int64_t num_processed) {
  RemoveSkipped(st, num_processed);
  st.next_release = NextRelease(st);
  summaries[st.handle].next_release = st.next_release;
}

// ---- Recurrent state ----

void KvCacheManager::Impl::CommitStep(RequestState& st) {
  for (const GroupLayout& g : groups) {
    if (g.kind != LayerKind::kLinearAttention) continue;
    GroupState& gs = st.groups[g.id.value];
    if (!gs.step_pending) continue;
    BlockPool& pool = *pools[g.pool];
    if (gs.write != gs.cur && gs.cur >= 0) pool.Free({BlockId(gs.cur)});
    gs.cur = gs.write;
    gs.cur_is_snapshot = false;
    const absl::Span<const BlockHash> hashes = st.hashes.hashes();
    if (gs.snapshot_block >= 0 && gs.snapshot_block < static_cast<int64_t>(hashes.size())) {
      const int64_t i = gs.snapshot_block;
      pool.CacheBlock(BlockId(gs.cur), hashes[i], g.id, i > 0 ? hashes[i - 1] : hasher->root());
      gs.cur_is_snapshot = pool.is_cached(BlockId(gs.cur));
    }
    gs.step_pending = false;
    gs.snapshot_block = -1;
    gs.read = gs.write = gs.cur;
  }
}

// ---- Validation and counting ----

absl::Status KvCacheManager::Impl::ValidateAllocation(const RequestState& st,
                                                      const AllocationRequest& req) const {
  const int64_t c = req.num_computed_tokens, n = req.num_new_tokens;
  const int64_t known = NumTokens(st);
  if (n <= 0) return absl::InvalidArgumentError(absl::StrCat("num_new_tokens must be > 0, got ", n));
  if (c < 0 || c >= known + n || c > known) {
    return absl::InvalidArgumentError(absl::StrCat("num_computed_tokens ", c, " is outside [0, ",
                                                   known, "] for request ", st.id.value));
  }
  if (req.num_lookahead_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_lookahead_tokens must be >= 0, got ", req.num_lookahead_tokens));
  }
  if (req.num_reserve_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_reserve_tokens must be >= 0, got ", req.num_reserve_tokens));
  }
  if (c + n + req.num_lookahead_tokens > max_model_len) {
    return absl::OutOfRangeError(absl::StrCat("request ", st.id.value, " would hold ",
                                              c + n + req.num_lookahead_tokens,
                                              " tokens, past max_model_len ", max_model_len));
  }
  if (req.num_processed_tokens > c) {
    return absl::InvalidArgumentError(absl::StrCat("num_processed_tokens ", req.num_processed_tokens,
                                                   " exceeds num_computed_tokens ", c));
  }
  if (req.hit != nullptr) {
    if (st.allocated) {
      return absl::FailedPreconditionError(
          absl::StrCat("request ", st.id.value, " already holds blocks; a hit is only for its first allocation"));
    }
    if (req.hit->num_tokens != c || req.hit->blocks.size() != groups.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the hit covers ", req.hit->num_tokens, " tokens but num_computed_tokens is ", c));
    }
    // The hit must still be in the cache: nothing may have evicted it since the lookup.
    const absl::Span<const BlockHash> hashes = st.hashes.hashes();
    for (const GroupLayout& g : groups) {
      const std::vector<BlockId>& blocks = req.hit->blocks[g.id.value];
      const BlockPool& pool = *pools[g.pool];
      for (size_t i = 0; i < blocks.size(); ++i) {
        if (blocks[i] == kNullBlock) continue;
        const size_t h = g.kind == LayerKind::kLinearAttention ? c / block_size - 1 : i;
        if (blocks[i].value > pool.capacity() || !pool.is_cached(blocks[i]) ||
            h >= hashes.size() || !(pool.block_hash(blocks[i]) == hashes[h])) {
          return absl::FailedPreconditionError(absl::StrCat(
              "hit block ", blocks[i].value, " of group ", g.id.value,
              " is no longer cached; ask GetComputedBlocks again"));
        }
      }
    }
  } else if (!st.allocated && c > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "request ", st.id.value, " holds no blocks, so num_computed_tokens must be 0 or come "
        "from a hit, got ", c));
  } else if (st.allocated) {
    for (const GroupLayout& g : groups) {
      if (!g.IsAttention()) continue;
      const int64_t held = static_cast<int64_t>(st.groups[g.id.value].blocks.size());
      if (CeilDiv(c, g.block_size) > held) {
        return absl::InvalidArgumentError(absl::StrCat(
            "num_computed_tokens ", c, " exceeds the ", held * g.block_size,
            " tokens request ", st.id.value, " holds blocks for"));
      }
    }
  }
  return absl::OkStatus();
}

namespace {

// The recurrent-group plan of one step (no side effects).
StatePlan PlanState(const KvCacheManager::Impl& m, const RequestState& st, const GroupLayout& g,
                    const AllocationRequest& req) {
  const GroupState& gs = st.groups[g.id.value];
  StatePlan plan;
  const int64_t end = req.num_computed_tokens + req.num_new_tokens;
  const int64_t bs = m.block_size;
  const int64_t known_blocks = static_cast<int64_t>(st.hashes.hashes().size());
  if (m.config.enable_prefix_caching && end % bs == 0 && end / bs <= known_blocks) {
    const int64_t interval = int64_t{m.config.decode_snapshot_interval_blocks} * bs;
    if (end <= st.prompt_len || (interval > 0 && end % interval == 0)) {
      plan.snapshot_block = end / bs - 1;
    }
  }
  // A committed step left `cur`; a pending one (async scheduling) will leave `write`.
  const bool has_state = st.allocated || req.hit != nullptr;
  int32_t cur = gs.step_pending ? gs.write : gs.cur;
  bool cur_shared = gs.step_pending ? gs.snapshot_block >= 0 : gs.cur_is_snapshot;
  if (req.hit != nullptr) {
    const BlockId slot = req.hit->blocks[g.id.value][0];
    cur = slot.value;
    cur_shared = true;
    plan.hit_needs_touch = m.pools[g.pool]->ref_count(slot) == 0;
  }
  plan.write_in_place = has_state && cur >= 0 && !cur_shared && plan.snapshot_block < 0;
  plan.fresh_slots = plan.write_in_place ? 0 : 1;
  // vllm accounting keeps a second state block per group while prefix caching is on.
  if (m.config.mode == AccountingMode::kVllm && m.config.enable_prefix_caching && !st.allocated) {
    plan.fresh_slots += 1;
  }
  return plan;
}

}  // namespace

namespace {

// What each pool must hand out for the step: new blocks and slots, plus hit blocks now sitting
// free (taking them removes them from the free lists). Fills the linear-attention plans.
// Tables keep their length when a window releases blocks (nulls stand in), so the count does
// not depend on what RemoveSkippedBlocks frees first.
void CountPoolNeeds(const KvCacheManager::Impl& m, const RequestState& st,
                    const AllocationRequest& req, absl::Span<int64_t> need,
                    absl::Span<StatePlan> plans) {
  const int64_t total = req.num_computed_tokens + req.num_new_tokens + req.num_lookahead_tokens;
  for (const GroupLayout& g : m.groups) {
    const BlockPool& pool = *m.pools[g.pool];
    if (!g.IsAttention()) {
      const StatePlan& plan = plans[g.id.value] = PlanState(m, st, g, req);
      need[g.pool] += plan.fresh_slots + (plan.hit_needs_touch ? 1 : 0);
      continue;
    }
    const std::vector<BlockId>& held =
        req.hit != nullptr ? req.hit->blocks[g.id.value] : st.groups[g.id.value].blocks;
    if (req.hit != nullptr) {
      for (BlockId b : held) {
        if (b != kNullBlock && pool.ref_count(b) == 0) ++need[g.pool];
      }
    }
    need[g.pool] += std::max<int64_t>(0, CeilDiv(total, g.block_size) - static_cast<int64_t>(held.size()));
  }
}

}  // namespace

absl::StatusOr<int64_t> KvCacheManager::Impl::CountNeeded(const RequestState& st,
                                                          const AllocationRequest& req) const {
  KVPAGE_RETURN_IF_ERROR(ValidateAllocation(st, req));
  absl::InlinedVector<int64_t, 8> need(pools.size(), 0);
  absl::InlinedVector<StatePlan, 8> plans(groups.size());
  CountPoolNeeds(*this, st, req, absl::MakeSpan(need), absl::MakeSpan(plans));
  int64_t needed = 0;
  for (int64_t n : need) needed += n;
  return needed;
}

// ---- AllocateSlots ----

void KvCacheManager::Impl::AddReserve(const RequestState& st, const AllocationRequest& req,
                                      absl::Span<int64_t> check) const {
  const int64_t total = req.num_computed_tokens + req.num_new_tokens + req.num_lookahead_tokens;
  const int64_t full = total + req.num_reserve_tokens;
  for (const GroupLayout& g : groups) {
    if (!g.IsAttention()) continue;  // a recurrent state does not grow
    const int64_t len = static_cast<int64_t>(req.hit != nullptr ? req.hit->blocks[g.id.value].size()
                                                                : st.groups[g.id.value].blocks.size());
    const int64_t after = std::max<int64_t>(CeilDiv(total, g.block_size), len);  // table length
    if (g.kind == LayerKind::kFullAttention || g.kind == LayerKind::kMla) {
      // Growing pages: every block of the whole sequence.
      check[g.pool] += std::max<int64_t>(0, CeilDiv(full, g.block_size) - after);
    } else if (g.kind == LayerKind::kSlidingWindow && config.mode == AccountingMode::kVllm) {
      // vLLM's full-sequence gate counts a sliding window's blocks for the whole sequence too,
      // capped by its admission bound cdiv(min(W − 1 + T, L), bs) + 1 with T the tokens in
      // flight (two batches under async scheduling) (vllm.md §1.3, §2.7 step 4). kvpage mode
      // counts only the step: a window holds at most W − 1 + budget tokens whatever the prompt.
      const int64_t in_flight =
          int64_t{config.max_num_batched_tokens} * (config.async_scheduling ? 2 : 1);
      const int64_t cap =
          CeilDiv(std::min<int64_t>(g.window - 1 + in_flight, max_model_len), g.block_size) + 1;
      const int64_t skipped =
          std::max<int64_t>(0, req.num_computed_tokens - g.window + 1) / g.block_size;
      const int64_t wanted = std::min(CeilDiv(full, g.block_size) - skipped, cap);
      check[g.pool] += std::max<int64_t>(0, wanted - (after - skipped));
    }
  }
}

int64_t KvCacheManager::Impl::NextRelease(const RequestState& st) const {
  int64_t release = std::numeric_limits<int64_t>::max();
  for (const GroupLayout& g : groups) {
    if (g.kind != LayerKind::kSlidingWindow) continue;
    // Block f dies once (p − W + 1) / bs > f, i.e. p >= (f + 1)·bs + W − 1.
    const GroupState& gs = st.groups[g.id.value];
    release = std::min<int64_t>(release, (gs.num_released + 1) * g.block_size + g.window - 1);
  }
  return release;
}

KvCacheManager::Impl::DecodeSummary KvCacheManager::Impl::MakeSummary(const RequestState& st) const {
  DecodeSummary s;
  s.covered_tokens = CoveredTokens(st);
  s.cache_limit = config.enable_prefix_caching ? (st.cached_blocks + 1) * block_size
                                               : std::numeric_limits<int64_t>::max();
  s.next_release = st.next_release;
  s.plain = st.allocated && !has_state_groups;
  return s;
}

int64_t KvCacheManager::Impl::CoveredTokens(const RequestState& st) const {
  int64_t covered = std::numeric_limits<int64_t>::max();
  for (const GroupLayout& g : groups) {
    if (!g.IsAttention()) continue;
    covered = std::min<int64_t>(
        covered, static_cast<int64_t>(st.groups[g.id.value].blocks.size()) * g.block_size);
  }
  return covered == std::numeric_limits<int64_t>::max() ? 0 : covered;
}

void KvCacheManager::Impl::RefreshSummary(RequestState& st) {
  int64_t cached = std::numeric_limits<int64_t>::max();
  for (const GroupLayout& g : groups) {
    if (!g.IsAttention()) continue;
    cached = std::min(cached, st.groups[g.id.value].num_cached_blocks);
  }
  st.cached_blocks = cached == std::numeric_limits<int64_t>::max() ? 0 : cached;
  st.next_release = NextRelease(st);
  summaries[st.handle] = MakeSummary(st);
}

bool KvCacheManager::Impl::OnFastPath(const RequestState& st, const AllocationRequest& req) const {
  if (!st.allocated || req.hit != nullptr || req.num_lookahead_tokens != 0 ||
      req.num_reserve_tokens != 0 || has_state_groups) {
    return false;
  }
  const int64_t c = req.num_computed_tokens, n = req.num_new_tokens;
  const int64_t processed = req.num_processed_tokens < 0 ? c : req.num_processed_tokens;
  return n > 0 && c >= 0 && c <= NumTokens(st) &&
         c + n <= max_model_len && processed >= 0 && processed <= c;
}

bool KvCacheManager::Impl::NothingToDo(const RequestState& st, const AllocationRequest& req) const {
  const int64_t c = req.num_computed_tokens;
  return req.hit == nullptr && req.num_lookahead_tokens == 0 && req.num_reserve_tokens == 0 &&
         SummaryNothingToDo(summaries[st.handle], token_counts[st.handle], c, req.num_new_tokens,
                            req.num_processed_tokens < 0 ? c : req.num_processed_tokens);
}

void KvCacheManager::Impl::CacheFullBlocks(RequestState& st, int64_t end) {
  if (!config.enable_prefix_caching) return;
  const absl::Span<const BlockHash> hashes = st.hashes.hashes();
  const int64_t full = std::min<int64_t>(
      std::min<int64_t>(end, NumTokens(st)) / block_size,
      static_cast<int64_t>(hashes.size()));
  for (const GroupLayout& g : groups) {
    if (!g.IsAttention()) continue;
    GroupState& gs = st.groups[g.id.value];
    for (int64_t i = gs.num_cached_blocks; i < full; ++i) {
      if (gs.blocks[i] == kNullBlock) continue;
      pools[g.pool]->CacheBlock(gs.blocks[i], hashes[i], g.id, i > 0 ? hashes[i - 1] : hasher->root());
    }
    gs.num_cached_blocks = std::max(gs.num_cached_blocks, full);
  }
}

void KvCacheManager::Impl::PrefetchStepTables(const RequestState& st, int64_t computed) const {
  const bool release = computed >= st.next_release;
  for (const GroupState& gs : st.groups) {
    Prefetch(gs.blocks.data() + gs.blocks.size());
    if (release && gs.num_released < static_cast<int64_t>(gs.blocks.size())) {
      Prefetch(gs.blocks.data() + gs.num_released);
    }
  }
  const absl::Span<const BlockHash> hashes = st.hashes.hashes();
  if (st.cached_blocks < static_cast<int64_t>(hashes.size())) {
    Prefetch(hashes.data() + st.cached_blocks);
    // The block to cache (the table's end is a line further on when it ends a line).
    for (const GroupState& gs : st.groups) {
      if (st.cached_blocks < static_cast<int64_t>(gs.blocks.size())) {
        Prefetch(gs.blocks.data() + st.cached_blocks);
      }
    }
  }
}

void KvCacheManager::Impl::PrefetchStepPools(const RequestState& st, int64_t computed) const {
  const absl::Span<const BlockHash> hashes = st.hashes.hashes();
  const bool cache =
      config.enable_prefix_caching && st.cached_blocks < static_cast<int64_t>(hashes.size());
  const bool release = computed >= st.next_release;
  if (!cache && !release) return;
  for (const GroupLayout& g : groups) {
    if (!g.IsAttention()) continue;
    const GroupState& gs = st.groups[g.id.value];
    if (cache) {
      pools[g.pool]->PrefetchCacheSlot(hashes[st.cached_blocks], g.id);
      if (st.cached_blocks < static_cast<int64_t>(gs.blocks.size())) {
        pools[g.pool]->PrefetchCacheRecords(gs.blocks[st.cached_blocks]);
      }
    }
    if (release && g.kind == LayerKind::kSlidingWindow &&
        gs.num_released < static_cast<int64_t>(gs.blocks.size())) {
      pools[g.pool]->PrefetchBlock(gs.blocks[gs.num_released]);
    }
  }
}

bool KvCacheManager::Impl::CacheNextBlock(RequestState& st, int64_t computed) {
  // The summary said so before the step began; a batch naming the request twice may have
  // changed it since.
  if (!SummaryPureCache(summaries[st.handle], token_counts[st.handle], computed, 1)) return false;
  const int64_t i = st.cached_blocks;
  GroupState* const records = st.groups.data();  // once: inline or not is a test
  for (const GroupLayout& g : groups) {
    if (records[g.id.value].num_cached_blocks != i) return false;
  }
  const absl::Span<const BlockHash> hashes = st.hashes.hashes();
  KVPAGE_DCHECK(i < static_cast<int64_t>(hashes.size()));
  const BlockHash parent = i > 0 ? hashes[i - 1] : hasher->root();
  for (const GroupLayout& g : groups) {
    GroupState& gs = records[g.id.value];
    if (gs.blocks[i] != kNullBlock) pools[g.pool]->CacheBlock(gs.blocks[i], hashes[i], g.id, parent);
    gs.num_cached_blocks = i + 1;
  }
  st.cached_blocks = i + 1;
  summaries[st.handle].cache_limit += block_size;
  return true;
}

bool KvCacheManager::Impl::GrowFromFreeBlocks(RequestState& st, const AllocationRequest& req) {
  // Only in kvpage mode (a pool per group), for a step that OnFastPath accepts and whose
  // computed tokens the request holds blocks for.
  if (pools.size() != groups.size() || !OnFastPath(st, req) ||
      req.num_computed_tokens > summaries[st.handle].covered_tokens) {
    return false;
  }
  const int64_t total = req.num_computed_tokens + req.num_new_tokens;
  for (const GroupLayout& g : groups) {
    const int64_t want = CeilDiv(total, g.block_size) -
                         static_cast<int64_t>(st.groups[g.id.value].blocks.size());
    if (!HasBlocksAtHand(g.pool, want)) return false;
  }
  // A sliding window moved past a block: free it first, as Allocate does (freed blocks join
  // the cached-free list or, unhashed, the clean stack; neither takes what is counted above).
  const int64_t processed =
      req.num_processed_tokens < 0 ? req.num_computed_tokens : req.num_processed_tokens;
  if (processed >= st.next_release) RemoveSkipped(st, processed);
  for (const GroupLayout& g : groups) {
    GroupState& gs = st.groups[g.id.value];
    const int64_t want = CeilDiv(total, g.block_size) - static_cast<int64_t>(gs.blocks.size());
    if (want > 0) pools[g.pool]->Allocate(static_cast<int32_t>(want), &gs.blocks);
  }
  CacheFullBlocks(st, total);
  RefreshSummary(st);
  return true;
}

absl::StatusOr<bool> KvCacheManager::Impl::Allocate(RequestState& st, const AllocationRequest& req) {
  if (NothingToDo(st, req) || GrowFromFreeBlocks(st, req)) return true;
  KVPAGE_RETURN_IF_ERROR(ValidateAllocation(st, req));
  const int64_t c = req.num_computed_tokens;
  const int64_t processed = req.num_processed_tokens < 0 ? c : req.num_processed_tokens;
  const int64_t total = c + req.num_new_tokens + req.num_lookahead_tokens;

  // Free what no unprocessed token can reach before asking for more (done even if the
  // allocation then fails, as vLLM does: those blocks are dead either way).
  if (st.allocated) RemoveSkipped(st, processed);

  // 1. Count what each pool must hand out, including hit blocks now sitting free.
  absl::InlinedVector<int64_t, 8> need(pools.size(), 0);
  absl::InlinedVector<StatePlan, 8> plans(groups.size());
  CountPoolNeeds(*this, st, req, absl::MakeSpan(need), absl::MakeSpan(plans));
  // The reserve: blocks the tokens after this step will need, checked but not taken.
  absl::InlinedVector<int64_t, 8> check = need;
  if (req.num_reserve_tokens > 0) AddReserve(st, req, absl::MakeSpan(check));
  // Enough clean blocks in every pool is the common case and needs no chunk arithmetic.
  bool served_by_clean = true;  // also read after the hits are touched
  for (size_t p = 0; p < need.size(); ++p) {
    served_by_clean &= check[p] <= pools[p]->num_clean_blocks();
  }
  if (!served_by_clean) {
    // Idle chunks holding hit blocks stop being idle when the hits are touched.
    absl::InlinedVector<int64_t, 8> pinned_idle(pools.size(), 0);
    if (req.hit != nullptr) {
      std::vector<std::pair<int32_t, int32_t>> chunks;  // (pool, chunk)
      for (const GroupLayout& g : groups) {
        for (BlockId b : req.hit->blocks[g.id.value]) {
          if (b == kNullBlock || pools[g.pool]->ref_count(b) != 0) continue;
          const int32_t chunk = pools[g.pool]->ChunkIndex(b);
          if (pools[g.pool]->IsIdleChunk(chunk)) chunks.emplace_back(g.pool, chunk);
        }
      }
      std::sort(chunks.begin(), chunks.end());
      chunks.erase(std::unique(chunks.begin(), chunks.end()), chunks.end());
      for (const auto& [pool, chunk] : chunks) ++pinned_idle[pool];
    }
    if (!CanTake(check, pinned_idle)) {
      RefreshSummary(st);  // the window release above changed the tables
      return false;
    }
  }

  // 2. Take the hits in every group before allocating anything, so one group's allocation
  // cannot evict another group's hit.
  if (req.hit != nullptr) {
    for (const GroupLayout& g : groups) {
      const std::vector<BlockId>& hit = req.hit->blocks[g.id.value];
      std::vector<BlockId> live;
      for (BlockId b : hit) {
        if (b != kNullBlock) live.push_back(b);
      }
      pools[g.pool]->Touch(live);
      GroupState& gs = st.groups[g.id.value];
      if (g.IsAttention()) {
        ReserveTable(gs.blocks, hit.size());
        gs.blocks.assign(hit.begin(), hit.end());
        gs.num_cached_blocks = static_cast<int64_t>(hit.size());
        while (gs.num_released < static_cast<int64_t>(hit.size()) &&
               hit[gs.num_released] == kNullBlock) {
          ++gs.num_released;
        }
      } else {
        gs.cur = hit[0].value;
        gs.cur_is_snapshot = true;
      }
    }
  }
  // What is left to take, per group and per pool: new blocks and slots only.
  absl::InlinedVector<int64_t, 8> fresh_count(groups.size(), 0);
  std::fill(need.begin(), need.end(), 0);
  for (const GroupLayout& g : groups) {
    const GroupState& gs = st.groups[g.id.value];
    fresh_count[g.id.value] =
        g.IsAttention() ? std::max<int64_t>(0, CeilDiv(total, g.block_size) -
                                                   static_cast<int64_t>(gs.blocks.size()))
                        : plans[g.id.value].fresh_slots;
    need[g.pool] += fresh_count[g.id.value];
  }

  // Pools short of blocks map chunks; make the budget room for them first, from idle chunks
  // the other pools can spare, before those pools serve themselves and might reuse them.
  if (!served_by_clean) {
    const int64_t deficit = ReservedForOthers(-1, need);
    for (bool cache_loss : {false, true}) {
      while (budget->free_bytes() < deficit && ReleaseSpareChunk(need, cache_loss, /*except=*/-1)) {
      }
    }
  }

  // 3. New blocks and slots.
  std::vector<BlockId>& fresh = scratch_blocks;
  for (const GroupLayout& g : groups) {
    GroupState& gs = st.groups[g.id.value];
    fresh.clear();
    const int64_t n = fresh_count[g.id.value];
    if (n > 0) TakeFromPool(g.pool, n, absl::MakeSpan(need), ReservedForOthers(g.pool, need), &fresh);
    if (g.IsAttention()) {
      ReserveTable(gs.blocks, gs.blocks.size() + fresh.size());
      gs.blocks.insert(gs.blocks.end(), fresh.begin(), fresh.end());
      continue;
    }
    const StatePlan& plan = plans[g.id.value];
    if (gs.step_pending) CommitStep(st);  // async: the previous step's write is the state now
    const int32_t read = gs.cur;
    gs.read = read;
    gs.write = plan.write_in_place ? gs.cur : fresh[0].value;
    if (read < 0) {
      gs.read = gs.write;  // no state yet: start from zeros
      slots_to_zero.push_back(SlotToZero{g.id, gs.write});
    }
    if (fresh.size() > 1) gs.extra.push_back(fresh[1].value);
    gs.snapshot_block = plan.snapshot_block;
    gs.step_pending = true;
  }

  // 4. Offer newly full blocks of verified tokens to the prefix cache (so a second identical
  // prompt in the same step already hits).
  CacheFullBlocks(st, c + req.num_new_tokens);
  if (has_state_groups) pending_commits.push_back(&st);
  st.allocated = true;
  RefreshSummary(st);
  return true;
}

void KvCacheManager::Impl::FreeRequestBlocks(RequestState& st) {
  if (st.allocated) CommitStep(st);
  for (const GroupLayout& g : groups) {
    GroupState& gs = st.groups[g.id.value];
    BlockPool& pool = *pools[g.pool];
    if (g.IsAttention()) {
      std::vector<BlockId> reversed(gs.blocks.rbegin(), gs.blocks.rend());
      pool.Free(reversed);
      gs.blocks.clear();
      continue;
    }
    if (gs.cur >= 0) pool.Free({BlockId(gs.cur)});
    for (int32_t slot : gs.extra) pool.Free({BlockId(slot)});
    gs = GroupState{};
  }
  st.allocated = false;
  RefreshSummary(st);
}

}  // namespace kvpage
