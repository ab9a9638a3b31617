// What the layer kinds share, and the one place that maps a kind to its group manager.
#include "block/group_manager.h"

#include "absl/strings/str_cat.h"
#include "block/attention_group.h"
#include "block/recurrent_group.h"
#include "block/sliding_window_group.h"

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

std::unique_ptr<GroupManager> MakeGroupManager(const GroupLayout& layout, BlockPool* pool,
                                               const GroupContext* context) {
  switch (layout.kind) {
    case LayerKind::kFullAttention:
    case LayerKind::kMla:
      return std::make_unique<FullAttentionGroup>(layout, pool, context);
    case LayerKind::kSlidingWindow:
      return std::make_unique<SlidingWindowGroup>(layout, pool, context);
    case LayerKind::kLinearAttention:
      return std::make_unique<RecurrentGroup>(layout, pool, context);
  }
  return nullptr;
}

}  // namespace kvpage::internal
