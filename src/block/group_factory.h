// The one place that maps a layer kind to what the block manager builds for it (internal):
// its group manager, its block size and its cache tensors. A new kind adds its lines here
// (group_factory.cc) and its GroupManager subclass; nothing else in the manager names kinds.
#ifndef KVPAGE_BLOCK_GROUP_FACTORY_H_
#define KVPAGE_BLOCK_GROUP_FACTORY_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "block/group_manager.h"
#include "kvpage/memory_layout.h"
#include "kvpage/model_spec.h"

namespace kvpage::internal {

// The group manager for a layer group of `layout.kind`.
std::unique_ptr<GroupManager> MakeGroupManager(const GroupLayout& layout, BlockPool* pool,
                                               const GroupContext* context);

// Tokens per block of a group of `spec`'s kind under the manager's `block_size`; 0 for a kind
// that holds one state slot per request instead of blocks of tokens.
int32_t GroupBlockSize(const LayerSpec& spec, int32_t block_size);

// The tensors of one layer (block_size: tokens per attention block): the K/V or latent tensor
// of an attention layer, the conv (if any: none with conv_kernel 1) and recurrent state of a
// linear-attention layer. Their group,
// pool and layer are left for the caller.
absl::StatusOr<std::vector<CacheTensor>> LayerTensors(const LayerSpec& spec, int32_t block_size,
                                                      DType kv_dtype);

}  // namespace kvpage::internal

#endif  // KVPAGE_BLOCK_GROUP_FACTORY_H_
