// HostMemoryBacking's state (internal): the reserved range of every tensor and which chunks
// of every pool are mapped.
#ifndef KVPAGE_MEMORY_HOST_BACKING_STATE_H_
#define KVPAGE_MEMORY_HOST_BACKING_STATE_H_

#include <cstdint>
#include <vector>

#include "kvpage/host_memory_backing.h"
#include "memory/virtual_range.h"

namespace kvpage {

struct HostMemoryBacking::State {
  int64_t unit_bytes = 0;  // as constructed: 0 = the page size
  int64_t unit = 0;        // bytes committed at a time, set at Reserve
  bool reserved = false;
  MemoryLayout layout;
  std::vector<internal::VirtualRange> ranges;      // one per layout.tensors entry
  std::vector<std::vector<int32_t>> pool_tensors;  // per pool, its tensors' indices
  std::vector<std::vector<bool>> mapped;           // per pool, per chunk
  int64_t mapped_bytes = 0;
  int64_t peak_mapped_bytes = 0;
  int64_t reserved_bytes = 0;
};

}  // namespace kvpage

#endif  // KVPAGE_MEMORY_HOST_BACKING_STATE_H_
