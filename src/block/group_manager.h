// GroupManager: how one layer kind keeps its requests' blocks (internal).
//
// The KvCacheManager coordinates one GroupManager per layer group. Each owns the per-request
// records of its group (a block table, or a recurrent state's slots), indexed by the request's
// slot in the manager, and draws its blocks from one BlockPool. Every kind answers the same
// questions, so the coordinator has no branch on the kind:
//
//   prefix hits   HitLength: of the first L blocks of a prompt, how many can this group serve?
//                 HitBlocks: the table prefix (or state slot) serving them.
//   a step        Plan (blocks to take, hit blocks that sit free included), Reserve (blocks the
//                 tokens after the step will need), TakeHit, FreshBlocks, Install, then
//                 CacheFull (the full blocks the step writes become pending); once the step
//                 has run, Commit (pending blocks and state snapshots join the prefix cache),
//                 or, if the request leaves first, DropPending.
//   skipped       SkippedTokens: the leading tokens no later token reads (a window's past);
//                 Release frees their blocks.
//   NextEvent     the first computed-token count at which the group must hear of the request
//                 again (KvCacheManager::NextEvent is the least over the groups).
//   the model     what the kind asks of the manager and the scheduler: whether a running
//                 request's step can Grow in place, whether computed tokens roll back, the
//                 multiple a prefill chunk should end on, the blocks a sequence needs at least.
//                 The coordinator reads these once, at Build, over all groups.
//
// Kinds: FullAttentionGroup (full attention and MLA), SlidingWindowGroup, ChunkedLocalGroup,
// RecurrentGroup (linear attention), built by MakeGroupManager (group_factory.h). Adding a
// kind means one subclass and its lines in group_factory.cc.
#ifndef KVPAGE_BLOCK_GROUP_MANAGER_H_
#define KVPAGE_BLOCK_GROUP_MANAGER_H_

#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "block/block_pool.h"
#include "kvpage/kv_cache_manager.h"
#include "kvpage/types.h"

namespace kvpage::internal {

inline constexpr int64_t kNoEvent = std::numeric_limits<int64_t>::max();

// Which caches a prefix hit may come from: device memory alone (blocks a step can use now), or
// the host tier too (blocks a load would bring back first), or device memory and the state
// snapshots the steps allocated since the last completed one will write (vllm accounting:
// vLLM caches those at allocation, GroupManager::CachedThisStep).
enum class HitScope : uint8_t { kDevice, kDeviceAndHost, kDeviceAndStep };

// How one layer group is laid out in the manager.
struct GroupLayout {
  GroupId id;
  LayerKind kind = LayerKind::kFullAttention;
  int32_t num_layers = 0;
  int32_t padding_layers = 0;  // vllm mode
  int32_t block_size = 0;      // tokens per block (attention groups; 0 for recurrent state)
  int32_t window = 0;          // sliding window, in tokens
  int32_t chunk_size = 0;      // chunked-local attention's chunk, in tokens
  int32_t pool = 0;            // index into the manager's pools
  int64_t block_bytes = 0;     // bytes one block id of this group costs
};

// What the manager shares with its groups (read-only for them).
struct GroupContext {
  bool enable_prefix_caching = true;
  // Full blocks join the prefix cache when the step is allocated, not when it completes, so a
  // request admitted later in the same step already hits them (vLLM; vllm accounting).
  bool cache_at_allocation = false;
  // A sliding window reserves its blocks for the whole sequence, up to vLLM's admission bound,
  // rather than for the step alone (vllm accounting).
  bool window_sequence_reserve = false;
  // vllm mode, with prefix caching: state blocks a recurrent group takes on a request's first
  // allocation beyond the one it writes (VllmRules::extra_first_state_blocks); 0 in kvpage mode.
  int32_t extra_first_state_blocks = 0;
  // vllm mode (0.33), with prefix caching: VllmRules::align_state_blocks.
  bool align_state_blocks = false;
  int32_t hash_block_size = 0;  // the block size of the request's hashes
  int64_t max_model_len = 0;
  int32_t max_num_batched_tokens = 0;
  bool async_scheduling = true;
  int32_t decode_snapshot_interval_blocks = 0;
};

// The request as a step sees it: its hashes and how far the prompt goes.
struct RequestView {
  int32_t slot = -1;
  absl::Span<const BlockHash> hashes;  // one per full block of known tokens
  BlockHash root;                      // the parent of the first block's hash
  int64_t prompt_len = 0;
  bool allocated = false;  // has been through AllocateSlots since it was added or freed
  // Set only while KV events are recorded (BlockPool::records_events), for their detail: the
  // request's tokens (every full block's at least) and its LoRA id.
  absl::Span<const int32_t> tokens;
  int64_t lora_id = 0;
};

// One step of one request, as every group sees it.
struct StepArgs {
  int64_t computed = 0;     // tokens computed before the step
  int64_t verified_end = 0; // computed + new tokens (the step's end, drafts included)
  int64_t total = 0;        // verified_end + lookahead: slots the step must have
  int64_t reserve = 0;      // tokens after the step whose blocks must be obtainable
  const std::vector<BlockId>* hit = nullptr;  // this group's hit blocks, or null
};

// What the state-slot side of a step leaves for the kernels (recurrent groups only).
struct StateOutputs {
  std::vector<SlotToZero>* slots_to_zero = nullptr;
};

class GroupManager {
 public:
  GroupManager(const GroupLayout& layout, BlockPool* pool, const GroupContext* context)
      : layout_(layout), pool_(pool), ctx_(context) {}
  virtual ~GroupManager() = default;
  GroupManager(const GroupManager&) = delete;
  GroupManager& operator=(const GroupManager&) = delete;

  const GroupLayout& layout() const { return layout_; }
  BlockPool& pool() const { return *pool_; }
  // The group keeps a block table per request (BlockTable); else state slots (Slots).
  bool has_table() const { return layout_.block_size > 0; }

  // Room for the records of `slots` requests (slots only grow).
  virtual void Resize(size_t slots) = 0;

  // ---- What the kind asks of the manager and the scheduler ----
  // The sliding window in tokens (KvCacheManager::group_window); 0 when every earlier token
  // is read.
  virtual int32_t window() const { return 0; }
  // Of the first `processed` tokens, how many leading ones no token from `processed` on reads
  // (vLLM's get_num_skipped_tokens): their blocks are dead. 0 for kinds that read them all;
  // a window's past, or the chunks before the current one (chunked-local attention).
  virtual int64_t SkippedTokens(int64_t /*processed*/) const { return 0; }
  // Blocks a request of `tokens` tokens holds at least at its longest: a lower bound on what
  // it needs, 0 for kinds whose holdings stop growing (KvCacheManager::MinBytesFor).
  virtual int64_t MinBlocksFor(int64_t /*tokens*/) const { return 0; }
  // A running request's step can take its new blocks with Grow (no plan, no hit).
  virtual bool grows_in_place() const { return true; }
  // Tokens a request has computed can be rolled back (RollbackTokens): the group keeps what
  // each token wrote, rather than one state every step overwrites.
  virtual bool rolls_back() const { return true; }
  // A prefill chunk should end on a multiple of this many tokens so that a later request can
  // resume where it ended (KvCacheManager::prefill_alignment); 0 when any end serves.
  virtual int32_t prefill_alignment() const { return 0; }

  // ---- Prefix hits ----
  // Order in which the coordinator asks the groups (lower first): kinds whose answer only
  // shrinks go first, so the fixed point is reached in few rounds.
  virtual int hit_rank() const = 0;
  // Of hashes[0, max_blocks), how many leading blocks this group can serve from `scope`.
  virtual int64_t HitLength(absl::Span<const BlockHash> hashes, int64_t max_blocks,
                            HitScope scope) const = 0;
  // Which of a hit's `length` blocks the group reads: per table entry, the index of the hash
  // it is cached under, or -1 where the group needs no block (a sliding window's past);
  // one entry for a recurrent group (the snapshot).
  virtual std::vector<int64_t> HitKeys(int64_t length) const = 0;
  // The hit's blocks for a hit of `length` blocks from device memory (HitLength(…, kDevice)
  // >= length): HitKeys looked up, null where -1.
  std::vector<BlockId> HitBlocks(absl::Span<const BlockHash> hashes, int64_t length) const;
  // A block loaded from the host tier under r.hashes[i] joins the device prefix cache (with
  // its kStored event while events are recorded). REQUIRES: the block is used.
  virtual void CacheLoaded(const RequestView& r, BlockId block, int64_t i) const;
  // FailedPrecondition when a hit block is no longer cached under the request's hash.
  virtual absl::Status CheckHit(const RequestView& r, const StepArgs& step) const;
  // Of hashes[0, max_blocks), how many leading blocks this group's cache knows of: cached, or
  // to be cached when the uncompleted steps of `in_flight` run. Where a prompt diverges from
  // every other (CacheHit::match_tokens). 0 for groups that do not cache every block.
  virtual int64_t KnownLength(absl::Span<const BlockHash> /*hashes*/, int64_t /*max_blocks*/,
                              absl::Span<const RequestView> /*in_flight*/) const {
    return 0;
  }

  // vllm accounting: a step allocated since the last completed one offers a state snapshot
  // under `hash`, which vLLM caches at allocation but kvpage only when the step completes
  // (MambaManager.cached_blocks_this_step; recurrent groups).
  virtual bool CachedThisStep(BlockHash /*hash*/) const { return false; }
  // The steps allocated so far have completed (KvCacheManager::CompleteStep).
  virtual void StepCompleted() {}

  // ---- A step ----
  // InvalidArgument when the step's computed tokens exceed what the request holds blocks for.
  virtual absl::Status Validate(const RequestView& /*r*/, const StepArgs& /*step*/) const {
    return absl::OkStatus();
  }
  // The blocks the step takes from the pool, hit blocks that sit free (ref 0) included. No
  // change (KvCacheManager::BlocksNeeded).
  virtual int64_t Count(const RequestView& r, const StepArgs& step) const = 0;
  // Count, keeping what FreshBlocks and Install need of the step's plan; no other change.
  virtual int64_t Plan(const RequestView& r, const StepArgs& step) { return Count(r, step); }
  // Blocks the tokens after the step will need beyond it (checked, not taken). vllm mode: the
  // full-sequence gate minus the step's blocks, which a window's capped gate can make negative
  // (the pool then checks the step alone).
  virtual int64_t Reserve(const RequestView& /*r*/, const StepArgs& /*step*/) const {
    return 0;
  }
  // Takes a reference on the hit's blocks and makes them the request's.
  virtual void TakeHit(const RequestView& r, absl::Span<const BlockId> hit) = 0;
  // New blocks still to take after TakeHit (from the stored plan).
  virtual int64_t FreshBlocks(const RequestView& r, const StepArgs& step) const = 0;
  // Makes the new blocks the request's.
  virtual void Install(const RequestView& r, absl::Span<const BlockId> fresh,
                       const StateOutputs& outputs) = 0;
  // Takes n new blocks from the group's own pool and makes them the request's: a running
  // request's plain step (attention groups; KvCacheManager::Impl::TakeAtHand).
  virtual void Grow(const RequestView& r, int64_t n) = 0;
  // After Install: full blocks [0, full) will be offered to the prefix cache when the step
  // commits (attention groups; vllm accounting offers them at once, as vLLM does). True when
  // the step left something for Commit: pending blocks, or a state step (recurrent groups).
  virtual bool CacheFull(const RequestView& /*r*/, int64_t /*full*/) { return false; }
  // Frees the blocks of the SkippedTokens(processed) leading tokens, and what else the group
  // holds that no token from `processed` on needs.
  virtual void Release(const RequestView& /*r*/, int64_t /*processed*/) {}
  // A step was installed and not committed yet (recurrent groups).
  virtual bool HasPendingStep(int32_t /*slot*/) const { return false; }
  // The request's last step has run: its pending full blocks join the prefix cache (attention
  // groups) and the state it wrote becomes the request's, snapshot included (recurrent groups).
  virtual void Commit(const RequestView& /*r*/) {}
  // Async scheduling: the steps writing blocks [0, full) have run and their tokens are known:
  // those blocks join the prefix cache now; later pending blocks stay pending (attention
  // groups).
  virtual void CommitThrough(const RequestView& /*r*/, int64_t /*full*/) {}
  // The request leaves before its last step ran: what that step would have offered to the
  // prefix cache never is (its blocks and slots are freed uncached).
  virtual void DropPending(const RequestView& /*r*/) {}
  // Gives back every block and slot of the request.
  virtual void Free(const RequestView& r) = 0;
  // See the top of this file; kNoEvent when the group never needs to hear of it.
  virtual int64_t NextEvent(const RequestView& r) const = 0;

  // ---- Reading ----
  // The request's table (attention groups; empty otherwise).
  virtual absl::Span<const BlockId> Table(int32_t /*slot*/) const { return {}; }
  virtual StateSlots Slots(int32_t /*slot*/) const { return {}; }
  // Blocks [0, n) have been offered to the prefix cache, or are pending (attention groups).
  virtual int64_t NumCached(int32_t /*slot*/) const { return 0; }
  // Drops the prefix-cache entries (or pending offers) of blocks [first, NumCached) (a
  // rollback).
  virtual void Uncache(int32_t /*slot*/, int64_t /*first*/) {}
  // FailedPrecondition when the group cannot compute token `c` of request `id` again (its
  // computed count going back): a block that token's attention reads is freed already (a
  // sliding window), or the group keeps state every step overwrites (rolls_back() false).
  virtual absl::Status CheckRecompute(const RequestView& /*r*/, RequestId /*id*/,
                                      int64_t /*c*/) const {
    return absl::OkStatus();
  }
  // FailedPrecondition when rolling request `id` back to `keep` tokens cannot be done: token
  // keep − 1 cannot be computed again (CheckRecompute), or a block holding dropped tokens is
  // shared with another request (attention groups).
  virtual absl::Status CheckRollback(const RequestView& r, RequestId id, int64_t keep) const {
    return CheckRecompute(r, id, keep - 1);
  }
  // Adds one to refs[b] for every block b the request holds; InternalError for a block that
  // is not a mapped block of the pool.
  virtual absl::Status CountRefs(int32_t slot, RequestId id, std::vector<int32_t>& refs) const = 0;

 protected:
  const GroupContext& ctx() const { return *ctx_; }
  // Offers `block` to the prefix cache under r.hashes[i] with its kStored event's detail: the
  // parent r.hashes[parent] (-1: none) and the tokens of hash blocks [first, i].
  // REQUIRES: pool().records_events(); 0 <= first <= i < r.hashes.size(); parent < first.
  void CacheWithEvent(const RequestView& r, BlockId block, int64_t i, int64_t parent,
                      int64_t first) const;
  // The latest hash block before i whose hash this group still holds, or -1: the parent that
  // keeps the group's event stream consistent on its own.
  int64_t HeldParent(const RequestView& r, int64_t i) const;
  // Whether `scope` holds a block cached under (hash, this group).
  bool Holds(BlockHash hash, HitScope scope) const {
    return pool().Lookup(hash, layout_.id) != kNullBlock ||
           (scope == HitScope::kDeviceAndHost && pool().HostHolds(hash, layout_.id));
  }

 private:
  const GroupLayout layout_;
  BlockPool* const pool_;
  const GroupContext* const ctx_;
};

}  // namespace kvpage::internal

#endif  // KVPAGE_BLOCK_GROUP_MANAGER_H_
