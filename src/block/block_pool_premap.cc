// BlockPool: asking the backing for the chunks an allocation needs before taking anything.
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "block/block_pool.h"
#include "internal/status_macros.h"

namespace kvpage {

absl::Status BlockPool::PremapFor(int64_t n) {
  const int64_t short_by = n - num_free_blocks();
  if (short_by <= 0) return absl::OkStatus();
  const int32_t premapped = budget_->num_premapped(pool_index_);
  int64_t missing = (short_by + bpc_ - 1) / bpc_ - premapped;
  if (missing <= 0) return absl::OkStatus();
  if (missing > num_unmapped_chunks() - premapped) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "pool ", pool_index_, " cannot map ", missing, " more chunks: ",
        num_unmapped_chunks() - premapped, " are left"));
  }
  // The lowest unmapped chunks, as MapNextChunk takes them.
  for (int32_t c = first_unmapped_hint_; missing > 0; ++c) {
    if (static_cast<size_t>(c) < chunks_.size() && chunks_[c].mapped) continue;
    if (budget_->IsPremapped(pool_index_, c)) continue;
    KVPAGE_RETURN_IF_ERROR(budget_->Premap(pool_index_, c, chunk_charge_));
    --missing;
  }
  return absl::OkStatus();
}

int32_t BlockPool::NextPremapped(int32_t from) const {
  int32_t c = from;
  while (c < max_chunks_ && ((static_cast<size_t>(c) < chunks_.size() && chunks_[c].mapped) ||
                             !budget_->IsPremapped(pool_index_, c))) {
    ++c;
  }
  KVPAGE_DCHECK(c < max_chunks_);
  return c;
}

}  // namespace kvpage
