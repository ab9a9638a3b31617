// PrefixIndex: see prefix_index.h for the layout and why.
#include "block/prefix_index.h"

#include <algorithm>
#include <bit>
#include <vector>

#include "absl/strings/str_cat.h"
#include "internal/status_macros.h"

namespace kvpage::internal {

int32_t PrefixIndex::FindOrInsert(BlockHash hash, int32_t group, int32_t block) {
  KVPAGE_DCHECK(block > 0 && KeyOf(block, hash, group));
  // Past three quarters of the slots (the pool reserves for half), double.
  if (4 * (size_ + 1) > 3 * kSlots * buckets_.size()) {
    Rebuild(std::max(kMinBuckets, 2 * buckets_.size()));
  }
  const uint64_t mix = Mix(hash, group);
  const uint32_t tag = static_cast<uint32_t>(mix);
  const size_t mask = buckets_.size() - 1;
  const size_t home = mix >> shift_;
  // One pass: look for the key along its probe chain, remembering the first free slot.
  size_t free_bucket = 0;
  int free_slot = -1;
  for (size_t i = home;; i = (i + 1) & mask) {
    const Bucket& b = buckets_[i];
    const SlotMasks m = Scan(b, tag);
    for (uint32_t c = m.match; c != 0; c &= c - 1) {
      const int32_t at = b.blocks[std::countr_zero(c)];
      if (KeyOf(at, hash, group)) return at;
    }
    if (free_slot < 0 && m.empty != 0) {
      free_bucket = i;
      free_slot = std::countr_zero(m.empty);
    }
    if (b.passing == 0) break;
  }
  if (free_slot >= 0) {
    Store(tag, home, free_bucket, free_slot, block);
  } else {
    Place(tag, home, block);
  }
  return 0;
}

void PrefixIndex::Store(uint32_t tag, size_t home, size_t at, int slot, int32_t block) {
  buckets_[at].tags[slot] = tag;
  buckets_[at].blocks[slot] = block;
  // Searches for this key now pass every bucket from its home up to where it sits.
  const size_t mask = buckets_.size() - 1;
  for (size_t i = home; i != at; i = (i + 1) & mask) {
    ++buckets_[i].passing;
    ++total_passing_;
  }
  ++size_;
}

void PrefixIndex::Place(uint32_t tag, size_t home, int32_t block) {
  const size_t mask = buckets_.size() - 1;
  for (size_t i = home;; i = (i + 1) & mask) {
    const uint32_t empty = Scan(buckets_[i], tag).empty;
    if (empty != 0) {
      Store(tag, home, i, std::countr_zero(empty), block);
      return;
    }
  }
}

void PrefixIndex::Replace(BlockHash hash, int32_t group, int32_t old_block, int32_t new_block) {
  KVPAGE_DCHECK(!buckets_.empty() && old_block > 0);
  const size_t mask = buckets_.size() - 1;
  const size_t home = Home(hash, group);
  for (size_t i = home;; i = (i + 1) & mask) {
    Bucket& b = buckets_[i];
    for (int s = 0; s < kSlots; ++s) {
      if (b.blocks[s] != old_block) continue;
      b.blocks[s] = new_block;  // same key: the tag stays
      if (new_block == 0) {
        // The entry goes: searches for it no longer pass the buckets before it.
        for (size_t k = home; k != i; k = (k + 1) & mask) {
          --buckets_[k].passing;
          --total_passing_;
        }
        --size_;
      }
      return;
    }
    KVPAGE_DCHECK(b.passing > 0);
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
  total_passing_ = 0;
}

void PrefixIndex::Rebuild(size_t num_buckets) {
  std::vector<Bucket, HugePageAllocator<Bucket>> old(num_buckets);
  old.swap(buckets_);
  shift_ = 64 - std::countr_zero(num_buckets);
  size_ = 0;
  total_passing_ = 0;
  for (const Bucket& b : old) {
    for (int s = 0; s < kSlots; ++s) {
      const int32_t block = b.blocks[s];
      if (block != 0) Place(b.tags[s], Home(keys_[block].hash, keys_[block].group), block);
    }
  }
}

absl::Status PrefixIndex::CheckInvariants() const {
  // Recount every bucket's `passing` from where the entries sit relative to their homes.
  std::vector<uint32_t> passing(buckets_.size(), 0);
  const size_t mask = buckets_.empty() ? 0 : buckets_.size() - 1;
  size_t entries = 0;
  size_t total = 0;
  for (size_t i = 0; i < buckets_.size(); ++i) {
    const Bucket& b = buckets_[i];
    for (int s = 0; s < kSlots; ++s) {
      const int32_t block = b.blocks[s];
      if (block == 0) continue;
      ++entries;
      const BlockHash hash = keys_[block].hash;
      const int32_t group = keys_[block].group;
      if (b.tags[s] != Tag(hash, group)) {
        return absl::InternalError(absl::StrCat("prefix index: block ", block, " has a stale tag"));
      }
      for (size_t k = Home(hash, group); k != i; k = (k + 1) & mask) {
        ++passing[k];
        ++total;
      }
    }
  }
  for (size_t i = 0; i < buckets_.size(); ++i) {
    if (passing[i] != buckets_[i].passing) {
      return absl::InternalError(absl::StrCat("prefix index: bucket ", i, " is passed by ",
                                              passing[i], " entries but counts ",
                                              buckets_[i].passing));
    }
  }
  if (entries != size_ || total != total_passing_) {
    return absl::InternalError(absl::StrCat("prefix index counts ", size_, " entries and ",
                                            total_passing_, " passes, found ", entries, " and ",
                                            total));
  }
  // With the counts right, every entry is found from its home; check it anyway (cheap).
  for (const Bucket& b : buckets_) {
    for (int s = 0; s < kSlots; ++s) {
      const int32_t block = b.blocks[s];
      if (block != 0 && Find(keys_[block].hash, keys_[block].group) != block) {
        return absl::InternalError(absl::StrCat("prefix index: block ", block,
                                                " is not found under its key"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace kvpage::internal
