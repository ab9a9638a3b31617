// The longest prefix every layer group can serve from the cache.
//
// Each kind answers "given at most L blocks, how many leading blocks can I serve?":
//   * full attention and MLA need every block from the start (left to right);
//   * a sliding window needs only the blocks its window reaches from the hit's end: a run of
//     cdiv(W − 1, bs) cached blocks ending there, or a shorter run that starts at block 0
//     (scanned right to left);
//   * a recurrent group needs a state snapshot taken exactly at the hit's end.
// The answers shrink one another, so they are applied in turn until none shrinks: a fixed
// point. Full attention is downward-closed, so after its first answer it only gets trimmed.
#include <algorithm>

#include "block/manager_impl.h"
#include "model/kv_sizing.h"

namespace kvpage {

using internal::GroupLayout;
using internal::RequestState;

int64_t KvCacheManager::Impl::GroupHitLength(const GroupLayout& g,
                                             absl::Span<const BlockHash> hashes,
                                             int64_t max_blocks) const {
  const BlockPool& pool = *pools[g.pool];
  auto cached = [&](int64_t i) { return pool.Lookup(hashes[i], g.id) != kNullBlock; };
  switch (g.kind) {
    case LayerKind::kFullAttention:
    case LayerKind::kMla: {
      int64_t n = 0;
      while (n < max_blocks && cached(n)) ++n;
      return n;
    }
    case LayerKind::kSlidingWindow: {
      const int64_t needed = internal::CeilDiv(g.window - 1, g.block_size);
      if (needed == 0) return max_blocks;
      int64_t run = 0;
      for (int64_t i = max_blocks - 1; i >= 0; --i) {
        run = cached(i) ? run + 1 : 0;
        if (run >= needed) return i + run;  // the run [i, i + needed) ends the hit
      }
      return run;  // a run touching block 0 serves a shorter prefix on its own
    }
    case LayerKind::kLinearAttention: {
      for (int64_t i = max_blocks; i > 0; --i) {
        if (cached(i - 1)) return i;
      }
      return 0;
    }
  }
  return 0;
}

CacheHit KvCacheManager::Impl::FindLongestHit(const RequestState& st) const {
  CacheHit hit;
  hit.blocks.resize(groups.size());
  const absl::Span<const BlockHash> hashes = st.hashes.hashes();
  // The last token is always recomputed: its logits are needed.
  int64_t length = std::min<int64_t>((NumTokens(st) - 1) / block_size,
                                     static_cast<int64_t>(hashes.size()));
  if (!config.enable_prefix_caching || st.skip_prefix_cache_read || length <= 0) return hit;

  // Full-attention groups first: their answer is final once trimmed.
  std::vector<const GroupLayout*> order;
  for (const GroupLayout& g : groups) order.push_back(&g);
  std::stable_sort(order.begin(), order.end(), [](const GroupLayout* a, const GroupLayout* b) {
    auto rank = [](LayerKind k) {
      return k == LayerKind::kFullAttention || k == LayerKind::kMla ? 0
             : k == LayerKind::kSlidingWindow                       ? 1
                                                                     : 2;
    };
    return rank(a->kind) < rank(b->kind);
  });
  bool changed = true;
  while (changed && length > 0) {
    changed = false;
    for (const GroupLayout* g : order) {
      const int64_t served = GroupHitLength(*g, hashes, length);
      if (served < length) {
        length = served;
        changed = true;
      }
    }
  }
  if (length <= 0) return hit;

  hit.num_tokens = length * block_size;
  for (const GroupLayout& g : groups) {
    const BlockPool& pool = *pools[g.pool];
    std::vector<BlockId>& blocks = hit.blocks[g.id.value];
    if (g.kind == LayerKind::kLinearAttention) {
      blocks.push_back(pool.Lookup(hashes[length - 1], g.id));
      continue;
    }
    int64_t first = 0;
    if (g.kind == LayerKind::kSlidingWindow) {
      first = std::max<int64_t>(0, length - internal::CeilDiv(g.window - 1, g.block_size));
    }
    blocks.assign(first, kNullBlock);
    for (int64_t i = first; i < length; ++i) blocks.push_back(pool.Lookup(hashes[i], g.id));
  }
  return hit;
}

}  // namespace kvpage
