// Describing a manager's pools and per-layer tensors to its memory backing.
#include "block/memory_description.h"

#include "absl/strings/str_cat.h"
#include "block/group_factory.h"
#include "internal/status_macros.h"
#include "model/kv_sizing.h"

namespace kvpage::internal {

absl::StatusOr<MemoryLayout> DescribeMemory(const ModelSpec& model, const KvCacheConfig& config,
                                            DType kv_dtype,
                                            const std::vector<GroupLayout>& groups,
                                            const std::vector<std::unique_ptr<BlockPool>>& pools) {
  MemoryLayout layout;
  layout.budget_bytes = config.kv_budget_bytes;
  for (const auto& pool : pools) {
    layout.pools.push_back(PoolLayout{.block_bytes = pool->block_bytes(),
                                      .blocks_per_chunk = pool->blocks_per_chunk(),
                                      .max_chunks = pool->capacity() / pool->blocks_per_chunk()});
  }
  if (config.mode != AccountingMode::kKvpage) return layout;
  for (size_t i = 0; i < groups.size(); ++i) {
    const LayerGroup& group = model.groups[i];
    KVPAGE_ASSIGN_OR_RETURN(const std::vector<CacheTensor> tensors,
                            LayerTensors(group.spec, groups[i].block_size, kv_dtype));
    for (int32_t layer : group.layers) {
      for (CacheTensor t : tensors) {
        t.group = groups[i].id;
        t.pool = groups[i].pool;
        t.layer = layer;
        layout.tensors.push_back(t);
      }
    }
  }
  std::vector<int64_t> pool_bytes(pools.size(), 0);
  for (const CacheTensor& t : layout.tensors) pool_bytes[t.pool] += t.block_bytes;
  for (size_t p = 0; p < pools.size(); ++p) {
    if (pool_bytes[p] != layout.pools[p].block_bytes) {
      return absl::InternalError(absl::StrCat("pool ", p, " has blocks of ",
                                              layout.pools[p].block_bytes,
                                              " bytes but its tensors add up to ", pool_bytes[p]));
    }
  }
  return layout;
}

}  // namespace kvpage::internal
