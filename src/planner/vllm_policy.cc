// What vLLM 0.29's hybrid KV cache manager reserves for one max-length request.
//
// Mirrors the steps of vllm/v1/core/kv_cache_utils.py and Platform._align_hybrid_block_size
// as described in the reference notes (vllm.md §1.3–1.8): hybrid block-size alignment,
// page-size unification, equal-size grouping with padding layers, per-group block counts, and
// num_blocks = budget // (group_size × page).

#include <algorithm>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "internal/status_macros.h"
#include "model/vllm_layout.h"
#include "planner/policies.h"

namespace kvpage::internal {
namespace {

int64_t BlocksPerRequest(const LayerSpec& spec, const VllmBucket& b, const PlanOptions& options,
                         int64_t context) {
  switch (spec.kind) {
    case LayerKind::kFullAttention:
    case LayerKind::kMla:
      return CeilDiv(context, b.block_size);
    case LayerKind::kSlidingWindow: {
      const int64_t in_flight =
          int64_t{options.max_num_batched_tokens} * (options.async_scheduling ? 2 : 1);
      return CeilDiv(std::min(spec.sliding_window - 1 + in_flight, context), b.block_size) + 1;
    }
    case LayerKind::kChunkedLocal: {
      // Only where every layer is chunked-local: vLLM 0.33 otherwise turns the hybrid manager
      // off and promotes these layers to full attention (VllmManagedSpec). Then
      // ChunkedLocalAttentionSpec.max_admission_blocks_per_request: cdiv(min(C + T, L), bs).
      const int64_t in_flight =
          int64_t{options.max_num_batched_tokens} * (options.async_scheduling ? 2 : 1);
      return CeilDiv(std::min(spec.attention_chunk_size + in_flight, context), b.block_size);
    }
    case LayerKind::kLinearAttention:
      // "align" mode keeps the running state and the one being copied forward.
      return options.enable_prefix_caching ? 2 : 1;
  }
  return 0;
}

// What one block id costs across the tensors the groups share.
int64_t BlockIdBytes(const VllmLayout& layout) {
  return layout.uniform_single_group ? layout.uniform_block_bytes
                                     : layout.group_size * layout.page_bytes;
}

}  // namespace

absl::StatusOr<int64_t> VllmBlockIdBytes(const ModelSpec& model, const PlanOptions& options) {
  KVPAGE_ASSIGN_OR_RETURN(
      const VllmLayout layout,
      BuildVllmLayout(model, options.block_size, options.ResolvedKvDtype(model.dtype)));
  return BlockIdBytes(layout);
}

absl::StatusOr<PlanRow> PlanVllmRow(const ModelSpec& model, const PlanOptions& options,
                                    int64_t context, std::optional<int64_t> budget) {
  KVPAGE_ASSIGN_OR_RETURN(VllmLayout layout,
                          BuildVllmLayout(model, options.block_size, options.ResolvedKvDtype(model.dtype)));
  PlanRow row;
  row.context = context;
  int64_t blocks_per_request = 0;
  int64_t block_id_bytes = 0;  // what one block id costs across the shared tensors
  if (layout.uniform_single_group) {
    const VllmBucket& b = layout.buckets[0];
    GroupReservation g;
    g.kind = VllmManagedSpec(model, b.group->spec).kind;
    g.num_layers = model.num_layers();
    g.block_size = static_cast<int32_t>(b.block_size);
    g.blocks = BlocksPerRequest(VllmManagedSpec(model, b.group->spec), b, options, context);
    g.reserved_bytes = g.blocks * layout.uniform_block_bytes;
    blocks_per_request = g.blocks;
    block_id_bytes = BlockIdBytes(layout);
    row.reserved_bytes = g.reserved_bytes;
    row.groups.push_back(g);
  } else {
    block_id_bytes = BlockIdBytes(layout);
    for (const VllmBucket& b : layout.buckets) {
      const int64_t n = b.group->num_layers();
      const int64_t num_groups = CeilDiv(n, layout.group_size);
      const int64_t blocks =
          BlocksPerRequest(VllmManagedSpec(model, b.group->spec), b, options, context);
      for (int64_t i = 0; i < num_groups; ++i) {
        // Group i takes layers i, i + num_groups, … (strided), so the first n % num_groups
        // groups get one more layer.
        const int64_t real = n / num_groups + (i < n % num_groups ? 1 : 0);
        GroupReservation g;
        g.kind = VllmManagedSpec(model, b.group->spec).kind;
        g.num_layers = static_cast<int32_t>(real);
        g.padding_layers = static_cast<int32_t>(layout.group_size - real);
        g.block_size = static_cast<int32_t>(b.block_size);
        g.blocks = blocks;
        g.reserved_bytes = blocks * block_id_bytes;
        blocks_per_request += blocks;
        row.reserved_bytes += g.reserved_bytes;
        if (g.kind == LayerKind::kLinearAttention) row.state_bytes += g.reserved_bytes;
        row.groups.push_back(g);
      }
    }
  }
  if (budget.has_value()) {
    const int64_t num_blocks = *budget / block_id_bytes;
    row.max_concurrency = num_blocks / blocks_per_request;
  }
  return row;
}

}  // namespace kvpage::internal

namespace kvpage {

int64_t VllmDerivedMaxModelLen(const ModelSpec& model) {
  static constexpr const char* kScaledAlready[] = {"su",   "longrope",     "llama3",
                                                   "yarn", "deepseek_yarn", "deepseek_llama_scaling"};
  bool scaled = model.model_type.find("gemma3") != std::string::npos;
  for (const char* t : kScaledAlready) scaled |= model.rope_type == t;
  const double factor = scaled ? 1.0 : model.rope_factor;
  return static_cast<int64_t>(static_cast<double>(model.max_position_embeddings) * factor);
}

}  // namespace kvpage
