// Recurrent state slots: snapshots for the prefix cache, in-place updates, commits.
#include "block/recurrent_group.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "model/kv_sizing.h"

namespace kvpage::internal {

int64_t RecurrentGroup::HitLength(absl::Span<const BlockHash> hashes, int64_t max_blocks,
                                  HitScope scope) const {
  // A snapshot taken exactly at the hit's end.
  for (int64_t i = max_blocks; i > 0; --i) {
    if (Holds(hashes[i - 1], scope)) return i;
    if (scope == HitScope::kDeviceAndStep && CachedThisStep(hashes[i - 1])) return i;
  }
  return 0;
}

void RecurrentGroup::CacheLoaded(const RequestView& r, BlockId block, int64_t i) const {
  // As Commit registers a snapshot: after the latest earlier snapshot the group holds.
  if (!pool().records_events()) {
    pool().CacheBlock(block, r.hashes[i], layout().id, i > 0 ? r.hashes[i - 1] : r.root);
    return;
  }
  const int64_t parent = HeldParent(r, i);
  CacheWithEvent(r, block, i, parent, parent + 1);
}

absl::Status RecurrentGroup::CheckHit(const RequestView& r, const StepArgs& step) const {
  // The snapshot is registered under the hash of the hit's last block.
  const int64_t h = step.computed / ctx().hash_block_size - 1;
  for (BlockId b : *step.hit) {
    if (b == kNullBlock) continue;
    if (b.value > pool().capacity() || !pool().is_cached(b) || h < 0 ||
        h >= static_cast<int64_t>(r.hashes.size()) || !(pool().block_hash(b) == r.hashes[h])) {
      return absl::FailedPreconditionError(
          absl::StrCat("hit block ", b.value, " of group ", layout().id.value,
                       " is no longer cached; ask GetComputedBlocks again"));
    }
  }
  return absl::OkStatus();
}

int64_t RecurrentGroup::SnapshotBlock(const RequestView& r, const StepArgs& step) const {
  const int64_t end = step.verified_end;
  const int64_t bs = ctx().hash_block_size;
  if (!ctx().enable_prefix_caching || end % bs != 0) return -1;
  // vLLM's align mode caches the state at every block boundary it reaches, as soon as the
  // block's hash is known: with async scheduling the step's last token may be a placeholder
  // now and known by Commit (which registers the snapshot only then, and only if it is).
  if (ctx().align_state_blocks) return end / bs - 1;
  if (end / bs > static_cast<int64_t>(r.hashes.size())) return -1;
  const int64_t interval = int64_t{ctx().decode_snapshot_interval_blocks} * bs;
  if (end <= r.prompt_len || (interval > 0 && end % interval == 0)) return end / bs - 1;
  return -1;
}

RecurrentGroup::StepPlan RecurrentGroup::MakePlan(const RequestView& r,
                                                  const StepArgs& step) const {
  const State& s = states_[r.slot];
  StepPlan plan;
  plan.snapshot_block = SnapshotBlock(r, step);
  plan.snapshot_deferred = plan.snapshot_block >= static_cast<int64_t>(r.hashes.size());
  // A committed step left `cur`; a pending one (async scheduling) will leave `write`.
  const bool has_state = r.allocated || step.hit != nullptr;
  int32_t cur = s.step_pending ? s.write : s.cur;
  bool cur_shared = s.step_pending ? s.snapshot_block >= 0 : s.cur_is_snapshot;
  if (step.hit != nullptr) {
    const BlockId slot = (*step.hit)[0];
    cur = slot.value;
    cur_shared = true;
    plan.hit_needs_touch = pool().ref_count(slot) == 0;
  }
  // kvpage keeps a snapshot by writing the step elsewhere. vLLM's block list is
  // position-indexed: a step whose end enters a block the request has no state block for
  // takes one (MambaManager.get_num_blocks_to_allocate), and the state at a boundary stays in
  // the block that reached it.
  const int64_t bs = ctx().hash_block_size;
  const bool needs_new = ctx().align_state_blocks
                             ? CeilDiv(step.verified_end, bs) > CeilDiv(step.computed, bs)
                             : plan.snapshot_block >= 0;
  plan.write_in_place = has_state && cur >= 0 && !cur_shared && !needs_new;
  plan.cur_index = CeilDiv(step.computed, bs) - 1;
  plan.fresh_slots = plan.write_in_place ? 0 : 1;
  if (ctx().enable_prefix_caching && !r.allocated) {
    plan.fresh_slots += ctx().extra_first_state_blocks;
  }
  return plan;
}

void RecurrentGroup::TakeHit(const RequestView& r, absl::Span<const BlockId> hit) {
  pool().Touch(hit);
  State& s = states_[r.slot];
  s.cur = hit[0].value;
  s.cur_is_snapshot = true;
}

int64_t RecurrentGroup::FreshBlocks(const RequestView&, const StepArgs&) const {
  return plan_.fresh_slots;
}

void RecurrentGroup::Install(const RequestView& r, absl::Span<const BlockId> fresh,
                             const StateOutputs& outputs) {
  State& s = states_[r.slot];
  // A successful allocation is vLLM's cache_blocks over the request's known tokens.
  NoteStepSnapshots(r, RegisterDeferred(r, static_cast<int64_t>(r.hashes.size())));
  s.read = s.cur;
  s.write = plan_.write_in_place ? s.cur : fresh[0].value;
  if (s.cur < 0) {
    s.read = s.write;  // no state yet: start from zeros
    outputs.slots_to_zero->push_back(SlotToZero{layout().id, s.write});
  }
  if (fresh.size() > 1) s.extra.push_back(fresh[1].value);
  s.snapshot_block = plan_.snapshot_block;
  s.snapshot_deferred = plan_.snapshot_deferred;
  s.replaced_index = plan_.cur_index;
  s.step_pending = true;
}

void RecurrentGroup::Release(const RequestView& r, int64_t processed) {
  State& s = states_[r.slot];
  // vLLM frees a replaced state once the processed tokens are a block past it (its
  // remove_skipped_blocks): with async scheduling a step in flight may still read it. The
  // latest goes first, as vLLM walks the table down.
  const int64_t dead = CeilDiv(processed, ctx().hash_block_size) - 1;
  auto release = [&](int32_t b) {
    if (b == s.deferred) s.deferred = -1;
    pool().Free({BlockId(b)});
  };
  if (s.retiring >= 0 && s.retiring_index < dead) {
    release(s.retiring);
    s.retiring = -1;
  }
  for (auto it = s.lingering.rbegin(); it != s.lingering.rend(); ++it) {
    if (it->second < dead) release(it->first);
  }
  std::erase_if(s.lingering, [dead](const std::pair<int32_t, int64_t>& b) { return b.second < dead; });
}

void RecurrentGroup::Commit(const RequestView& r) {
  State& s = states_[r.slot];
  if (!s.step_pending) return;
  if (s.write != s.cur && s.cur >= 0) {
    // vLLM frees the replaced state block when the request is next allocated
    // (MambaManager.remove_skipped_blocks); kvpage frees it now.
    if (ctx().align_state_blocks) {
      // One not freed yet stays the request's until it leaves (vLLM's last_state_block_idx
      // moves on without it).
      if (s.retiring >= 0) s.lingering.emplace_back(s.retiring, s.retiring_index);
      s.retiring = s.cur;
      s.retiring_index = s.replaced_index;
    } else {
      pool().Free({BlockId(s.cur)});
    }
  }
  s.cur = s.write;
  s.cur_is_snapshot = false;
  if (s.snapshot_deferred) {
    s.deferred = s.cur;
    s.deferred_index = s.snapshot_block;
  } else if (s.snapshot_block >= 0 &&
             s.snapshot_block < static_cast<int64_t>(r.hashes.size())) {
    RegisterSnapshot(r, BlockId(s.cur), s.snapshot_block);
  }
  s.step_pending = false;
  s.snapshot_deferred = false;
  s.snapshot_block = -1;
  s.read = s.write = s.cur;
}

void RecurrentGroup::RegisterSnapshot(const RequestView& r, BlockId block, int64_t i) {
  if (pool().records_events()) {
    // The snapshot extends the latest earlier snapshot of this prefix the group still holds
    // and covers every token since it.
    const int64_t parent = HeldParent(r, i);
    CacheWithEvent(r, block, i, parent, parent + 1);
  } else {
    pool().CacheBlock(block, r.hashes[i], layout().id, i > 0 ? r.hashes[i - 1] : r.root);
  }
  State& s = states_[r.slot];
  if (block.value == s.cur) s.cur_is_snapshot = pool().is_cached(block);
}

int64_t RecurrentGroup::RegisterDeferred(const RequestView& r, int64_t full) {
  State& s = states_[r.slot];
  if (s.deferred < 0 || s.deferred_index >= std::min<int64_t>(full, r.hashes.size())) return -1;
  RegisterSnapshot(r, BlockId(s.deferred), s.deferred_index);
  s.deferred = -1;
  return s.deferred_index;
}

void RecurrentGroup::NoteStepSnapshots(const RequestView& r, int64_t registered) {
  if (!ctx().align_state_blocks) return;
  // vLLM's cache_blocks caches the deferred snapshot now and the step's own at once (kvpage
  // registers the latter when the step completes); a waiting request whose hit would end on
  // either waits for the next step (KvCacheManager::Impl::HitWaitsForStep).
  if (registered >= 0) step_snapshots_.insert(r.hashes[registered]);
  if (plan_.snapshot_block >= 0 && !plan_.snapshot_deferred) {
    step_snapshots_.insert(r.hashes[plan_.snapshot_block]);
  }
}

void RecurrentGroup::DropPending(const RequestView& r) {
  State& s = states_[r.slot];
  s.snapshot_block = -1;
  s.snapshot_deferred = false;
  s.deferred = -1;  // never cached: vLLM caches it only while the request runs
}

void RecurrentGroup::Free(const RequestView& r) {
  State& s = states_[r.slot];
  // vLLM frees a request's blocks last first: the state, then the one it replaced.
  if (s.cur >= 0) pool().Free({BlockId(s.cur)});
  if (s.retiring >= 0) pool().Free({BlockId(s.retiring)});
  for (auto it = s.lingering.rbegin(); it != s.lingering.rend(); ++it) {
    pool().Free({BlockId(it->first)});
  }
  for (int32_t slot : s.extra) pool().Free({BlockId(slot)});
  s = State{};
}

absl::Status RecurrentGroup::CheckRecompute(const RequestView& r, RequestId id,
                                            int64_t /*c*/) const {
  if (!r.allocated) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "cannot roll back request ", id.value, ": its linear-attention state already includes "
      "those tokens and has no checkpoint to return to"));
}

StateSlots RecurrentGroup::Slots(int32_t slot) const {
  return StateSlots{states_[slot].read, states_[slot].write};
}

absl::Status RecurrentGroup::CountRefs(int32_t slot, RequestId id,
                                       std::vector<int32_t>& refs) const {
  const State& s = states_[slot];
  auto count = [&](int32_t b) -> absl::Status {
    if (b < 0) return absl::OkStatus();
    if (b == 0 || b >= static_cast<int32_t>(refs.size()) || !pool().is_mapped(BlockId(b))) {
      return absl::InternalError(absl::StrCat("request ", id.value, " group ", layout().id.value,
                                              " holds invalid state slot ", b));
    }
    ++refs[b];
    return absl::OkStatus();
  };
  KVPAGE_RETURN_IF_ERROR(count(s.cur));
  KVPAGE_RETURN_IF_ERROR(count(s.retiring));
  for (const auto& [b, index] : s.lingering) KVPAGE_RETURN_IF_ERROR(count(b));
  if (s.step_pending && s.write != s.cur) KVPAGE_RETURN_IF_ERROR(count(s.write));
  for (int32_t b : s.extra) KVPAGE_RETURN_IF_ERROR(count(b));
  return absl::OkStatus();
}

}  // namespace kvpage::internal
