// Asking the memory backing for a step's chunks before the step counts on them.
//
// A backing may refuse to map a chunk the budget has room for (a GPU out of memory, a host
// that will not commit). Every step therefore premaps the chunks its pools cannot do without
// before it takes a fresh block: before anything changes when the budget's free bytes hold
// them, else after idle chunks were given back to make room and the hit was taken (a refusal
// then gives the hit's blocks back). Either way a refusal leaves every request as it was and
// AllocateSlots returns false, as for a full budget; the backing's error stays readable
// through KvCacheManager::backing_status().
#include <algorithm>

#include "block/manager_impl.h"

namespace kvpage {

bool KvCacheManager::Impl::PremapChunks(absl::Span<const int64_t> need) {
  for (size_t p = 0; p < pools.size(); ++p) {
    if (need[p] <= pools[p]->num_free_blocks()) continue;
    if (!pools[p]->PremapFor(need[p]).ok()) {
      budget->DropPremapped();
      return false;
    }
  }
  return true;
}

bool KvCacheManager::Impl::PremapFresh() {
  std::fill(step_need.begin(), step_need.end(), 0);
  for (size_t i = 0; i < groups.size(); ++i) step_need[groups[i]->layout().pool] += step_fresh[i];
  return PremapChunks(step_need);
}

void KvCacheManager::Impl::ReturnHit(const internal::RequestView& r) {
  // The request held nothing before its first allocation: freeing its blocks undoes TakeHit.
  for (const auto& g : groups) g->Free(r);
}

absl::Status KvCacheManager::backing_status() const { return impl_->budget->backing_error(); }

}  // namespace kvpage
