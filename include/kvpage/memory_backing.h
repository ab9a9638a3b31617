// MemoryBacking: what puts memory behind a KvCacheManager's pages. A server passes one in
// KvCacheConfig::backing (HostMemoryBacking, CudaVmmBacking, or its own), and one for the host
// cache in HostCacheConfig::backing, or none (NoopMemoryBacking behaves the same).
//
// The manager draws every pool's pages from one byte budget (KvCacheConfig::kv_budget_bytes)
// in chunks, a fixed number of a pool's pages at a time, and gives a chunk back when every
// page in it is free, so memory is never stranded in one pool while another runs dry. On the
// CPU the budget is exact accounting and the backing does nothing; on a GPU the backing
// reserves one virtual range per layer at start-up (sized for the whole budget) and maps
// physical memory behind a chunk's pages when the chunk is taken (CUDA virtual memory:
// cuMemCreate / cuMemMap), unmapping it when the chunk goes back. A backing must not fail for
// chunks within the budget: the manager's capacity checks rely on it.
//
// The budget is charged what the backing maps: a chunk costs every unit (map_unit_bytes) its
// slices can touch, and the null blocks' units are fixed bytes taken at creation, so a
// backing's mapped bytes never exceed kv_budget_bytes.
//
// Ownership and thread-safety: the server owns the backing, which must outlive the manager.
// The manager calls it only from its own methods, so a backing used by one manager needs no
// locking.
#ifndef KVPAGE_MEMORY_BACKING_H_
#define KVPAGE_MEMORY_BACKING_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kvpage/memory_layout.h"

namespace kvpage {

class MemoryBacking {
 public:
  virtual ~MemoryBacking() = default;
  // Called once by KvCacheManager::Create, before any chunk is mapped: reserve what `layout`
  // needs (address space, not memory). Its error fails Create. The default keeps nothing.
  virtual absl::Status Reserve(const MemoryLayout& /*layout*/) { return absl::OkStatus(); }
  // Makes the pages of chunk `chunk` of pool `pool` usable. Called before any of its blocks is
  // handed out.
  virtual absl::Status MapChunk(int32_t pool, int32_t chunk) = 0;
  // Releases the memory behind the chunk. None of its blocks is referenced any more.
  virtual absl::Status UnmapChunk(int32_t pool, int32_t chunk) = 0;
  // The bytes the backing maps memory in (a host page, a CUDA allocation granule), a power of
  // two in [1, 2^30] (KvCacheManager::Create refuses others with InvalidArgument): a chunk's
  // slice of each tensor is mapped in whole units, and each tensor's null block takes whole
  // units of its own. The manager sizes chunks to whole units where it can and
  // charges the budget for every unit a chunk can map, so that what the backing maps never
  // exceeds kv_budget_bytes. 1 = exact bytes.
  virtual int64_t map_unit_bytes() const { return 1; }
};

// The CPU backing: accounting only.
class NoopMemoryBacking final : public MemoryBacking {
 public:
  absl::Status MapChunk(int32_t, int32_t) override { return absl::OkStatus(); }
  absl::Status UnmapChunk(int32_t, int32_t) override { return absl::OkStatus(); }
};

}  // namespace kvpage

#endif  // KVPAGE_MEMORY_BACKING_H_
