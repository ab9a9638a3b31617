// Describing a manager's pools and per-layer tensors to its memory backing.
#include "block/memory_description.h"

#include "absl/strings/str_cat.h"
#include "internal/status_macros.h"
#include "model/kv_sizing.h"

namespace kvpage {

namespace internal {
namespace {

// The tensors of one layer of a kvpage-mode group.
absl::Status AddLayerTensors(const LayerSpec& spec, const GroupLayout& g, int32_t layer,
                             DType kv_dtype, std::vector<CacheTensor>* out) {
  CacheTensor t;
  t.group = g.id;
  t.pool = g.pool;
  t.layer = layer;
  if (spec.IsAttention()) {
    KVPAGE_ASSIGN_OR_RETURN(int64_t token_bytes,
                            AttentionTokenBytes(spec.attention, kv_dtype));
    t.kind = spec.kind == LayerKind::kMla ? CacheTensorKind::kMlaLatent : CacheTensorKind::kKv;
    t.dtype = kv_dtype;
    t.block_size = g.block_size;
    t.block_bytes = token_bytes * g.block_size;
    t.attention = spec.attention;
    out->push_back(t);
    return absl::OkStatus();
  }
  t.linear = spec.linear;
  t.kind = CacheTensorKind::kConvState;
  t.dtype = spec.linear.conv_dtype;
  t.block_bytes = spec.linear.ConvValues() * BytesPerValue(spec.linear.conv_dtype);
  out->push_back(t);
  t.kind = CacheTensorKind::kRecurrentState;
  t.dtype = spec.linear.recurrent_dtype;
  t.block_bytes = spec.linear.RecurrentValues() * BytesPerValue(spec.linear.recurrent_dtype);
  out->push_back(t);
  return absl::OkStatus();
}

}  // namespace

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
  std::vector<int64_t> pool_bytes(pools.size(), 0);
  for (size_t i = 0; i < groups.size(); ++i) {
    const LayerGroup& group = model.groups[i];
    for (int32_t layer : group.layers) {
      KVPAGE_RETURN_IF_ERROR(
          AddLayerTensors(group.spec, groups[i], layer, kv_dtype, &layout.tensors));
    }
  }
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

}  // namespace internal
}  // namespace kvpage
