// The MemoryLayout a KvCacheManager hands its backing (internal).
#ifndef KVPAGE_BLOCK_MEMORY_DESCRIPTION_H_
#define KVPAGE_BLOCK_MEMORY_DESCRIPTION_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "block/block_pool.h"
#include "block/group_manager.h"
#include "kvpage/kv_cache_manager.h"
#include "kvpage/memory_layout.h"
#include "kvpage/model_spec.h"

namespace kvpage::internal {

// The pools and, in kvpage mode (one group per ModelSpec group, in order), every layer's
// tensors. The tensors of a pool add up to its block bytes.
absl::StatusOr<MemoryLayout> DescribeMemory(const ModelSpec& model, const KvCacheConfig& config,
                                            DType kv_dtype,
                                            const std::vector<GroupLayout>& groups,
                                            const std::vector<std::unique_ptr<BlockPool>>& pools);

}  // namespace kvpage::internal

#endif  // KVPAGE_BLOCK_MEMORY_DESCRIPTION_H_
