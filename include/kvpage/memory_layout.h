// MemoryLayout: what a memory backing must hold for one KvCacheManager, and the tensor views a
// server reads it through.
//
// The block manager describes its pools and every cache tensor of every layer once, when it
// is created (MemoryBacking::Reserve). A pool's chunk c holds block ids
// [1 + c·blocks_per_chunk, 1 + (c+1)·blocks_per_chunk); id 0 is the null block, which a
// backing keeps mapped for the manager's lifetime (padding entries of block tables point at
// it). Every tensor of a pool is indexed by the same block ids (a recurrent state tensor by
// the same ids, called slots): a tensor of `block_bytes` bytes per id places id b at byte
// b·block_bytes of its view, so mapping chunk c of a pool maps that slice of every tensor of
// the pool. A backing that maps in units (MemoryBacking::map_unit_bytes) starts each view so
// that block 1 lies on a unit boundary: the null block then has units of its own, and a chunk
// of a whole number of units per tensor shares none with its neighbours.
//
// Tensors per layer of a group:
//   kKv              attention K and V, blocks-first: [num_blocks][2][block_size][heads][head_dim]
//                    when K and V rows have the same size (K rows of a block, then its V rows)
//   kMlaLatent       MLA: [num_blocks][block_size][kv_lora_rank + rope_dim]
//   kConvState       linear attention: [num_slots][conv_kernel − 1][conv_channels]
//   kRecurrentState  linear attention: [num_slots][num_v_heads][k_head_dim][v_head_dim]
// Plain values; no invariants beyond those the manager guarantees when it builds them.
#ifndef KVPAGE_MEMORY_LAYOUT_H_
#define KVPAGE_MEMORY_LAYOUT_H_

#include <cstdint>
#include <vector>

#include "absl/strings/string_view.h"
#include "kvpage/dtype.h"
#include "kvpage/model_spec.h"
#include "kvpage/types.h"

namespace kvpage {

// kIndexKey: DeepSeek-V3.2's lightning-indexer keys beside an MLA latent, one row of fp8
// values per token then one fp32 scale per 128 values per token, within each block.
enum class CacheTensorKind : uint8_t { kKv, kMlaLatent, kConvState, kRecurrentState, kIndexKey };

// "kv", "mla_latent", "conv_state", "recurrent_state", "index_key".
inline absl::string_view CacheTensorKindName(CacheTensorKind kind) {
  switch (kind) {
    case CacheTensorKind::kKv: return "kv";
    case CacheTensorKind::kMlaLatent: return "mla_latent";
    case CacheTensorKind::kConvState: return "conv_state";
    case CacheTensorKind::kRecurrentState: return "recurrent_state";
    case CacheTensorKind::kIndexKey: return "index_key";
  }
  return "unknown";
}

// Which view of a layer's tensors a backing's View returns: K or V of attention, the MLA
// latent, a state tensor, or the indexer keys (as bytes: [blocks, block_bytes]).
enum class TensorPart : uint8_t { kKey, kValue, kLatent, kConvState, kRecurrentState, kIndexKey };

// The pages of one pool (BlockPool), as the backing maps them.
struct PoolLayout {
  int64_t block_bytes = 0;       // bytes of one block id across every tensor of the pool
  int32_t blocks_per_chunk = 0;  // ids per chunk
  int32_t max_chunks = 0;        // chunks the pool may ever map
  // Block ids 0..num_blocks − 1 (id 0 the null block).
  int64_t num_blocks() const { return 1 + int64_t{blocks_per_chunk} * max_chunks; }
  int64_t chunk_bytes() const { return int64_t{blocks_per_chunk} * block_bytes; }
};

// One cache tensor of one layer.
struct CacheTensor {
  GroupId group;
  int32_t pool = 0;           // index into MemoryLayout::pools
  int32_t layer = 0;          // decoder layer index (ModelSpec::layers)
  CacheTensorKind kind = CacheTensorKind::kKv;
  DType dtype = DType::kBF16;
  int64_t block_bytes = 0;    // bytes of one block id (one state slot) in this tensor
  int32_t block_size = 0;     // tokens per block (attention); 0 for state tensors
  AttentionShape attention;   // attention tensors
  LinearStateShape linear;    // state tensors
};

struct MemoryLayout {
  std::vector<PoolLayout> pools;
  // Every tensor, by group, then layer, then kind. Empty in vllm accounting mode, whose
  // shared block-id space is not laid out per layer.
  std::vector<CacheTensor> tensors;
  int64_t budget_bytes = 0;  // the manager's kv_budget_bytes
};

// A strided view of one tensor in the backing's memory, as a kernel reads it. Strides are in
// bytes (q8_0 has no whole bytes per value); divide by BytesPerValue(dtype) for element
// strides. Dimension 0 is always the block id (or state slot).
struct TensorView {
  void* base = nullptr;
  DType dtype = DType::kBF16;
  std::vector<int64_t> shape;
  std::vector<int64_t> byte_strides;
};

}  // namespace kvpage

#endif  // KVPAGE_MEMORY_LAYOUT_H_
