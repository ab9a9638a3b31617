// vLLM 0.29's KV cache layout for a model: hybrid block alignment, page unification and
// equal-size grouping (internal; used by the vllm planner policy and the vllm accounting mode
// of the block manager). Sources: vllm.md §1.4–1.6.
#ifndef KVPAGE_MODEL_VLLM_LAYOUT_H_
#define KVPAGE_MODEL_VLLM_LAYOUT_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "kvpage/dtype.h"
#include "kvpage/model_spec.h"
#include "kvpage/vllm_version.h"

namespace kvpage::internal {

// FlashAttention's kernel block alignment in vLLM on Hopper/Ampere.
inline constexpr int64_t kKernelBlockAlignment = 16;

// The rules in which the emulated vLLM releases differ, as parameters of the layout and of
// the group managers (docs/capacity_planning.md §3.2 gives each one's vLLM source).
struct VllmRules {
  // State blocks a linear-attention group takes, beyond the one its first step writes, on a
  // request's first allocation with prefix caching ("align" mode).
  int32_t extra_first_state_blocks = 0;
  // Block 0 of vLLM's pool is its null block, so num_gpu_blocks ids leave one fewer usable.
  bool null_block_in_pool = true;
  // vLLM's "align" Mamba bookkeeping (MambaManager): a step that enters a new block writes a
  // new state block, the state at every block boundary is cached, and the block a step
  // replaced is freed when the request is next allocated.
  bool align_state_blocks = true;
};

VllmRules RulesFor(VllmVersion version);

// vLLM's fp8_ds_mla latent (DeepSeek-V3.2 with an fp8 cache): 512 fp8 values, 4 fp32 scales
// and 64 bf16 rope values, 656 bytes a token whatever the model's shape.
inline constexpr int64_t kVllmFp8DsMlaTokenBytes = 656;

// Bytes vLLM's cache spends on one token of one attention layer: K + V (MLA: the latent); with
// DeepSeek-V3.2's indexer, the latent as vLLM's sparse MLA stores it plus the indexer key (the
// indexer is a layer of its own in vLLM, of the same type and block size, so it joins the MLA
// layers' one group: UniformTypeKVCacheSpecs, vllm/v1/core/kv_cache_planning.py
// get_kv_cache_groups). InvalidArgument as AttentionTokenBytes.
absl::StatusOr<int64_t> VllmTokenBytes(const LayerSpec& spec, DType dtype);

// The spec vLLM 0.33 manages a layer's cache by: chunked-local layers beside layers of another
// kind become full attention (VllmConfig turns the hybrid manager off for a model with an
// attention_chunk_size, and unify_hybrid_kv_cache_specs promotes them); `spec` otherwise.
LayerSpec VllmManagedSpec(const ModelSpec& model, const LayerSpec& spec);

// Layers of one identical spec ("bucket" before grouping), with their unified page.
struct VllmBucket {
  const LayerGroup* group = nullptr;
  int64_t block_size = 0;  // tokens per block (attention only)
  int64_t page_bytes = 0;  // one layer, one block (after unification / padding)
};

struct VllmLayout {
  std::vector<VllmBucket> buckets;
  int64_t group_size = 0;
  int64_t page_bytes = 0;  // the common page every bucket was unified to
  bool uniform_single_group = false;
  int64_t uniform_block_bytes = 0;  // Σ pages when every layer is in one group
};

// InvalidArgument for q8_0; Unimplemented when pages cannot be unified (as vLLM).
absl::StatusOr<VllmLayout> BuildVllmLayout(const ModelSpec& model, int32_t requested_block_size,
                                           DType dtype);

}  // namespace kvpage::internal

#endif  // KVPAGE_MODEL_VLLM_LAYOUT_H_
