// What the layer kinds share.
#include "block/group_manager.h"

#include "absl/strings/str_cat.h"
#include "internal/status_macros.h"

namespace kvpage::internal {

absl::Status GroupManager::CheckHit(const RequestView& r, const StepArgs& step) const {
  // Block i of the hit must still be cached under the request's i-th hash: nothing may have
  // evicted it since the lookup.
  const std::vector<BlockId>& blocks = *step.hit;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const BlockId b = blocks[i];
    if (b == kNullBlock) continue;
    if (b.value > pool().capacity() || !pool().is_cached(b) || i >= r.hashes.size() ||
        !(pool().block_hash(b) == r.hashes[i])) {
      return absl::FailedPreconditionError(
          absl::StrCat("hit block ", b.value, " of group ", layout_.id.value,
                       " is no longer cached; ask GetComputedBlocks again"));
    }
  }
  return absl::OkStatus();
}

std::vector<BlockId> GroupManager::HitBlocks(absl::Span<const BlockHash> hashes,
                                             int64_t length) const {
  std::vector<BlockId> blocks;
  for (int64_t i : HitKeys(length)) {
    blocks.push_back(i < 0 ? kNullBlock : pool().Lookup(hashes[i], layout_.id));
  }
  return blocks;
}

void GroupManager::CacheLoaded(const RequestView& r, BlockId block, int64_t i) const {
  // An attention block's own tokens, after the previous block when the group holds it (loads
  // run first block first, so it does).
  if (!pool().records_events()) {
    pool().CacheBlock(block, r.hashes[i], layout_.id, i > 0 ? r.hashes[i - 1] : r.root);
    return;
  }
  const bool parent_held = i > 0 && pool().Lookup(r.hashes[i - 1], layout_.id) != kNullBlock;
  CacheWithEvent(r, block, i, parent_held ? i - 1 : -1, i);
}

void GroupManager::CacheWithEvent(const RequestView& r, BlockId block, int64_t i,
                                  int64_t parent, int64_t first) const {
  const int64_t bs = ctx().hash_block_size;
  KVPAGE_DCHECK(parent < first && first <= i &&
                static_cast<int64_t>(r.tokens.size()) >= (i + 1) * bs);
  const StoredBlockDetail detail{
      .has_parent = parent >= 0,
      .lora_id = r.lora_id,
      .token_ids = r.tokens.subspan(static_cast<size_t>(first * bs),
                                    static_cast<size_t>((i + 1 - first) * bs))};
  pool().CacheBlock(block, r.hashes[i], layout_.id, parent >= 0 ? r.hashes[parent] : r.root,
                    &detail);
}

int64_t GroupManager::HeldParent(const RequestView& r, int64_t i) const {
  int64_t j = i - 1;
  while (j >= 0 && pool().Lookup(r.hashes[j], layout_.id) == kNullBlock) --j;
  return j;
}

}  // namespace kvpage::internal
