// KvCacheManager::Impl: the coordinator over the budget, the pools and the group managers
// (internal).
//
//   kv_cache_manager.cc  public API: requests, tokens, tables, accounting, invariants
//   manager_layout.cc    the groups and pools of kvpage and vllm accounting
//   prefix_hit.cc        the longest prefix every group can serve (fixed point)
//   allocation.cc        AllocateSlots and the decode batch, phase by phase over the groups
//   shared_budget.cc     moving chunks between pools through the shared budget
//   host_cache.cc        the host tier: loads, transfers and their completion
//
// What each layer kind does lives in its GroupManager (group_manager.h); nothing here branches
// on the kind.
#ifndef KVPAGE_BLOCK_MANAGER_IMPL_H_
#define KVPAGE_BLOCK_MANAGER_IMPL_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "block/block_pool.h"
#include "block/group_manager.h"
#include "block/host_tier.h"
#include "block/memory_budget.h"
#include "block/request_block_hashes.h"
#include "internal/huge_page_arena.h"
#include "kvpage/block_hash.h"
#include "kvpage/kv_cache_manager.h"
#include "kvpage/kv_events.h"

namespace kvpage {

namespace internal {

// A request as the coordinator keeps it; its blocks are in the group managers, under `slot`.
struct RequestState {
  RequestState(RequestId request_id, int32_t block_size, BlockHashExtras extras,
               HugePageArena* arena)
      : id(request_id), tokens(ArenaAllocator<int32_t>(arena)),
        hashes(block_size, std::move(extras)) {}

  RequestId id;
  int32_t slot = -1;
  bool allocated = false;  // has been through AllocateSlots
  bool skip_prefix_cache_read = false;
  int64_t prompt_len = 0;
  // Prompt, then outputs, up to the last full block at least: the tokens of the block being
  // filled may still sit in the manager's per-slot tail (Impl::tails) and move here when the
  // block completes. In the manager's arena (huge pages).
  std::vector<int32_t, ArenaAllocator<int32_t>> tokens;
  RequestBlockHashes hashes;  // one per full block
};

}  // namespace internal

class KvCacheManager::Impl {
 public:
  // ---- Construction (manager_layout.cc) ----
  static absl::StatusOr<std::unique_ptr<Impl>> Build(const ModelSpec& model,
                                                     const KvCacheConfig& config);

  // ---- Requests (kv_cache_manager.cc) ----
  // The live request a handle names, or null.
  internal::RequestState* Get(RequestHandle h) const;
  absl::Status Stale(RequestHandle h) const;  // NotFound naming the handle
  internal::RequestView View(const internal::RequestState& st) const;
  const internal::GroupLayout* GroupLayoutOf(GroupId group) const;  // null if unknown
  int64_t NumTokens(int32_t slot) const { return summaries[slot].num_tokens; }
  // AllocateDecodeStep's checks, before anything changes: NotFound for a stale handle,
  // InvalidArgument for a request named twice.
  absl::Status CheckDecodeBatch(absl::Span<const DecodeStep> steps);

  // ---- Tokens: what a decode step appends goes to a flat per-slot tail, so an append touches
  // no request state; the tail moves into the request's vector when its block completes. ----
  // Appends one checked token; completes the block it fills.
  void PushToken(int32_t slot, int32_t token) {
    const int64_t offset = TailOffset(summaries[slot].num_tokens++);
    tails[static_cast<size_t>(slot) * block_size + offset] = token;
    if (offset == block_size - 1) CompleteBlock(slot);
  }
  // Moves the slot's tail into its request's vector and hashes the block it completed.
  void CompleteBlock(int32_t slot);
  // Moves the tail into the request's vector, which then holds every token.
  void FlushTokens(internal::RequestState& st) const;
  int64_t TailOffset(int64_t position) const {
    return block_mask >= 0 ? (position & block_mask) : position % block_size;
  }

  // ---- Prefix hits (prefix_hit.cc) ----
  CacheHit FindLongestHit(const internal::RequestState& st) const;
  // The most blocks a hit of the request may cover (0 when it reads no prefix cache).
  int64_t MaxHitBlocks(const internal::RequestState& st) const;
  // vllm accounting: the hit vLLM would find ends on a state snapshot that a step allocated
  // since the last completed one caches (GroupManager::CachedThisStep). vLLM's MambaManager
  // then refuses the request's allocation, so it waits for the next step.
  bool HitWaitsForStep(const internal::RequestState& st) const;
  // The most leading blocks of `hashes` any group knows of, counting the pending blocks of
  // requests whose step has not completed (CacheHit::match_tokens).
  int64_t KnownLength(absl::Span<const BlockHash> hashes, int64_t max_blocks) const;
  // The longest hit, in blocks, every group can serve among the first `length` of `hashes`;
  // `longest_alone` (if given) gets the longest one group serves on its own.
  int64_t LongestHitLength(absl::Span<const BlockHash> hashes, int64_t length,
                           int64_t* longest_alone = nullptr,
                           internal::HitScope scope = internal::HitScope::kDevice) const;

  // ---- Allocation (allocation.cc) ----
  // AllocateSlots: true at once for a quiet step (IsQuiet), else AllocateStep.
  absl::StatusOr<bool> Allocate(internal::RequestState& st, const AllocationRequest& req);
  absl::StatusOr<bool> AllocateStep(internal::RequestState& st, const AllocationRequest& req);
  absl::StatusOr<int64_t> CountNeeded(const internal::RequestState& st,
                                      const AllocationRequest& req) const;
  // ValidateAllocation's parts: the token counts on their own and against max_model_len;
  // where the step starts (a hit, the last step, or 0).
  absl::Status ValidateCounts(const internal::RequestState& st,
                              const AllocationRequest& req) const;
  absl::Status ValidateStart(const internal::RequestState& st,
                             const AllocationRequest& req) const;
  // A step of a request that holds blocks going back before its last step's start is a
  // rollback: KvCacheManager::RollbackTokens' rules.
  absl::Status CheckStepOrder(const internal::RequestState& st, int64_t c) const;
  absl::Status ValidateAllocation(const internal::RequestState& st,
                                  const internal::RequestView& r,
                                  const AllocationRequest& req) const;
  // Every group's new blocks (counted into step_fresh) are at hand in its own pool
  // (HasBlocksAtHand). REQUIRES: ValidateAllocation passed.
  bool AllAtHand(const internal::RequestView& r, const AllocationRequest& req);
  // Takes the step's new blocks straight from each group's own pool (after AllAtHand). False
  // (nothing taken) when the backing refuses a chunk they need.
  bool TakeAtHand(const internal::RequestView& r);
  // The general case: all or nothing across the pools, moving chunks between them through the
  // budget; takes the hit first. False (nothing taken) when memory is short.
  bool TakeAcrossPools(const internal::RequestView& r, const AllocationRequest& req);
  // A step of n tokens after c that needs nothing (KvCacheManager::NextEvent) and does not go
  // back before the last step the manager saw (AllocateStep judges that).
  bool IsQuiet(int32_t slot, int64_t c, int64_t n) const {
    const Summary& s = summaries[slot];
    return n > 0 && c >= s.step_begin && c <= s.num_tokens && StepIsQuiet(s.next_event, c, n);
  }
  // Records that a step after c computed tokens got its slots.
  void NoteStep(int32_t slot, int64_t c) { summaries[slot].step_begin = c; }
  void RemoveSkipped(internal::RequestState& st, int64_t num_processed);
  // Commits the request's last step in every group: its pending full blocks and state
  // snapshot join the prefix cache (CompleteStep, or before a state group's next step).
  void Commit(const internal::RequestState& st);
  // Gives back every block and slot of a request that is about to be erased; a step not
  // completed yet caches nothing.
  void FreeRequestBlocks(internal::RequestState& st);
  void RefreshNextEvent(const internal::RequestView& r);
  // Offers the blocks filled by tokens [0, end) (known tokens only) to the prefix cache, as
  // pending blocks until the step commits. True when some are pending.
  bool CacheFullBlocks(const internal::RequestView& r, int64_t end);

  // ---- Chunks between pools (shared_budget.cc) ----
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
  // Frees idle chunks until the pools short of blocks can map what they need.
  void MakeRoom(absl::Span<const int64_t> need);

  // ---- Asking the backing first (premap.cc) ----
  // Premaps the chunks every pool p needs to hand out need[p] blocks (BlockPool::PremapFor).
  // False when the backing (or the budget) refuses one: then nothing stays premapped.
  bool PremapChunks(absl::Span<const int64_t> need);
  // Whether the budget's free bytes (less those premapped) hold the chunks PremapChunks(need)
  // maps, so no idle chunk has to be given back first.
  bool CanPremapNow(absl::Span<const int64_t> need) const {
    return ReservedForOthers(-1, need) <= budget->free_bytes() - budget->premapped_bytes();
  }
  // PremapChunks for the step_fresh blocks of every group, summed per pool (step_need).
  bool PremapFresh();
  // Gives back the hit blocks TakeHit gave a request on its first allocation, refused after.
  void ReturnHit(const internal::RequestView& r);
  // Can pool p hand out n blocks by itself: from its free blocks (clean, or cached and
  // evictable), or, with a single pool, also by mapping chunks from the budget's free bytes.
  bool HasBlocksAtHand(int32_t p, int64_t n) const {
    return n <= pools[p]->num_free_blocks() ||
           (pools.size() == 1 && pools[p]->CanAllocateNow(n));
  }

  // ---- Host tier (host_cache.cc) ----
  // One tier per pool with a share of the host budget (null for a pool whose share holds no
  // chunk); empty without a host tier.
  absl::Status BuildHostTiers(const ModelSpec& model, DType dtype,
                              const std::vector<internal::GroupLayout>& layouts);
  bool has_host_tier() const { return !tiers.empty(); }
  // Gives back the blocks LoadFromHost holds for the request (its first allocation has taken
  // its own references, or it leaves).
  void ReleaseHeld(int32_t slot);
  // Adds the references transfers and loads hold to refs (CheckInvariants).
  void CountTierRefs(std::vector<std::vector<int32_t>>& refs) const;
  absl::Status CheckTiers() const;

  // A load in flight: host slot -> device block of a pool, for the request in `slot` (of
  // `generation`), whose hash `hash_index` the block is cached under once loaded.
  struct Load {
    int32_t pool = 0;
    int32_t group = 0;
    int32_t device = 0;
    int32_t host = 0;
    int32_t slot = -1;
    uint32_t generation = 0;
    int64_t hash_index = 0;
  };
  struct Save {
    int32_t pool = 0;
    internal::PendingSave save;
  };
  struct Transfer {
    std::vector<Save> saves;
    std::vector<Load> loads;
  };
  // What LoadFromHost holds for a request until its first allocation (pool, block), and how
  // many of its loads are in flight.
  struct Held {
    std::vector<std::pair<int32_t, BlockId>> blocks;
    int32_t loads_in_flight = 0;
  };
  std::vector<std::unique_ptr<internal::HostTier>> tiers;
  std::vector<Load> queued_loads;
  absl::flat_hash_map<uint64_t, Transfer> transfers;  // taken, not completed
  uint64_t next_transfer_id = 1;
  std::vector<Held> held;  // by request slot
  HostCacheStats host_stats;

  // ---- State ----
  uint32_t id = 0;  // this manager's number, in every handle it issues (never 0)
  KvCacheConfig config;
  internal::GroupContext context;  // shared with the groups
  int64_t max_model_len = 0;
  // Token ids must be below this: the model's vocab_size when known, else 2^31 (so one
  // unsigned compare also refuses negative ids).
  uint32_t token_limit = uint32_t{1} << 31;
  int32_t block_size = 0;  // hash block size: every attention group's block size
  int32_t block_mask = -1;  // block_size − 1 when a power of two
  KvEventLog events;
  std::unique_ptr<MemoryBudget> budget;
  std::vector<std::unique_ptr<BlockPool>> pools;
  std::vector<std::unique_ptr<internal::GroupManager>> groups;
  std::vector<const internal::GroupManager*> hit_order;  // groups by hit_rank
  std::unique_ptr<BlockHasher> hasher;
  // What the groups answer for the model, read once at Build (group_manager.h, "the model").
  // A pool per group, every group grows_in_place: a running request's plain step (no hit,
  // lookahead or reserve) takes what its own pools have at hand (HasBlocksAtHand) and moves
  // no chunk between pools.
  bool own_pool_steps = false;
  bool rolls_back = true;         // every group rolls_back
  bool frees_skipped = false;     // some group skips tokens (of a long enough request)
  int32_t prefill_alignment = 0;  // the largest group's prefill_alignment

  // Requests by slot. A slot is reused after Free, with its generation bumped, so a handle
  // names (slot, generation).
  internal::HugePageArena arena;  // token vectors; declared before `states`, outlives them
  std::vector<std::unique_ptr<internal::RequestState>> states;  // null when free
  std::vector<uint32_t> generations;
  std::vector<int32_t> free_slots;
  absl::flat_hash_map<RequestId, int32_t> slot_of;
  // What a decode step reads of a request, in one flat array by slot, so that a batch of
  // requests that need nothing streams through it instead of visiting each request's state.
  struct Summary {
    int64_t num_tokens = 0;  // all the request's tokens (vector and tail)
    int64_t next_event = 0;  // KvCacheManager::NextEvent
    // The computed-token count of the last step the manager saw (0 while the request holds
    // no blocks). Steps a caller skips (quiet ones) only move forward from it.
    int64_t step_begin = 0;
  };
  std::vector<Summary> summaries;
  std::vector<int32_t> tails;  // block_size tokens per slot (see RequestState::tokens)
  // AppendDecodeTokens' and CheckDecodeBatch's scratch, per slot: 0 between calls.
  std::vector<int32_t> append_counts;

  // Slots whose last step has pending full blocks or a state step, committed by CompleteStep
  // (a slot may appear twice; committing is idempotent).
  std::vector<int32_t> pending_commits;
  std::vector<SlotToZero> slots_to_zero;
  PrefixCacheStats stats;
  // A step is pending: AllocateSlots or AllocateDecodeStep ran since the last CompleteStep.
  // ReleaseIdleChunks then waits for CompleteStep (release_deferred).
  bool step_open = false;
  bool release_deferred = false;
  // Allocate's scratch, sized once, holding nothing between calls: per pool (need, check)
  // and per group (fresh).
  std::vector<int64_t> step_need, step_check, step_fresh;
  std::vector<BlockId> scratch_blocks;
};

namespace internal {
// KvCacheManager::Impl is private to the public header; the manager's free functions
// (manager_layout.cc, allocation.cc, host_cache.cc, ...) name it ManagerImpl.
struct KvCacheManagerAccess {
  using Impl = KvCacheManager::Impl;
};
}  // namespace internal
using ManagerImpl = internal::KvCacheManagerAccess::Impl;

}  // namespace kvpage

#endif  // KVPAGE_BLOCK_MANAGER_IMPL_H_
