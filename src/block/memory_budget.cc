// MemoryBudget: charging chunks, and mapping them ahead of the charge (Premap).
#include "block/memory_budget.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kvpage {

bool MemoryBudget::TakeChunk(int32_t pool, int32_t chunk, int64_t bytes) {
  if (auto it = premapped_.find(Key(pool, chunk)); it != premapped_.end()) {
    // Mapped already, its bytes kept for it: only the charge moves.
    premapped_bytes_ -= it->second;
    --premapped_per_pool_[pool];
    premapped_.erase(it);
    used_bytes_ += bytes;
    return true;
  }
  if (bytes > free_bytes() - premapped_bytes_) return false;
  if (backing_ != nullptr) {
    absl::Status mapped = backing_->MapChunk(pool, chunk);
    if (!mapped.ok()) {
      RecordError(std::move(mapped));
      return false;
    }
  }
  used_bytes_ += bytes;
  return true;
}

void MemoryBudget::GiveChunk(int32_t pool, int32_t chunk, int64_t bytes) {
  if (backing_ != nullptr) {
    absl::Status unmapped = backing_->UnmapChunk(pool, chunk);
    if (!unmapped.ok()) RecordError(std::move(unmapped));
  }
  used_bytes_ -= bytes;
}

absl::Status MemoryBudget::Premap(int32_t pool, int32_t chunk, int64_t bytes) {
  if (bytes > free_bytes() - premapped_bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "chunk ", chunk, " of pool ", pool, " needs ", bytes, " bytes; the budget has ",
        free_bytes() - premapped_bytes_, " free"));
  }
  if (backing_ != nullptr) {
    absl::Status mapped = backing_->MapChunk(pool, chunk);
    if (!mapped.ok()) {
      RecordError(mapped);
      return mapped;
    }
  }
  premapped_.emplace(Key(pool, chunk), bytes);
  if (static_cast<size_t>(pool) >= premapped_per_pool_.size()) {
    premapped_per_pool_.resize(static_cast<size_t>(pool) + 1, 0);
  }
  ++premapped_per_pool_[pool];
  premapped_bytes_ += bytes;
  return absl::OkStatus();
}

bool MemoryBudget::IsPremapped(int32_t pool, int32_t chunk) const {
  return !premapped_.empty() && premapped_.contains(Key(pool, chunk));
}

int32_t MemoryBudget::num_premapped(int32_t pool) const {
  return static_cast<size_t>(pool) < premapped_per_pool_.size() ? premapped_per_pool_[pool] : 0;
}

void MemoryBudget::DropPremapped() {
  if (premapped_.empty()) return;
  for (const auto& [key, bytes] : premapped_) {
    const auto pool = static_cast<int32_t>(key >> 32);
    const auto chunk = static_cast<int32_t>(key & 0xffffffffu);
    if (backing_ != nullptr) {
      absl::Status unmapped = backing_->UnmapChunk(pool, chunk);
      if (!unmapped.ok()) RecordError(std::move(unmapped));
    }
  }
  premapped_.clear();
  std::fill(premapped_per_pool_.begin(), premapped_per_pool_.end(), 0);
  premapped_bytes_ = 0;
}

}  // namespace kvpage
