// PrefixIndex: see prefix_index.h for the layout and why.
#include "block/prefix_index.h"

#include <algorithm>
#include <bit>

#include "absl/strings/str_cat.h"
#include "internal/status_macros.h"

namespace kvpage::internal {

int32_t PrefixIndex::FindOrInsert(BlockHash hash, int32_t group, int32_t block) {
  KVPAGE_DCHECK(block > 0 && KeyOf(block, hash, group));
  // Past three quarters of the slots (the pool reserves for half), double.
  if (4 * (size_ + 1) > 3 * kSlots * buckets_.size()) Rebuild(std::max(kMinBuckets, 2 * buckets_.size()));
  const uint64_t mix = Mix(hash, group);
  const uint32_t tag = static_cast<uint32_t>(mix);
  const size_t mask = buckets_.size() - 1;
  const size_t home = mix >> shift_;
  // One pass: look for the key along its probe chain, remembering the first free slot.
  Bucket* free_bucket = nullptr;
  int free_slot = -1;
  for (size_t i = home;; i = (i + 1) & mask) {
    Bucket& b = buckets_[i];
    for (int s = 0; s < kSlots; ++s) {
      const int32_t at = b.blocks[s];
      if (at == 0) {
        if (free_bucket == nullptr) {
          free_bucket = &b;
          free_slot = s;
        }
      } else if (b.tags[s] == tag && KeyOf(at, hash, group)) {
        return at;
      }
    }
    if (!b.overflowed) break;
  }
  if (free_bucket != nullptr) {
    // On the chain already: a search from home reaches it.
    free_bucket->tags[free_slot] = tag;
    free_bucket->blocks[free_slot] = block;
    ++size_;
  } else {
    Place(tag, home, block);
  }
  // Many overflow marks (left by removed entries) make searches long: start over clean, and
  // larger if the keys themselves crowd their homes.
  if (num_overflowed_ > buckets_.size() / 8) {
    Rebuild(buckets_.size());
    if (num_overflowed_ > buckets_.size() / 16) Rebuild(2 * buckets_.size());
  }
  return 0;
}

void PrefixIndex::Place(uint32_t tag, size_t home, int32_t block) {
  const size_t mask = buckets_.size() - 1;
  for (size_t i = home;; i = (i + 1) & mask) {
    Bucket& b = buckets_[i];
    for (int s = 0; s < kSlots; ++s) {
      if (b.blocks[s] == 0) {
        b.tags[s] = tag;
        b.blocks[s] = block;
        ++size_;
        return;
      }
    }
    if (!b.overflowed) {
      b.overflowed = 1;
      ++num_overflowed_;
    }
  }
}

void PrefixIndex::Replace(BlockHash hash, int32_t group, int32_t old_block, int32_t new_block) {
  KVPAGE_DCHECK(!buckets_.empty() && old_block > 0);
  const size_t mask = buckets_.size() - 1;
  for (size_t i = Home(hash, group);; i = (i + 1) & mask) {
    Bucket& b = buckets_[i];
    for (int s = 0; s < kSlots; ++s) {
      if (b.blocks[s] == old_block) {
        b.blocks[s] = new_block;  // same key: the tag stays
        if (new_block == 0) --size_;
        return;
      }
    }
    KVPAGE_DCHECK(b.overflowed);
  }
}

void PrefixIndex::Reserve(size_t n) {
  // Half load: 3.5 keys per bucket of 7.
  const size_t want = std::max(kMinBuckets, std::bit_ceil((2 * n + kSlots - 1) / kSlots));
  if (want > buckets_.size()) Rebuild(want);
}

void PrefixIndex::Clear() {
  buckets_ = {};
  size_ = 0;
  num_overflowed_ = 0;
}

void PrefixIndex::Rebuild(size_t num_buckets) {
  std::vector<Bucket> old(num_buckets);
  old.swap(buckets_);
  shift_ = 64 - std::countr_zero(num_buckets);
  size_ = 0;
  num_overflowed_ = 0;
  for (const Bucket& b : old) {
    for (int s = 0; s < kSlots; ++s) {
      const int32_t block = b.blocks[s];
      if (block != 0) Place(b.tags[s], Home(keys_[block].hash, keys_[block].group), block);
    }
  }
}

absl::Status PrefixIndex::CheckInvariants() const {
  size_t entries = 0;
  size_t overflowed = 0;
  for (size_t i = 0; i < buckets_.size(); ++i) {
    const Bucket& b = buckets_[i];
    overflowed += b.overflowed;
    for (int s = 0; s < kSlots; ++s) {
      const int32_t block = b.blocks[s];
      if (block == 0) continue;
      ++entries;
      const BlockHash hash = keys_[block].hash;
      const int32_t group = keys_[block].group;
      if (b.tags[s] != Tag(hash, group)) {
        return absl::InternalError(absl::StrCat("prefix index: block ", block, " has a stale tag"));
      }
      if (Find(hash, group) != block) {
        return absl::InternalError(absl::StrCat("prefix index: block ", block,
                                                " is not found under its key"));
      }
    }
  }
  if (entries != size_ || overflowed != num_overflowed_) {
    return absl::InternalError(absl::StrCat("prefix index counts ", size_, " entries and ",
                                            num_overflowed_, " overflow marks, found ", entries,
                                            " and ", overflowed));
  }
  return absl::OkStatus();
}

}  // namespace kvpage::internal
