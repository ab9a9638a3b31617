// MemoryBudget: the one byte budget every pool of a block manager draws its chunks from
// (internal; the backing it maps chunks with is kvpage/memory_backing.h).
//
// Pools take whole chunks (a fixed number of their pages) from the budget and give them back
// when every page in them is free, so memory is never stranded in one pool while another runs
// dry. The budget maps a chunk with the backing when it is taken and unmaps it when it goes
// back; without a backing it is exact accounting.
//
// The budget is charged what the backing maps: a chunk costs every unit (map_unit_bytes) its
// slices can touch, and the null blocks' units are fixed bytes taken at creation, so a
// backing's mapped bytes never exceed total_bytes().
//
// Not thread-safe; owned by one block manager.
#ifndef KVPAGE_BLOCK_MEMORY_BUDGET_H_
#define KVPAGE_BLOCK_MEMORY_BUDGET_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "kvpage/memory_backing.h"

namespace kvpage {

class MemoryBudget {
 public:
  // REQUIRES: total_bytes >= 0. `backing` may be null (no-op); it must outlive the budget.
  explicit MemoryBudget(int64_t total_bytes, MemoryBacking* backing = nullptr)
      : total_bytes_(total_bytes), backing_(backing) {}

  int64_t total_bytes() const { return total_bytes_; }
  // Free bytes a pool may not take just to keep cached blocks: below this, a pool that has
  // cached blocks evicts them rather than map a new chunk, so pools that must grow for live
  // requests still find memory. The block manager sets it to one chunk of every pool.
  int64_t headroom_bytes() const { return headroom_bytes_; }
  void set_headroom_bytes(int64_t bytes) { headroom_bytes_ = bytes; }
  int64_t used_bytes() const { return used_bytes_; }
  int64_t free_bytes() const { return total_bytes_ - fixed_bytes_ - used_bytes_; }
  // Bytes held for the manager's lifetime outside any chunk (the backing's null blocks), set
  // once before any chunk is taken. REQUIRES: 0 <= bytes <= total_bytes().
  int64_t fixed_bytes() const { return fixed_bytes_; }
  void set_fixed_bytes(int64_t bytes) { fixed_bytes_ = bytes; }

  // Takes `bytes` for chunk `chunk` of pool `pool` and maps it (a premapped chunk is only
  // charged). False (and nothing taken) when the budget lacks the bytes, not counting those
  // reserved by other premapped chunks, or the backing refuses.
  bool TakeChunk(int32_t pool, int32_t chunk, int64_t bytes);
  void GiveChunk(int32_t pool, int32_t chunk, int64_t bytes);

  // ---- Asking the backing before counting on a chunk --------------------------------------
  // Maps chunk `chunk` of pool `pool` now, before anything counts on it, and keeps `bytes` of
  // the free bytes for it: the next TakeChunk of that chunk only charges them. Premapped bytes
  // are not charged (used_bytes and free_bytes do not change), so decisions made on free
  // bytes are those made without premapping; other chunks' TakeChunk and Premap cannot take
  // them. ResourceExhausted when the free bytes not reserved lack `bytes`; the backing's error
  // when it refuses (also kept as backing_error()). REQUIRES: the chunk is neither taken nor
  // premapped.
  absl::Status Premap(int32_t pool, int32_t chunk, int64_t bytes);
  bool IsPremapped(int32_t pool, int32_t chunk) const;
  // Chunks of `pool` premapped and not taken since.
  int32_t num_premapped(int32_t pool) const;
  int64_t premapped_bytes() const { return premapped_bytes_; }
  // Unmaps every chunk premapped and not taken since (a step that did not need them, or one
  // refused after part of its chunks were premapped).
  void DropPremapped();

  // The most recent error the backing returned (a refused map, a failed unmap), or OK if it
  // never failed.
  const absl::Status& backing_error() const { return backing_error_; }

 private:
  static uint64_t Key(int32_t pool, int32_t chunk) {
    return (uint64_t{static_cast<uint32_t>(pool)} << 32) | static_cast<uint32_t>(chunk);
  }
  void RecordError(absl::Status status) { backing_error_ = std::move(status); }

  int64_t total_bytes_;
  int64_t used_bytes_ = 0;
  int64_t fixed_bytes_ = 0;
  int64_t headroom_bytes_ = 0;
  int64_t premapped_bytes_ = 0;
  MemoryBacking* backing_;
  absl::Status backing_error_;
  // Premapped chunks (Key) -> their bytes, and how many each pool has.
  absl::flat_hash_map<uint64_t, int64_t> premapped_;
  std::vector<int32_t> premapped_per_pool_;
};

}  // namespace kvpage

#endif  // KVPAGE_BLOCK_MEMORY_BUDGET_H_
