// HostTier: the host-memory copy of one block pool's prefix cache (internal).
//
// A second cache level behind a BlockPool, keyed like it by (block hash, group): slots of the
// pool's block size in host memory, with their own LRU and a share of the host byte budget.
// The tier never touches data: it decides which device block is copied into which host slot
// (a save) and back (a load), and a server copies them (KvCacheManager::TakeTransfers).
//
// A slot is free, saving (its copy is in flight: neither loadable nor evictable), or ready
// (loadable; evictable while no load reads it). A key has at most one slot: a block is saved
// once per hash. Slots are ids 1..capacity() (0 = none), laid out in chunks of the pool's
// blocks per chunk, so a host MemoryBacking views them with the device pool's tensor layout;
// a chunk is mapped the first time one of its slots is needed.
//
// Not thread-safe; owned by the block manager, next to the pool it backs.
#ifndef KVPAGE_BLOCK_HOST_TIER_H_
#define KVPAGE_BLOCK_HOST_TIER_H_

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kvpage/kv_cache_manager.h"
#include "kvpage/kv_events.h"
#include "kvpage/memory_backing.h"
#include "kvpage/types.h"

namespace kvpage::internal {

// A save the pool asked for and the manager has not handed to the server yet.
struct PendingSave {
  int32_t device = 0;  // block id in the device pool
  int32_t host = 0;    // slot in the tier
  int32_t group = 0;
  bool pinned = false;  // the device block holds a reference for the save (write-through)
};

struct HostTierConfig {
  int32_t pool_index = 0;
  int64_t slot_bytes = 0;        // the pool's block bytes
  int32_t slots_per_chunk = 1;   // the pool's blocks per chunk
  int32_t max_chunks = 0;        // capacity() = max_chunks · slots_per_chunk
  HostTierPolicy policy = HostTierPolicy::kWriteThrough;
};

class HostTier {
 public:
  // `backing` (may be null: accounting only) and `events` must outlive the tier.
  HostTier(const HostTierConfig& config, MemoryBacking* backing, KvEventLog* events);

  int32_t capacity() const { return config_.max_chunks * config_.slots_per_chunk; }
  HostTierPolicy policy() const { return config_.policy; }
  int64_t slot_bytes() const { return config_.slot_bytes; }

  // The ready slot cached under the key, or 0 (none, or its save is still in flight).
  int32_t Find(BlockHash hash, int32_t group) const;
  // Whether the key has a slot in any state (a save of it would be a duplicate).
  bool Contains(BlockHash hash, int32_t group) const {
    return index_.contains(Key{hash, group});
  }

  // A device block under (hash, group) should be saved: reserves a slot for it (evicting the
  // least recently used ready slot that no load reads when the tier is full, mapping a chunk
  // when one is needed) and queues the save. No-op when the key has a slot already; dropped
  // when no slot can be had (every slot busy, or the backing refused: see backing_error).
  // Returns whether a save was queued.
  bool OfferSave(int32_t device, BlockHash hash, int32_t group, bool pinned);
  // Saves queued since the last call, oldest first.
  std::vector<PendingSave> TakeSaves();
  absl::Span<const PendingSave> queued() const { return queued_; }
  // Drops queued saves of device blocks in [first, last]: their chunk is unmapped before a
  // server could copy them (only unpinned saves can be: a pinned block keeps its chunk).
  void CancelSaves(int32_t first, int32_t last);
  // A save handed to the server has finished: the slot becomes ready (most recently used),
  // with a kStored event; or, when it failed, free again.
  void FinishSave(int32_t slot, bool ok);
  // A load reads the slot: it cannot be evicted until Unpin.
  void Pin(int32_t slot);
  void Unpin(int32_t slot);

  int32_t num_ready() const { return num_ready_; }
  int32_t num_saving() const { return num_saving_; }
  int32_t num_mapped_chunks() const { return num_mapped_chunks_; }
  int64_t mapped_bytes() const {
    return int64_t{num_mapped_chunks_} * config_.slots_per_chunk * config_.slot_bytes;
  }
  int64_t evictions() const { return evictions_; }
  // The first error the backing returned (a refused map), or OK.
  const absl::Status& backing_error() const { return backing_error_; }
  // Every slot is in exactly one state, the LRU holds the ready unpinned slots, the index
  // names each used slot once, counters add up.
  absl::Status CheckInvariants() const;

 private:
  enum class State : uint8_t { kFree, kSaving, kReady };
  struct Slot {
    BlockHash hash;
    int32_t group = -1;
    int32_t pins = 0;
    int32_t prev = -1, next = -1;  // LRU links (ready, unpinned slots)
    State state = State::kFree;
  };
  struct Key {
    BlockHash hash;
    int32_t group;
    bool operator==(const Key& o) const { return hash == o.hash && group == o.group; }
    template <typename H>
    friend H AbslHashValue(H h, const Key& k) {
      return H::combine(std::move(h), k.hash.lo, k.hash.hi, k.group);
    }
  };

  // A free slot, mapping the next chunk or evicting the LRU head if need be; 0 if none.
  int32_t TakeFreeSlot();
  bool MapChunk();
  void Evict(int32_t slot);
  void LruAppend(int32_t slot);
  void LruRemove(int32_t slot);
  void AddEvent(KvEvent::Type type, const Slot& s);

  const HostTierConfig config_;
  MemoryBacking* const backing_;
  KvEventLog* const events_;
  std::vector<Slot> slots_;           // index = slot id; [0] unused
  std::vector<int32_t> free_slots_;   // free slots of mapped chunks
  absl::flat_hash_map<Key, int32_t> index_;
  std::vector<PendingSave> queued_;
  int32_t lru_head_ = -1, lru_tail_ = -1;
  int32_t num_mapped_chunks_ = 0;
  int32_t num_ready_ = 0;
  int32_t num_saving_ = 0;
  int64_t evictions_ = 0;
  absl::Status backing_error_;
};

}  // namespace kvpage::internal

#endif  // KVPAGE_BLOCK_HOST_TIER_H_
