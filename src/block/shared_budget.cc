// Moving chunks between pools through the shared budget.
//
// Every pool maps chunks from one MemoryBudget. A pool short of blocks first takes fresh
// memory: other pools' idle chunks whose blocks are all clean go back to the budget before it
// evicts its own cache; only then do other pools give up idle chunks that still hold cached
// blocks. Bytes that pools served later in the same allocation must map are kept for them.
#include <algorithm>

#include "block/manager_impl.h"
#include "internal/status_macros.h"
#include "model/kv_sizing.h"

namespace kvpage {

using internal::CeilDiv;

bool KvCacheManager::Impl::CanTake(absl::Span<const int64_t> need,
                                   absl::Span<const int64_t> pinned_idle) const {
  int64_t bytes_needed = 0;
  int64_t bytes_available = budget->free_bytes();
  for (size_t p = 0; p < pools.size(); ++p) {
    const BlockPool& pool = *pools[p];
    const int64_t avail = pool.num_free_blocks();
    if (need[p] > avail) {
      const int64_t chunks = CeilDiv(need[p] - avail, pool.blocks_per_chunk());
      if (chunks > pool.num_unmapped_chunks()) return false;
      bytes_needed += chunks * pool.chunk_charge();
    } else {
      // Idle chunks this pool can give up and still serve its own need.
      const int64_t spare = (avail - need[p]) / pool.blocks_per_chunk();
      const int64_t idle = pool.num_idle_chunks() - pinned_idle[p];
      bytes_available += std::min<int64_t>(spare, idle) * pool.chunk_charge();
    }
  }
  return bytes_needed <= bytes_available;
}

void KvCacheManager::Impl::TakeFromPool(int32_t p, int64_t n, absl::Span<int64_t> need,
                                        int64_t reserved_bytes, std::vector<BlockId>* out) {
  BlockPool& pool = *pools[p];
  need[p] = std::max<int64_t>(0, need[p] - n);
  if (n <= pool.num_clean_blocks()) {  // the common case: no chunk has to move
    const bool taken = pool.Allocate(static_cast<int32_t>(n), out);
    KVPAGE_DCHECK(taken);
    (void)taken;
    return;
  }
  // Bytes later pools of this allocation must map are off limits for keeping our cache: raise
  // the headroom by them while this pool allocates (it still maps what it must).
  const int64_t base_headroom = budget->headroom_bytes();
  budget->set_headroom_bytes(base_headroom + reserved_bytes);
  // Prefer fresh memory over evicting this pool's cache: free other pools' clean idle chunks.
  const int64_t want_chunks =
      CeilDiv(std::max<int64_t>(0, n - pool.num_clean_blocks()), pool.blocks_per_chunk());
  const int64_t want_bytes = std::min<int64_t>(want_chunks, pool.num_unmapped_chunks()) *
                             pool.chunk_charge();
  while (budget->free_bytes() < want_bytes + budget->headroom_bytes() &&
         ReleaseSpareChunk(need, /*allow_cache_loss=*/false, /*except=*/p)) {
  }
  // Still short even after evicting our own cache: take other pools' idle chunks with theirs.
  while (pool.AllocatableNow(reserved_bytes) < n &&
         ReleaseSpareChunk(need, /*allow_cache_loss=*/true, /*except=*/p)) {
  }
  KVPAGE_DCHECK(pool.AllocatableNow() >= n);
  const bool taken = pool.Allocate(static_cast<int32_t>(n), out);  // premapped: cannot fail
  KVPAGE_DCHECK(taken);
  (void)taken;
  budget->set_headroom_bytes(base_headroom);
}

int64_t KvCacheManager::Impl::ReservedForOthers(int32_t p, absl::Span<const int64_t> need) const {
  int64_t bytes = 0;
  for (size_t q = 0; q < pools.size(); ++q) {
    if (static_cast<int32_t>(q) == p || need[q] <= pools[q]->num_free_blocks()) continue;
    bytes += CeilDiv(need[q] - pools[q]->num_free_blocks(), pools[q]->blocks_per_chunk()) *
             pools[q]->chunk_charge();
  }
  return bytes;
}

bool KvCacheManager::Impl::ReleaseSpareChunk(absl::Span<const int64_t> need, bool allow_cache_loss,
                                             int32_t except) {
  for (size_t q = 0; q < pools.size(); ++q) {
    if (static_cast<int32_t>(q) == except) continue;
    BlockPool& pool = *pools[q];
    if (pool.num_free_blocks() - need[q] < pool.blocks_per_chunk()) continue;
    if (pool.ReleaseIdleChunk(allow_cache_loss)) return true;
  }
  return false;
}

void KvCacheManager::Impl::MakeRoom(absl::Span<const int64_t> need) {
  // Before the pools serve themselves (and might reuse them), idle chunks the other pools can
  // spare go back to the budget, clean ones first.
  const int64_t deficit = ReservedForOthers(-1, need);
  for (bool cache_loss : {false, true}) {
    while (budget->free_bytes() < deficit && ReleaseSpareChunk(need, cache_loss, /*except=*/-1)) {
    }
  }
}

int64_t KvCacheManager::ReleaseIdleChunks() {
  if (impl_->step_open) {  // the pending step's tables may point into idle chunks
    impl_->release_deferred = true;
    return 0;
  }
  const int64_t before = impl_->budget->used_bytes();
  for (const auto& pool : impl_->pools) pool->ReleaseIdleChunks();
  return before - impl_->budget->used_bytes();
}

}  // namespace kvpage
