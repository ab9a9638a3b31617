// PrefixIndex: a block pool's prefix-cache map, (block hash, group) -> the first block cached
// under that key (internal to BlockPool).
//
// Why not a general hash map: caching a block in steady decode is one insert of a key that is
// almost never present, at a random place of a table that is far larger than the CPU caches,
// and a decode step makes dozens of them. absl::flat_hash_map spreads one probe over a control
// group and a slot 32 bytes wide at a random offset within a 512-byte slot group, so an insert
// touches two or three cache lines that a prefetch of the key cannot all name in advance. Here a
// key's home is one 64-byte bucket holding seven entries of a 32-bit tag and a block id, and the
// full key is not stored at all: the pool keeps every cached block's hash and group in its own
// array of PrefixKey records, so a tag match is confirmed there. An insert then touches exactly
// its home bucket line (the confirming load happens only on a tag match, about
// once in a billion probes for a new key), and the table takes 8 bytes per entry instead of 32.
//
// Probing: a key lives in its home bucket or, if that bucket was full when it was inserted, in
// one of the buckets after it. Each bucket counts the entries whose search passes it (those
// stored beyond it with their home at or before it); a search stops at the first bucket with
// a count of zero. Removing an entry decrements the counts it added, so searches never get
// longer than the entries in the table require, and no periodic rebuild is needed: the table
// is only rebuilt when it grows.
//
// Capacity: Reserve(n) keeps the load at or under half of the slots for n keys (the pool
// reserves for the blocks it has records for, as they grow), so an insert rarely finds its
// home full (at that load, about 3 % of buckets are home to more than seven
// keys: Poisson(3.5)).
//
// Not thread-safe; owned by one BlockPool.
#ifndef KVPAGE_BLOCK_PREFIX_INDEX_H_
#define KVPAGE_BLOCK_PREFIX_INDEX_H_

#include <bit>
#include <cstdint>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "absl/status/status.h"
#include "internal/huge_page_allocator.h"
#include "kvpage/types.h"

namespace kvpage::internal {

// A block's prefix-cache record, in the pool's array indexed by block id: its key and the next
// block cached under the same key. 32 bytes, so confirming a key reads one cache line.
//
// Blocks cached under one key form a chain in the order they were cached, oldest first; the
// index holds the first, so a lookup returns the oldest block still cached (vLLM's map of
// duplicates keeps insertion order too).
struct alignas(32) PrefixKey {
  BlockHash hash;
  int32_t group = -1;     // -1 while the block carries no hash
  int32_t dup_next = -1;  // next block with the same key, -1 at the end of the chain
  int32_t dup_last = -1;  // in a chain's first block: its last block (itself when alone)
};
static_assert(sizeof(PrefixKey) == 32);

class PrefixIndex {
 public:
  // `keys` is the pool's per-block record array (indexed by block id): a block in the index
  // has its key there. The pool calls set_keys when that array moves (it grows with use).
  explicit PrefixIndex(const PrefixKey* keys) : keys_(keys) {}
  void set_keys(const PrefixKey* keys) { keys_ = keys; }

  // The block registered under the key, or 0 (the null block) if none.
  int32_t Find(BlockHash hash, int32_t group) const {
    if (buckets_.empty()) return 0;
    const uint64_t mix = Mix(hash, group);
    const uint32_t tag = static_cast<uint32_t>(mix);
    const size_t mask = buckets_.size() - 1;
    // Early exit, slot by slot: a lookup that hits usually matches in the first slots, and
    // Scan's whole-bucket compare made the hit path slower (BM_PrefixHitLookup).
    for (size_t i = mix >> shift_;; i = (i + 1) & mask) {
      const Bucket& b = buckets_[i];
      for (int s = 0; s < kSlots; ++s) {
        const int32_t at = b.blocks[s];
        if (b.tags[s] == tag && at != 0 && KeyOf(at, hash, group)) return at;
      }
      if (b.passing == 0) return 0;
    }
  }
  // Registers `block` under the key unless a block already is; returns that block, or 0 when
  // `block` was registered. REQUIRES: block > 0, and its key is already in its PrefixKey record.
  int32_t FindOrInsert(BlockHash hash, int32_t group, int32_t block);
  // The entry that holds `old_block` under the key now holds `new_block` (0 = the entry goes).
  // REQUIRES: old_block is registered under the key.
  void Replace(BlockHash hash, int32_t group, int32_t old_block, int32_t new_block);
  // Room for `n` keys at half load: grows (rehashes) when the table is smaller than that.
  void Reserve(size_t n);
  // Drops every entry and frees the table.
  void Clear();
  size_t size() const { return size_; }
  size_t num_buckets() const { return buckets_.size(); }
  // The buckets searches pass in all: the sum over entries of their distance from home.
  size_t total_displacement() const { return total_passing_; }
  // Calls fn(block) for every registered block.
  template <typename Fn>
  void ForEach(Fn&& fn) const {
    for (const Bucket& b : buckets_) {
      for (int32_t block : b.blocks) {
        if (block != 0) fn(block);
      }
    }
  }
  // Tags match the keys, every bucket's pass count equals the entries that pass it, every entry
  // is found under its key, and the totals agree.
  absl::Status CheckInvariants() const;

 private:
  static constexpr int kSlots = 7;
  static constexpr size_t kMinBuckets = 8;
  // One cache line. blocks[i] == 0 marks a free slot (block 0 is never cached).
  struct alignas(64) Bucket {
    uint32_t tags[kSlots] = {};
    int32_t blocks[kSlots] = {};
    uint32_t passing = 0;  // entries stored beyond this bucket whose search passes it
    uint32_t unused = 0;
  };
  static_assert(sizeof(Bucket) == 64);
  // Bit s of `match`: slot s holds an entry with the tag; of `empty`: slot s is free. Without
  // a branch per slot (which slots are taken is random, so those branches mispredict). With
  // SSE2 (every x86-64), each seven-slot array is compared as two overlapping groups of four
  // lanes, slots 0–3 and 3–6: about 16 instructions instead of 70.
  struct SlotMasks {
    uint32_t match = 0;
    uint32_t empty = 0;
  };
  static SlotMasks Scan(const Bucket& b, uint32_t tag) {
    SlotMasks m;
#if defined(__SSE2__)
    const __m128i key = _mm_set1_epi32(static_cast<int>(tag));
    const __m128i zero = _mm_setzero_si128();
    auto lanes = [](const void* at) { return _mm_loadu_si128(static_cast<const __m128i*>(at)); };
    auto bits = [](__m128i eq) {
      return static_cast<uint32_t>(_mm_movemask_ps(_mm_castsi128_ps(eq)));
    };
    const uint32_t tagged = bits(_mm_cmpeq_epi32(lanes(&b.tags[0]), key)) |
                            bits(_mm_cmpeq_epi32(lanes(&b.tags[3]), key)) << 3;
    m.empty = bits(_mm_cmpeq_epi32(lanes(&b.blocks[0]), zero)) |
              bits(_mm_cmpeq_epi32(lanes(&b.blocks[3]), zero)) << 3;
    m.match = tagged & ~m.empty;
#else
    for (int s = 0; s < kSlots; ++s) {
      const uint32_t free = b.blocks[s] == 0 ? 1u : 0u;
      m.empty |= free << s;
      m.match |= (b.tags[s] == tag ? 1u - free : 0u) << s;
    }
#endif
    return m;
  }

  // Block hashes are uniform already (XXH3 or SHA-256 output); the multiply spreads tests'
  // small hand-made hashes too, and folds the group in.
  static uint64_t Mix(BlockHash hash, int32_t group) {
    return (hash.lo ^ (hash.hi * 0xC2B2AE3D27D4EB4Full) ^
            (static_cast<uint64_t>(static_cast<uint32_t>(group)) + 1) * 0x9E3779B97F4A7C15ull) *
           0xFF51AFD7ED558CCDull;
  }
  size_t Home(BlockHash hash, int32_t group) const { return Mix(hash, group) >> shift_; }
  static uint32_t Tag(BlockHash hash, int32_t group) {
    return static_cast<uint32_t>(Mix(hash, group));
  }
  bool KeyOf(int32_t block, BlockHash hash, int32_t group) const {
    return keys_[block].hash == hash && keys_[block].group == group;
  }
  // Writes the entry into slot `slot` of bucket `at` and counts the buckets from `home` to it.
  void Store(uint32_t tag, size_t home, size_t at, int slot, int32_t block);
  // Places a key known to be absent (no search for it first).
  void Place(uint32_t tag, size_t home, int32_t block);
  // Re-inserts every entry into `num_buckets` fresh buckets (a power of two).
  void Rebuild(size_t num_buckets);

  const PrefixKey* keys_;
  // A power of two (at least kMinBuckets), or empty.
  std::vector<Bucket, HugePageAllocator<Bucket>> buckets_;
  int shift_ = 0;                // 64 − log2(buckets): Home takes the top bits of Mix
  size_t size_ = 0;
  size_t total_passing_ = 0;     // sum of the buckets' `passing`
};

}  // namespace kvpage::internal

#endif  // KVPAGE_BLOCK_PREFIX_INDEX_H_
