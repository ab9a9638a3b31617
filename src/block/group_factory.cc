// The one place that maps a layer kind to its group manager: a new kind adds its class here.
#include "block/attention_group.h"
#include "block/group_manager.h"
#include "block/recurrent_group.h"
#include "block/sliding_window_group.h"

namespace kvpage::internal {

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
