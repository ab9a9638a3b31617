// KvCacheManager::Impl, shared by the manager's source files (internal).
//
//   kv_cache_manager.cc  public API, requests, tables, accounting, invariants
//   manager_layout.cc    groups and pools for kvpage and vllm accounting
//   prefix_hit.cc        the longest prefix every group can serve (fixed point)
//   allocation.cc        AllocateSlots, sliding-window frees, state slots, chunk moves
#ifndef KVPAGE_BLOCK_MANAGER_IMPL_H_
#define KVPAGE_BLOCK_MANAGER_IMPL_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "block/request_state.h"
#include "internal/prefetch.h"
#include "internal/status_macros.h"
#include "kvpage/block_hash.h"
#include "kvpage/block_pool.h"
#include "kvpage/kv_cache_manager.h"
#include "kvpage/kv_events.h"
#include "kvpage/memory_budget.h"

namespace kvpage {

class KvCacheManager::Impl {
 public:
  // ---- Construction (manager_layout.cc) ----
  static absl::StatusOr<std::unique_ptr<Impl>> Build(const ModelSpec& model,
                                                     const KvCacheConfig& config);

  // ---- Prefix hits (prefix_hit.cc) ----
  CacheHit FindLongestHit(const internal::RequestState& st) const;
  // Blocks of the hit in group g covering `num_blocks` blocks (nulls outside a window).
  int64_t GroupHitLength(const internal::GroupLayout& g, absl::Span<const BlockHash> hashes,
                         int64_t max_blocks) const;

  // ---- Tokens ----
  // A request's tokens: the first st.tokens.size() in its vector, the rest (fewer than a
  // block, all decode tokens of the block being filled) in its tail, token_tails[handle ·
  // block_size + position % block_size]. A decode token's append then writes into a flat
  // per-handle array, which stays in the CPU cache from step to step, instead of the end of
  // the request's own vector, a line of its own per request. The tail moves into the vector
  // when the token completes its block, which is then hashed.
  int64_t NumTokens(const internal::RequestState& st) const {
    return token_counts[st.handle];
  }
  // Appends one checked token to the request with handle h. Every full block is hashed already
  // (CheckInvariants checks it), so the token completes one exactly when the count becomes a
  // multiple of the block size: the request's state is read only then.
  void PushToken(int32_t h, int32_t token) {
    if (AppendToTail(h, token)) CompleteBlock(h);
  }
  // The part of PushToken that touches only the flat per-handle arrays: true when the token
  // completed a block, and the caller must then call CompleteBlock(h) before the handle's next
  // append.
  bool AppendToTail(int32_t h, int32_t token) {
    const int64_t n = token_counts[h]++;
    const int64_t offset = TailOffset(n);
    token_tails[static_cast<size_t>(h) * block_size + offset] = token;
    return offset == block_size - 1;
  }
  // The block handle h's last append completed waits in `completed` (completion_due set)
  // to be hashed with the batch's others by CompleteBlocks.
  void DeferCompletion(int32_t h, std::vector<int32_t>& completed) {
    completed.push_back(h);
    completion_due[h] = 1;
    // What CompleteBlock reads first, fetched now: the batch's other appends run before it.
    PrefetchFlush(h);
  }
  // AppendToTail for a batch whose completions are deferred: a block still due from the
  // handle's earlier append in the batch is completed first (its tail slots are about to be
  // reused), and one this token completes is deferred.
  void AppendDeferringCompletion(int32_t h, int32_t token, std::vector<int32_t>& completed) {
    if (completion_due[h]) {
      CompleteBlock(h);
      completion_due[h] = 0;
      std::erase(completed, h);
    }
    if (AppendToTail(h, token)) DeferCompletion(h, completed);
  }
  // AppendDecodeTokens for a batch that names a request again after its token completed a
  // block: every entry checked first, then the appends.
  absl::Status AppendDecodeTokensInTwoPasses(absl::Span<const DecodeToken> tokens);
  // CompleteBlock for each handle, through a prefetch pipeline; clears completion_due.
  void CompleteBlocks(absl::Span<const int32_t> completed);
  // Moves the completed block into the token vector and hashes it.
  void CompleteBlock(int32_t h) {
    internal::RequestState& st = *by_handle[h];
    FlushTokens(st, h);
    st.hashes.Update(*hasher, st.tokens);
    if (!st.hashes.hashes().empty()) cache_hash_hint[h] = st.hashes.hashes().back();
  }
  // Starts loading the map buckets where the request's next cached block would go, by
  // cache_hash_hint (one_pool_per_group: group g's pool is pool g).
  void PrefetchHintedCacheSlots(int32_t h) const {
    for (size_t g = 0; g < pools.size(); ++g) {
      pools[g]->PrefetchCacheSlot(cache_hash_hint[h], GroupId(static_cast<int32_t>(g)));
    }
  }
  // Moves the tail into the vector, which then holds every token. The tokens still in the
  // tail all belong to the block the last of them is in (the vector holds every earlier
  // block), so they sit in consecutive slots: one copy.
  void FlushTokens(internal::RequestState& st) { FlushTokens(st, st.handle); }
  // The same for the request with handle h, without reading the state's first line.
  void FlushTokens(internal::RequestState& st, int32_t h) {
    const int64_t n = token_counts[h];
    const int64_t from = static_cast<int64_t>(st.tokens.size());
    if (from >= n) return;
    const int64_t offset = TailOffset(from);
    KVPAGE_DCHECK(offset + (n - from) <= block_size);
    const int32_t* src = token_tails.data() + static_cast<size_t>(h) * block_size + offset;
    // resize + copy: the vector's general range insert costs a hundred instructions more, and
    // resize does not zero the new tokens first (ArenaAllocator default-initializes).
    st.tokens.resize(static_cast<size_t>(n));
    std::memcpy(st.tokens.data() + from, src, static_cast<size_t>(n - from) * sizeof(int32_t));
  }
  int64_t TailOffset(int64_t position) const {
    return block_mask >= 0 ? (position & block_mask) : position % block_size;
  }

  // ---- Prefetches for the batched decode calls (no effect on state) ----
  // The lines of the request's state a decode step reads: the groups' lines (the vector's
  // header and the first two groups' records, whose addresses follow from the state's) and,
  // unless the step only crosses into new blocks, the first (summary fields) and the second
  // (the hashes' header); `first_line` asks for the first line in any case.
  // `num_groups` is groups.size(), passed by a caller that knows it at compile time.
  void PrefetchState(const internal::RequestState* st, bool pure_cross, bool first_line,
                     size_t num_groups) const {
    if (!pure_cross || first_line) Prefetch(st);
    if (!pure_cross) Prefetch(&st->tokens);
    // The groups' header with the first record, and the second record when there are two
    // (RequestState::groups; with more, the records are apart and only the header is here).
    const char* records = reinterpret_cast<const char*>(&st->groups);
    Prefetch(records);
    if (num_groups == 2) Prefetch(records + 64);
  }
  // What CompleteBlock(h) reads first: the state's second line (the token vector's header, the
  // block size, the hashes' header).
  void PrefetchFlush(int32_t h) const {
    const internal::RequestState* st = by_handle[h];  // only addresses: nothing is read
    Prefetch(&st->tokens);
  }
  // Then, once that line is in: where the flushed tokens go, the last hash (the new block's
  // parent), the new one's place and, for a request with extra hash keys, those keys.
  void PrefetchFlushEnds(int32_t h) const {
    const internal::RequestState& st = *by_handle[h];
    if (st.hashes.has_extras()) {
      const char* extras = reinterpret_cast<const char*>(&st.hashes.extras());
      for (size_t off = 0; off < sizeof(BlockHashExtras); off += 64) Prefetch(extras + off);
      Prefetch(extras + sizeof(BlockHashExtras) - 1);
    }
    PrefetchForWrite(st.tokens.data() + st.tokens.size());
    const absl::Span<const BlockHash> hashes = st.hashes.hashes();
    PrefetchForWrite(hashes.data() + hashes.size());
    if (!hashes.empty()) Prefetch(hashes.data() + hashes.size() - 1);
  }
  // What a decode step after `computed` tokens reads from the request's own tables: each
  // table's end, the next block hash to cache, and the table entry a due window release frees.
  void PrefetchStepTables(const internal::RequestState& st, int64_t computed) const;
  // What it then reads from the pools: the prefix-cache slot of the next block to cache and
  // the record of the block a due window release frees.
  void PrefetchStepPools(const internal::RequestState& st, int64_t computed) const;

  // ---- Allocation (allocation.cc) ----
  absl::StatusOr<bool> Allocate(internal::RequestState& st, const AllocationRequest& req);
  absl::StatusOr<int64_t> CountNeeded(const internal::RequestState& st,
                                      const AllocationRequest& req) const;
  // Adds to `check` (per pool) the blocks the request's num_reserve_tokens will need beyond
  // the step: growing groups' blocks for the whole sequence; in vllm mode also sliding-window
  // blocks up to vLLM's admission bound.
  void AddReserve(const internal::RequestState& st, const AllocationRequest& req,
                  absl::Span<int64_t> check) const;
  absl::Status ValidateAllocation(const internal::RequestState& st,
                                  const AllocationRequest& req) const;
  // Frees sliding-window blocks no token from `num_processed` on can reach. The caller
  // refreshes the request's summary.
  void RemoveSkipped(internal::RequestState& st, int64_t num_processed);
  // RemoveSkipped, then the next release in the state and its summary: releases change no
  // table's length and no cached count, so nothing else of the summary needs refreshing.
  void ReleaseSkipped(internal::RequestState& st, int64_t num_processed);
  void CommitStep(internal::RequestState& st);
  // Gives back every block and slot of a request that is about to be erased.
  void FreeRequestBlocks(internal::RequestState& st);
  // Recomputes RequestState's summary fields from its group tables, and its DecodeSummary.
  void RefreshSummary(internal::RequestState& st);
  // The tokens every attention table covers: min over them of length × block size (0 with
  // none). Kept in DecodeSummary::covered_tokens.
  int64_t CoveredTokens(const internal::RequestState& st) const;
  // Valid arguments for a running request's plain step (no hit, no lookahead, no reserve, no
  // state groups); a window release may be due. The precondition of GrowFromFreeBlocks.
  bool OnFastPath(const internal::RequestState& st, const AllocationRequest& req) const;
  // The decode fast path: true when the step needs no block, no cache entry and no window
  // release, and its arguments are valid, so Allocate may return true without changes.
  bool NothingToDo(const internal::RequestState& st, const AllocationRequest& req) const;

  // What a decode step reads to find that a request needs nothing (NothingToDo for a plain
  // step of n tokens after c), copied out of its RequestState into a flat array indexed by
  // handle: in steady decode nearly every request needs nothing, and a step over the batch
  // then streams through this array instead of visiting every request's own memory.
  struct DecodeSummary {
    int64_t covered_tokens = 0;  // CoveredTokens(state), kept only here
    int64_t cache_limit = 0;     // a block is due for the prefix cache once this many tokens
                                 // are computed (max when caching is off)
    int64_t next_release = 0;    // RequestState::next_release
    bool plain = false;          // allocated, and the model has no linear-attention group
    friend bool operator==(const DecodeSummary&, const DecodeSummary&) = default;
  };
  DecodeSummary MakeSummary(const internal::RequestState& st) const;
  // The rule NothingToDo applies, from the request's summary and token count alone, for a
  // plain step of n tokens after c with `processed` tokens done on the device: valid
  // arguments, no window release due, tables covering the step, and no block full beyond
  // those already cached (a multiply: no divide on this path).
  bool SummaryNothingToDo(const DecodeSummary& s, int64_t num_tokens, int64_t c, int64_t n,
                          int64_t processed) const {
    const int64_t total = c + n;
    return s.plain && n > 0 && c >= 0 && c <= num_tokens && total <= max_model_len &&
           processed >= 0 && processed <= c && processed < s.next_release &&
           total <= s.covered_tokens && std::min(total, num_tokens) < s.cache_limit;
  }
  // QuietDecodeHorizon from the request's summary: SummaryNothingToDo(s, c, 1, c) for
  // c + 1 <= num_tokens, solved for c. The step must end within the tables, before the next
  // block due for the prefix cache and within max_model_len, and start before the next
  // window release.
  DecodeHorizon HorizonOf(const DecodeSummary& s) const {
    if (!s.plain) return DecodeHorizon{};
    return DecodeHorizon{.tokens = std::min({s.covered_tokens, s.cache_limit - 1, max_model_len}),
                         .release = s.next_release};
  }
  // The decode path that crosses a block boundary (and may release a window block): when
  // every pool has the free blocks at hand (clean or evictable) and nothing else is involved,
  // takes them directly. False = not handled, no change.
  bool GrowFromFreeBlocks(internal::RequestState& st, const AllocationRequest& req);
  // The commonest case of that path, decided from the summary alone: one token that starts a
  // new block in every attention group with no block to cache due, in kvpage mode (a pool
  // per group). TakeCrossingBlocks then only checks that every table ends there and every
  // pool has a block at hand, and recomputes nothing: a due window release, one block per
  // group, the covered count moves by a block. It frees and hands out the very blocks
  // GrowFromFreeBlocks would.
  bool SummaryPureCross(const DecodeSummary& s, int64_t num_tokens, int64_t c, int64_t n) const {
    return one_pool_per_group && s.plain && n == 1 && c == s.covered_tokens && c >= 0 &&
           c <= num_tokens && c + 1 <= max_model_len &&
           std::min(c + 1, num_tokens) < s.cache_limit;
  }
  // False (no change) when a pool has no block at hand (HasBlocksAtHand).
  // Inline: AllocateDecodeStep calls it for every crossing, and the call's register saves
  // cost as much as a quarter of the work.
  [[gnu::always_inline]] bool TakeCrossingBlocks(internal::RequestState& st, int64_t computed) {
    // Every table must end exactly at `computed` (the summary said so before the step began;
    // a batch naming the request twice has changed it since). Freeing first (as
    // GrowFromFreeBlocks does) can only add free blocks, so checking before it is enough.
    internal::GroupState* const records = st.groups.data();  // once: inline or not is a test
    for (const internal::GroupLayout& g : groups) {
      if (static_cast<int64_t>(records[g.id.value].blocks.size()) * block_size != computed ||
          !HasBlocksAtHand(g.pool, 1)) {
        return false;
      }
    }
    if (computed >= st.next_release) ReleaseSkipped(st, computed);
    for (const internal::GroupLayout& g : groups) {
      pools[g.pool]->AllocateOne(&records[g.id.value].blocks);
    }
    summaries[st.handle].covered_tokens += block_size;
    return true;
  }
  // TakeCrossingBlocks for the request with handle h in a model of G groups whose pools all
  // hand out one-block chunks (one_block_takes), with group g's blocks taken from takes[g], a
  // run open on pool g. False (no change) where TakeCrossingBlocks must decide: a table that
  // no longer ends at `computed`, a pool out of clean blocks, or a due window release (which
  // frees blocks into the pools, so the run must be finished first). Otherwise it hands out
  // the blocks TakeCrossingBlocks would. Of the request's state it reads only the group
  // records (its first line not at all: the summary has what it needs).
  template <size_t G>
  [[gnu::always_inline]] bool TakeCrossingBlocksFrom(internal::RequestState& st, int32_t h,
                                                     int64_t computed,
                                                     std::array<BlockPool::OneBlockTakes, G>& takes) {
    internal::GroupState* const records = st.groups.data();
    for (size_t g = 0; g < G; ++g) {
      if (static_cast<int64_t>(records[g].blocks.size()) * block_size != computed ||
          takes[g].empty()) {
        return false;
      }
    }
    DecodeSummary& s = summaries[h];
    if (computed >= s.next_release) return false;
    for (size_t g = 0; g < G; ++g) records[g].blocks.push_back(BlockId(takes[g].Take()));
    s.covered_tokens += block_size;
    return true;
  }
  // The other common decode step, decided from the summary alone: one token that fills the
  // next block to cache (no new block, no window release), in kvpage mode. CacheNextBlock
  // then offers that block of every group to the prefix cache, as CacheFullBlocks would.
  bool SummaryPureCache(const DecodeSummary& s, int64_t num_tokens, int64_t c, int64_t n) const {
    return one_pool_per_group && s.plain && n == 1 && c >= 0 && c + 1 == s.cache_limit &&
           c + 1 <= num_tokens && c + 1 <= s.covered_tokens && c < s.next_release &&
           c + 1 <= max_model_len;
  }
  // False (no change) when that no longer holds for a step after `computed` tokens, or the
  // groups disagree on how many blocks they have cached.
  bool CacheNextBlock(internal::RequestState& st, int64_t computed);
  // Can pool p hand out n blocks by itself, with what the slow path would do anyway? With
  // several pools: from its free blocks (clean, or cached and evictable), so no chunk has to
  // move between pools. With one pool: also by mapping chunks from the budget's free bytes
  // (there is no other pool to make room or keep room for).
  bool HasBlocksAtHand(int32_t p, int64_t n) const {
    return n <= pools[p]->num_free_blocks() ||
           (pools.size() == 1 && pools[p]->CanAllocateNow(n));
  }
  // The smallest processed count at which one of the request's windows frees a block.
  int64_t NextRelease(const internal::RequestState& st) const;
  // Offers the blocks filled by tokens [0, end) (verified tokens only) to the prefix cache.
  void CacheFullBlocks(internal::RequestState& st, int64_t end);
  // Can every pool p hand out need[p] blocks at once, moving chunks between pools?
  // `pinned_idle[p]` idle chunks of pool p hold hit blocks about to be touched: they will not
  // be idle, so they cannot be given away.
  bool CanTake(absl::Span<const int64_t> need, absl::Span<const int64_t> pinned_idle) const;
  // Takes n blocks from pool p (after CanTake), keeping `reserved_bytes` of the budget for
  // pools served later in the same allocation; `need` holds what those pools still need.
  void TakeFromPool(int32_t p, int64_t n, absl::Span<int64_t> need, int64_t reserved_bytes,
                    std::vector<BlockId>* out);
  // Gives back one idle chunk of a pool (other than `except`) that can spare it under `need`;
  // false if none can.
  bool ReleaseSpareChunk(absl::Span<const int64_t> need, bool allow_cache_loss, int32_t except);
  // Budget bytes the pools other than p (all pools for p = -1) still have to map for `need`.
  int64_t ReservedForOthers(int32_t p, absl::Span<const int64_t> need) const;

  // ---- State ----
  KvCacheConfig config;
  int64_t max_model_len = 0;
  int32_t block_size = 0;  // hash block size: every attention group's block size
  std::vector<internal::GroupLayout> groups;
  KvEventLog events;
  std::unique_ptr<MemoryBudget> budget;
  std::vector<std::unique_ptr<BlockPool>> pools;
  std::unique_ptr<BlockHasher> hasher;
  // Per-request memory (token vectors); declared before `requests`, so it outlives them.
  internal::HugePageArena arena;
  absl::flat_hash_map<RequestId, std::unique_ptr<internal::RequestState>> requests;
  // Request handles: by_handle[h] is the live request with handle h (null when free), and
  // handle_ids[h] its id, so checking a handle against an id touches no request state.
  std::vector<internal::RequestState*> by_handle;
  std::vector<RequestId> handle_ids;
  std::vector<int32_t> free_handles;
  std::vector<DecodeSummary> summaries;  // by handle; stale for free handles
  // By handle: all the request's tokens (see NumTokens). Apart from the summaries, as every
  // decode append reads and writes it (8 bytes a request, not a summary's 32).
  std::vector<int64_t> token_counts;
  std::vector<int32_t> token_tails;      // block_size per handle, see NumTokens
  // By handle, a hint only (never trusted, stale after other changes): the hash of the block
  // the request completed last, which in steady decode its next step offers to the prefix
  // cache. AllocateDecodeStep's first pass fetches that key's map bucket from it, a whole
  // pass before the insert: the map is far larger than the CPU caches, and the pipeline's own
  // prefetch, a few requests ahead, comes too late for a line from memory.
  std::vector<BlockHash> cache_hash_hint;
  int32_t block_mask = -1;               // block_size − 1 when a power of two
  // The request named by (id, handle), or null if unknown.
  internal::RequestState* Find(RequestId id, int32_t handle) const {
    const int32_t h = HandleOf(id, handle);
    return h < 0 ? nullptr : by_handle[h];
  }
  std::vector<internal::RequestState*> pending_commits;
  std::vector<StateCopy> state_copies;
  std::vector<SlotToZero> slots_to_zero;
  PrefixCacheStats stats;
  bool has_state_groups = false;        // any linear-attention group
  bool has_windows = false;             // any sliding-window group
  // kvpage mode with attention groups only, all of the hash block size: pool p serves
  // group p, and a block boundary is one for every group.
  bool one_pool_per_group = false;
  // one_pool_per_group with one or two groups whose pools all hold one block per chunk: the
  // decode step's crossings take their blocks through BlockPool::OneBlockTakes.
  bool one_block_takes = false;
  std::vector<BlockId> scratch_blocks;  // reused by Allocate, never holds state between calls
  std::vector<internal::RequestState*> scratch_states;  // reused by AllocateDecodeStep
  std::vector<int32_t> scratch_handles;                 // reused by AllocateDecodeStep
  std::vector<int32_t> scratch_indices;                 // reused by AllocateDecodeStep
  std::vector<int32_t> scratch_completed;               // reused by AppendDecodeTokens
  // By handle (grown with the other per-handle arrays), scratch of AppendDecodeTokens, all 0
  // between calls: a completed block not yet moved out of the tail, and the tokens the batch
  // names the request for.
  std::vector<uint8_t> completion_due;
  std::vector<int32_t> append_counts;
  // Not uint8_t: a store through a character type may alias any object, so the compiler
  // would reload every member a loop reads after each store of a kind.
  enum DecodeStepKind : uint8_t { kGeneralStep, kPureCross, kPureCache };
  std::vector<DecodeStepKind> scratch_kinds;            // reused by AllocateDecodeStep
  std::vector<int64_t> scratch_computed;                // reused by AllocateDecodeStep
  // The request a step names: by its handle when that handle is the id's, else by id.
  int32_t HandleOf(RequestId id, int32_t handle) const {
    if (static_cast<uint32_t>(handle) < handle_ids.size() && handle_ids[handle] == id) [[likely]] {
      return handle;
    }
    return HandleOfId(id);
  }
  int32_t HandleOfId(RequestId id) const;  // by the id alone: a map lookup
};

}  // namespace kvpage

#endif  // KVPAGE_BLOCK_MANAGER_IMPL_H_
