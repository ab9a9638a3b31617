// RecurrentGroup: a fixed-size state per request (linear attention such as Gated DeltaNet).
//
// A request holds one state slot, `cur`, that each step reads and overwrites; the pool's
// "blocks" are state slots. With prefix caching a step that ends on a block boundary of the
// prompt (or on a multiple of decode_snapshot_interval_blocks) writes a fresh slot instead and
// registers it under that block's hash when the step commits, so a later request with the same
// prefix resumes from it. Steps commit at the manager's NewStep (or the request's next step),
// because under asynchronous scheduling the state of the step in flight is not written yet.
#ifndef KVPAGE_BLOCK_RECURRENT_GROUP_H_
#define KVPAGE_BLOCK_RECURRENT_GROUP_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "block/group_manager.h"
#include "internal/status_macros.h"

namespace kvpage::internal {

class RecurrentGroup final : public GroupManager {
 public:
  using GroupManager::GroupManager;

  void Resize(size_t slots) override { states_.resize(std::max(states_.size(), slots)); }
  // Every step moves the state (Plan and Install, never Grow), and overwrites it.
  bool grows_in_place() const override { return false; }
  bool rolls_back() const override { return false; }
  // With prefix caching, a state is kept only at block boundaries (SnapshotBlock).
  int32_t prefill_alignment() const override {
    return ctx().enable_prefix_caching ? ctx().hash_block_size : 0;
  }
  int hit_rank() const override { return 2; }
  int64_t HitLength(absl::Span<const BlockHash> hashes, int64_t max_blocks,
                    HitScope scope) const override;
  std::vector<int64_t> HitKeys(int64_t length) const override { return {length - 1}; }
  bool CachedThisStep(BlockHash hash) const override { return step_snapshots_.contains(hash); }
  void StepCompleted() override { step_snapshots_.clear(); }
  void CacheLoaded(const RequestView& r, BlockId block, int64_t i) const override;
  absl::Status CheckHit(const RequestView& r, const StepArgs& step) const override;
  int64_t Count(const RequestView& r, const StepArgs& step) const override {
    return Needed(MakePlan(r, step));
  }
  int64_t Plan(const RequestView& r, const StepArgs& step) override {
    plan_ = MakePlan(r, step);
    return Needed(plan_);
  }
  void TakeHit(const RequestView& r, absl::Span<const BlockId> hit) override;
  int64_t FreshBlocks(const RequestView& r, const StepArgs& step) const override;
  void Install(const RequestView& r, absl::Span<const BlockId> fresh,
               const StateOutputs& outputs) override;
  // Never called: grows_in_place() is false (KvCacheManager::Impl::own_pool_steps).
  void Grow(const RequestView&, int64_t) override { KVPAGE_DCHECK(false); }
  // The state the step writes (and its snapshot) is pending until the step commits.
  bool CacheFull(const RequestView& r, int64_t) override { return states_[r.slot].step_pending; }
  // GroupContext::align_state_blocks: frees the state block the last committed step replaced.
  void Release(const RequestView& r, int64_t processed) override;
  bool HasPendingStep(int32_t slot) const override { return states_[slot].step_pending; }
  void Commit(const RequestView& r) override;
  // Async scheduling, vllm accounting: registers a deferred snapshot the processed tokens
  // now cover.
  void CommitThrough(const RequestView& r, int64_t full) override { RegisterDeferred(r, full); }
  void DropPending(const RequestView& r) override;
  void Free(const RequestView& r) override;
  // Refuses once the request has computed: its state includes every computed token.
  absl::Status CheckRecompute(const RequestView& r, RequestId id, int64_t c) const override;
  int64_t NextEvent(const RequestView&) const override { return 0; }  // every step moves it
  StateSlots Slots(int32_t slot) const override;
  absl::Status CountRefs(int32_t slot, RequestId id, std::vector<int32_t>& refs) const override;

 private:
  struct State {
    // The state after the last committed step (-1: none yet, the state is zero). A snapshot
    // `cur` is shared with the prefix cache; a scratch `cur` is the request's own and is
    // updated in place.
    int32_t cur = -1;
    bool cur_is_snapshot = false;
    // The step in flight: read `read`, write `write`; `snapshot_block` >= 0 registers `write`
    // under that block's hash when the step commits.
    bool step_pending = false;
    int32_t read = -1;
    int32_t write = -1;
    int64_t snapshot_block = -1;
    std::vector<int32_t> extra;  // vllm accounting: the second state block it keeps
    int32_t retiring = -1;  // GroupContext::align_state_blocks: the state `cur` replaced
    // vllm accounting: the position-indexed block `cur` stands at when the pending step writes
    // elsewhere, and `retiring`'s (vLLM's last_state_block_idx).
    int64_t replaced_index = -1;
    int64_t retiring_index = -1;
    // Async scheduling, vllm accounting: earlier replaced states a step in flight kept, with
    // their block indices, oldest first; freed once the processed tokens pass them.
    std::vector<std::pair<int32_t, int64_t>> lingering;
    // Async scheduling, vllm accounting: a step whose last token was a placeholder when it was
    // scheduled reached a block boundary; its state, committed, waits in `deferred` for vLLM's
    // next cache_blocks on the request (its next allocation, or an output that shows the
    // tokens processed) before it joins the prefix cache. A request that leaves first never
    // caches it.
    bool snapshot_deferred = false;  // the pending step's snapshot is of that kind
    int32_t deferred = -1;
    int64_t deferred_index = -1;
  };
  // Where this step writes its state (Plan's result, read by FreshBlocks and Install).
  struct StepPlan {
    int32_t fresh_slots = 0;       // slots to take from the pool (write slot, vllm's second)
    bool write_in_place = false;   // write into the request's own scratch `cur`
    int64_t snapshot_block = -1;   // register the written state under this block's hash
    bool hit_needs_touch = false;  // the hit snapshot is cached-free and must leave the LRU
    int64_t cur_index = -1;        // vllm accounting: the block index of the state before it
    bool snapshot_deferred = false;  // the snapshot block's hash is not known yet
  };

  // The block whose hash the step's written state is registered under, or -1.
  int64_t SnapshotBlock(const RequestView& r, const StepArgs& step) const;
  StepPlan MakePlan(const RequestView& r, const StepArgs& step) const;
  // Registers `block` (the request's) as the snapshot of the state after block i.
  void RegisterSnapshot(const RequestView& r, BlockId block, int64_t i);
  // Registers the deferred snapshot if blocks [0, full) are known and processed; returns the
  // block index it registered the snapshot under, or -1.
  int64_t RegisterDeferred(const RequestView& r, int64_t full);
  // Install, align_state_blocks: the snapshots vLLM's cache_blocks caches in this allocation.
  void NoteStepSnapshots(const RequestView& r, int64_t registered);
  static int64_t Needed(const StepPlan& plan) {
    return plan.fresh_slots + (plan.hit_needs_touch ? 1 : 0);
  }

  std::vector<State> states_;  // by request slot
  StepPlan plan_;              // of the step being allocated
  // align_state_blocks: the hashes of the snapshots the steps allocated since the last
  // completed one cache in vLLM's bookkeeping (at allocation), registered here or not yet.
  absl::flat_hash_set<BlockHash> step_snapshots_;
};

}  // namespace kvpage::internal

#endif  // KVPAGE_BLOCK_RECURRENT_GROUP_H_
