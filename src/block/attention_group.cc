// Block tables of attention groups: growth, hits, prefix caching, release.
#include "block/attention_group.h"

#include <algorithm>
#include <bit>

#include "absl/strings/str_cat.h"
#include "internal/status_macros.h"

namespace kvpage::internal {

namespace {

// Room for `size` blocks and half as many again. A table filled by a prompt (or a hit) then
// grows by one block every block_size decode steps; an exact fit would be reallocated and
// copied at the first of them, in the middle of a batched decode step.
void ReserveTable(std::vector<BlockId>& table, size_t size) {
  if (table.capacity() < size) table.reserve(size + size / 2 + 8);
}

}  // namespace

void AttentionGroup::Resize(size_t slots) {
  if (tables_.size() < slots) tables_.resize(slots);
}

AttentionGroup::AttentionGroup(const GroupLayout& layout, BlockPool* pool,
                               const GroupContext* context)
    : GroupManager(layout, pool, context) {
  if (std::has_single_bit(static_cast<uint32_t>(layout.block_size))) {
    block_shift_ = std::countr_zero(static_cast<uint32_t>(layout.block_size));
  }
}

int64_t AttentionGroup::LengthAfter(const RequestView& r, const StepArgs& step) const {
  const size_t len = step.hit != nullptr ? step.hit->size() : tables_[r.slot].blocks.size();
  return std::max<int64_t>(BlocksFor(step.total), static_cast<int64_t>(len));
}

int64_t AttentionGroup::CappedGateBeyondStep(const RequestView& r, const StepArgs& step,
                                             int64_t cap, int64_t skipped_blocks) const {
  const size_t held = step.hit != nullptr ? step.hit->size() : tables_[r.slot].blocks.size();
  const int64_t covered = std::max(skipped_blocks, static_cast<int64_t>(held));
  const int64_t gate =
      std::max<int64_t>(0, std::min(BlocksFor(step.total + step.reserve), cap) - covered);
  return gate - std::max<int64_t>(0, BlocksFor(step.total) - covered);
}

absl::Status AttentionGroup::Validate(const RequestView& r, const StepArgs& step) const {
  if (!r.allocated || step.hit != nullptr) return absl::OkStatus();
  const int64_t held = static_cast<int64_t>(tables_[r.slot].blocks.size());
  if (BlocksFor(step.computed) > held) {
    return absl::InvalidArgumentError(absl::StrCat("num_computed_tokens ", step.computed,
                                                   " exceeds the ", held * layout().block_size,
                                                   " tokens the request holds blocks for"));
  }
  return absl::OkStatus();
}

int64_t AttentionGroup::Count(const RequestView& r, const StepArgs& step) const {
  const std::vector<BlockId>& held = step.hit != nullptr ? *step.hit : tables_[r.slot].blocks;
  int64_t need = 0;
  if (step.hit != nullptr) {  // hit blocks sitting free leave the free lists
    for (BlockId b : held) need += b != kNullBlock && pool().ref_count(b) == 0 ? 1 : 0;
  }
  // Tables keep their length when a window releases blocks (nulls stand in), so the count does
  // not depend on what Release freed first.
  return need + std::max<int64_t>(0, BlocksFor(step.total) - static_cast<int64_t>(held.size()));
}

int64_t AttentionGroup::Reserve(const RequestView& r, const StepArgs& step) const {
  // Growing pages: every block of the whole sequence.
  return std::max<int64_t>(0, BlocksFor(step.total + step.reserve) - LengthAfter(r, step));
}

void AttentionGroup::TakeHit(const RequestView& r, absl::Span<const BlockId> hit) {
  std::vector<BlockId> live;
  for (BlockId b : hit) {
    if (b != kNullBlock) live.push_back(b);
  }
  pool().Touch(live);
  TableState& t = tables_[r.slot];
  ReserveTable(t.blocks, hit.size());
  t.blocks.assign(hit.begin(), hit.end());
  t.num_cached = t.num_published = static_cast<int64_t>(hit.size());
  while (t.num_released < static_cast<int64_t>(hit.size()) && hit[t.num_released] == kNullBlock) {
    ++t.num_released;
  }
}

int64_t AttentionGroup::FreshBlocks(const RequestView& r, const StepArgs& step) const {
  return std::max<int64_t>(
      0, BlocksFor(step.total) - static_cast<int64_t>(tables_[r.slot].blocks.size()));
}

void AttentionGroup::Install(const RequestView& r, absl::Span<const BlockId> fresh,
                             const StateOutputs&) {
  std::vector<BlockId>& blocks = tables_[r.slot].blocks;
  ReserveTable(blocks, blocks.size() + fresh.size());
  blocks.insert(blocks.end(), fresh.begin(), fresh.end());
}

void AttentionGroup::Grow(const RequestView& r, int64_t n) {
  std::vector<BlockId>& blocks = tables_[r.slot].blocks;
  ReserveTable(blocks, blocks.size() + static_cast<size_t>(n));
  const bool taken = pool().Allocate(static_cast<int32_t>(n), &blocks);
  KVPAGE_DCHECK(taken);  // the manager premapped the chunks (Impl::TakeAtHand)
  (void)taken;
}

bool AttentionGroup::CacheFull(const RequestView& r, int64_t full) {
  if (!ctx().enable_prefix_caching) return false;
  TableState& t = tables_[r.slot];
  if (full <= t.num_cached) return false;
  t.num_cached = full;
  if (ctx().cache_at_allocation) {
    Commit(r);
    return false;
  }
  return true;
}

void AttentionGroup::Release(const RequestView& r, int64_t processed) {
  TableState& t = tables_[r.slot];
  const int64_t dead = std::min<int64_t>(SkippedTokens(processed) / layout().block_size,
                                         static_cast<int64_t>(t.blocks.size()));
  // Last to first, so the later blocks of the prefix are evicted first; blocks before
  // num_released went in earlier calls.
  for (int64_t i = dead - 1; i >= t.num_released; --i) {
    pool().Free({t.blocks[i]});
    t.blocks[i] = kNullBlock;
  }
  t.num_released = std::max(t.num_released, dead);
}

void AttentionGroup::Commit(const RequestView& r) {
  TableState& t = tables_[r.slot];
  // A rollback may have dropped hashes since the blocks became pending (Uncache lowers
  // num_cached with them).
  const int64_t end = std::min<int64_t>(t.num_cached, static_cast<int64_t>(r.hashes.size()));
  const bool events = pool().records_events();
  for (int64_t i = t.num_published; i < end; ++i) {
    if (t.blocks[i] == kNullBlock) continue;  // a window released it: it holds nothing now
    if (!events) {
      pool().CacheBlock(t.blocks[i], r.hashes[i], layout().id, i > 0 ? r.hashes[i - 1] : r.root);
      continue;
    }
    // The parent is the previous block. A sliding window may have released and evicted it:
    // the event then starts a new chain, so the group's stream never names a parent it does
    // not hold.
    const bool parent_held = i > 0 && pool().Lookup(r.hashes[i - 1], layout().id) != kNullBlock;
    CacheWithEvent(r, t.blocks[i], i, parent_held ? i - 1 : -1, i);
  }
  t.num_published = std::max(t.num_published, end);
}

void AttentionGroup::CommitThrough(const RequestView& r, int64_t full) {
  if (!ctx().enable_prefix_caching) return;
  TableState& t = tables_[r.slot];
  full = std::min<int64_t>(full, static_cast<int64_t>(t.blocks.size()));
  if (full <= t.num_published) return;
  // Commit publishes [num_published, num_cached): narrow it to the completed blocks, then
  // keep what a later step left pending.
  const int64_t pending = std::max(t.num_cached, full);
  t.num_cached = full;
  Commit(r);
  t.num_cached = pending;
}

void AttentionGroup::DropPending(const RequestView& r) {
  TableState& t = tables_[r.slot];
  t.num_cached = t.num_published;
}

void AttentionGroup::Free(const RequestView& r) {
  TableState& t = tables_[r.slot];
  // Last block first, so the tail of a prefix chain is evicted before its head.
  std::reverse(t.blocks.begin(), t.blocks.end());
  pool().Free(t.blocks);
  t.blocks.clear();
  t.num_cached = t.num_published = 0;
  t.num_released = 0;
}

int64_t AttentionGroup::NextEvent(const RequestView& r) const {
  const TableState& t = tables_[r.slot];
  const int64_t bs = layout().block_size;
  // A step ending past the table needs a block; one filling the next uncached block caches it.
  const int64_t grow = static_cast<int64_t>(t.blocks.size()) * bs + 1;
  return ctx().enable_prefix_caching ? std::min(grow, (t.num_cached + 1) * bs) : grow;
}

void AttentionGroup::Uncache(int32_t slot, int64_t first) {
  TableState& t = tables_[slot];
  for (int64_t i = first; i < t.num_published; ++i) {
    if (t.blocks[i] != kNullBlock) pool().Uncache(t.blocks[i]);
  }
  t.num_cached = std::min(t.num_cached, first);
  t.num_published = std::min(t.num_published, first);
}

absl::Status AttentionGroup::CheckRollback(const RequestView& r, RequestId id,
                                           int64_t keep) const {
  // Blocks that were full only with the dropped tokens were cached under hashes that are now
  // wrong. The request will rewrite them, so no other request may share them.
  const TableState& t = tables_[r.slot];
  for (int64_t i = keep / ctx().hash_block_size; i < t.num_cached; ++i) {
    if (t.blocks[i] != kNullBlock && pool().ref_count(t.blocks[i]) > 1) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot roll back request ", id.value, ": block ", t.blocks[i].value, " of group ",
          layout().id.value, " holding those tokens is shared with another request"));
    }
  }
  return CheckRecompute(r, id, keep - 1);
}

absl::Status AttentionGroup::CountRefs(int32_t slot, RequestId id,
                                       std::vector<int32_t>& refs) const {
  for (BlockId b : tables_[slot].blocks) {
    if (b == kNullBlock) continue;
    if (b.value >= static_cast<int32_t>(refs.size()) || !pool().is_mapped(b)) {
      return absl::InternalError(absl::StrCat("request ", id.value, " group ", layout().id.value,
                                              " holds invalid block ", b.value));
    }
    ++refs[b.value];
  }
  return absl::OkStatus();
}

// ---- Full attention and MLA: every block from the first ----

int64_t FullAttentionGroup::HitLength(absl::Span<const BlockHash> hashes, int64_t max_blocks,
                                      HitScope scope) const {
  int64_t n = 0;
  while (n < max_blocks && cached(hashes, n, scope)) ++n;
  return n;
}

int64_t FullAttentionGroup::KnownLength(absl::Span<const BlockHash> hashes, int64_t max_blocks,
                                        absl::Span<const RequestView> in_flight) const {
  const int64_t cached_blocks = HitLength(hashes, max_blocks, HitScope::kDevice);
  int64_t known = cached_blocks;
  // Hashes chain: equal hashes at block j mean equal prompts up to j, so one comparison per
  // block of the other request's pending range decides.
  for (const RequestView& other : in_flight) {
    const int64_t end = std::min({max_blocks, NumCached(other.slot),
                                  static_cast<int64_t>(other.hashes.size())});
    int64_t j = cached_blocks;
    while (j < end && other.hashes[j] == hashes[j]) ++j;
    known = std::max(known, j);
  }
  return known;
}

std::vector<int64_t> FullAttentionGroup::HitKeys(int64_t length) const {
  std::vector<int64_t> keys(static_cast<size_t>(length));
  for (int64_t i = 0; i < length; ++i) keys[i] = i;
  return keys;
}

}  // namespace kvpage::internal
