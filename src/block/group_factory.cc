// What the block manager builds for each layer kind (group_factory.h).
#include "block/group_factory.h"

#include "block/attention_group.h"
#include "block/chunked_local_group.h"
#include "block/recurrent_group.h"
#include "block/sliding_window_group.h"
#include "internal/status_macros.h"
#include "model/kv_sizing.h"

namespace kvpage::internal {

std::unique_ptr<GroupManager> MakeGroupManager(const GroupLayout& layout, BlockPool* pool,
                                               const GroupContext* context) {
  switch (layout.kind) {
    case LayerKind::kFullAttention:
    case LayerKind::kMla:
      return std::make_unique<FullAttentionGroup>(layout, pool, context);
    case LayerKind::kSlidingWindow:
      return std::make_unique<SlidingWindowGroup>(layout, pool, context);
    case LayerKind::kChunkedLocal:
      return std::make_unique<ChunkedLocalGroup>(layout, pool, context);
    case LayerKind::kLinearAttention:
      return std::make_unique<RecurrentGroup>(layout, pool, context);
  }
  return nullptr;
}

int32_t GroupBlockSize(const LayerSpec& spec, int32_t block_size) {
  return spec.IsAttention() ? block_size : 0;
}

absl::StatusOr<std::vector<CacheTensor>> LayerTensors(const LayerSpec& spec, int32_t block_size,
                                                      DType kv_dtype) {
  if (spec.IsAttention()) {
    KVPAGE_ASSIGN_OR_RETURN(int64_t token_bytes, AttentionTokenBytes(spec.attention, kv_dtype));
    std::vector<CacheTensor> tensors{CacheTensor{
        .kind = spec.kind == LayerKind::kMla ? CacheTensorKind::kMlaLatent : CacheTensorKind::kKv,
        .dtype = kv_dtype,
        .block_bytes = token_bytes * block_size,
        .block_size = block_size,
        .attention = spec.attention}};
    if (spec.attention.HasIndexer()) {  // DeepSeek-V3.2: the indexer keys, same block table
      tensors.push_back(CacheTensor{.kind = CacheTensorKind::kIndexKey,
                                    .dtype = DType::kFP8,
                                    .block_bytes = IndexKeyTokenBytes(spec.attention) * block_size,
                                    .block_size = block_size,
                                    .attention = spec.attention});
    }
    return tensors;
  }
  const LinearStateShape& s = spec.linear;
  const int64_t conv_bytes = s.ConvValues() * BytesPerValue(s.conv_dtype);
  const int64_t recurrent_bytes = s.RecurrentValues() * BytesPerValue(s.recurrent_dtype);
  std::vector<CacheTensor> tensors;
  if (conv_bytes > 0) {  // MiniMax's lightning attention keeps no conv state
    tensors.push_back(CacheTensor{.kind = CacheTensorKind::kConvState, .dtype = s.conv_dtype,
                                  .block_bytes = conv_bytes, .linear = s});
  }
  tensors.push_back(CacheTensor{.kind = CacheTensorKind::kRecurrentState,
                                .dtype = s.recurrent_dtype, .block_bytes = recurrent_bytes,
                                .linear = s});
  return tensors;
}

}  // namespace kvpage::internal
