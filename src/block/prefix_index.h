// PrefixIndex: a block pool's prefix-cache map, (block hash, group) -> the first block cached
// under that key (internal to BlockPool).
//
// Blocks cached under one key form a chain in the order they were cached, oldest first, kept
// in the pool's PrefixKey records; the map holds each chain's first block, so a lookup returns
// the oldest block still cached (vLLM's map of duplicates keeps insertion order too).
//
// Not thread-safe; owned by one BlockPool.
#ifndef KVPAGE_BLOCK_PREFIX_INDEX_H_
#define KVPAGE_BLOCK_PREFIX_INDEX_H_

#include <cstdint>
#include <functional>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "internal/huge_page_allocator.h"
#include "kvpage/types.h"

namespace kvpage::internal {

// A block's prefix-cache record, in the pool's array indexed by block id: its key and the next
// block cached under the same key.
struct PrefixKey {
  BlockHash hash;
  int32_t group = -1;     // -1 while the block carries no hash
  int32_t dup_next = -1;  // next block with the same key, -1 at the end of the chain
  int32_t dup_last = -1;  // in a chain's first block: its last block (itself when alone)
};

class PrefixIndex {
 public:
  // The first block cached under the key, or 0 (the null block) if none.
  int32_t Find(BlockHash hash, int32_t group) const {
    const auto it = map_.find(Key{hash, group});
    return it == map_.end() ? 0 : it->second;
  }
  // Makes `block` the key's first block unless the key has one; returns that block, or 0 when
  // `block` became it.
  int32_t FindOrInsert(BlockHash hash, int32_t group, int32_t block) {
    const auto [it, inserted] = map_.try_emplace(Key{hash, group}, block);
    return inserted ? 0 : it->second;
  }
  // The key's first block becomes `block`; 0 drops the key.
  void Replace(BlockHash hash, int32_t group, int32_t block) {
    if (block == 0) {
      map_.erase(Key{hash, group});
    } else {
      map_[Key{hash, group}] = block;
    }
  }
  // Room for n keys, so that inserts up to that many never rehash.
  void Reserve(size_t n) { map_.reserve(n); }
  void Clear() { map_ = {}; }
  // Calls fn(hash, group, first block) for every key.
  template <typename Fn>
  void ForEach(Fn&& fn) const {
    for (const auto& [key, block] : map_) fn(key.hash, key.group, block);
  }

 private:
  struct Key {
    BlockHash hash;
    int32_t group;
    bool operator==(const Key& o) const { return hash == o.hash && group == o.group; }
  };
  // Block hashes are uniform already (XXH3 or SHA-256 output): one multiply folds the group in
  // and spreads tests' small hand-made hashes too.
  struct KeyHash {
    size_t operator()(const Key& k) const {
      return (k.hash.lo ^ (k.hash.hi * 0xC2B2AE3D27D4EB4Full) ^
              (static_cast<uint64_t>(static_cast<uint32_t>(k.group)) + 1) * 0x9E3779B97F4A7C15ull) *
             0xFF51AFD7ED558CCDull;
    }
  };
  // In huge pages, like the pool's records: a lookup lands anywhere in a table of megabytes.
  absl::flat_hash_map<Key, int32_t, KeyHash, std::equal_to<Key>,
                      HugePageAllocator<std::pair<const Key, int32_t>>>
      map_;
};

}  // namespace kvpage::internal

#endif  // KVPAGE_BLOCK_PREFIX_INDEX_H_
