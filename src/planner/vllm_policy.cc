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
#include "internal/status_macros.h"
#include "planner/policies.h"

namespace kvpage::internal {
namespace {

// FlashAttention's kernel block alignment in vLLM on Hopper/Ampere.
constexpr int64_t kKernelBlockAlignment = 16;

// Layers of one identical spec ("bucket" before grouping), with their unified page.
struct Bucket {
  const LayerGroup* group = nullptr;
  int64_t block_size = 0;  // tokens per block (attention only)
  int64_t page_bytes = 0;  // one layer, one block (after unification / padding)
};

struct VllmLayout {
  std::vector<Bucket> buckets;
  int64_t group_size = 0;
  int64_t page_bytes = 0;  // the common page every bucket was unified to
  bool uniform_single_group = false;
  int64_t uniform_block_bytes = 0;  // Σ pages when every layer is in one group
};

absl::StatusOr<VllmLayout> BuildLayout(const ModelSpec& model, const PlanOptions& options,
                                       DType dtype) {
  if (dtype == DType::kQ8_0) {
    return absl::InvalidArgumentError(
        "kv_cache_dtype q8_0 is a llama.cpp format; vllm supports auto, bf16, f16, f32, fp8");
  }
  VllmLayout layout;
  int64_t block_size = options.block_size;
  // Hybrid attention + linear attention: grow the attention block until its page holds a
  // whole linear-attention state (Platform._align_hybrid_block_size, "align"/"none" modes).
  int64_t attn_token_bytes = 0, state_page = 0;
  for (const LayerGroup& g : model.groups) {
    if (g.spec.kind == LayerKind::kLinearAttention) {
      state_page = std::max(state_page, g.spec.linear.NativeBytes());
    } else if (attn_token_bytes == 0) {
      KVPAGE_ASSIGN_OR_RETURN(attn_token_bytes, AttentionTokenBytes(g.spec.attention, dtype));
    }
  }
  if (state_page > 0 && attn_token_bytes > 0) {
    const int64_t align = std::max<int64_t>(kKernelBlockAlignment, block_size);
    const int64_t attn_block = align * CeilDiv(state_page, align * attn_token_bytes);
    block_size = std::max(block_size, attn_block);
  }

  int64_t max_page = 0;
  for (const LayerGroup& g : model.groups) {
    Bucket b{&g, 0, 0};
    if (g.spec.kind == LayerKind::kLinearAttention) {
      b.page_bytes = g.spec.linear.NativeBytes();
    } else {
      KVPAGE_ASSIGN_OR_RETURN(int64_t tok, AttentionTokenBytes(g.spec.attention, dtype));
      b.block_size = block_size;
      b.page_bytes = block_size * tok;
    }
    max_page = std::max(max_page, b.page_bytes);
    layout.buckets.push_back(b);
  }

  // One group when every layer has the same kind (and window): vLLM's uniform specs.
  bool same_kind = true;
  for (const Bucket& b : layout.buckets) {
    same_kind &= b.group->spec.kind == layout.buckets[0].group->spec.kind &&
                 b.group->spec.sliding_window == layout.buckets[0].group->spec.sliding_window &&
                 b.group->spec.IsAttention();
  }
  if (same_kind) {
    layout.uniform_single_group = true;
    for (const Bucket& b : layout.buckets) {
      layout.uniform_block_bytes += b.page_bytes * b.group->num_layers();
    }
    layout.group_size = model.num_layers();
    layout.page_bytes = layout.uniform_block_bytes / std::max(1, model.num_layers());
    return layout;
  }

  // unify_kv_cache_spec_page_size: smaller attention pages grow their block size by the page
  // ratio; linear-attention pages are padded.
  for (Bucket& b : layout.buckets) {
    if (b.page_bytes == max_page) continue;
    if (b.group->spec.kind == LayerKind::kLinearAttention) {
      b.page_bytes = max_page;
    } else if (max_page % b.page_bytes == 0) {
      b.block_size *= max_page / b.page_bytes;
      b.page_bytes = max_page;
    } else {
      return absl::UnimplementedError(absl::StrCat(
          "vllm cannot unify a ", b.page_bytes, "-byte attention page with the ", max_page,
          "-byte page of another layer group (vLLM raises NotImplementedError here)"));
    }
  }
  layout.page_bytes = max_page;

  // _get_kv_cache_groups_uniform_page_size: group size = smallest bucket, unless the largest
  // bucket is under 1.5× the smallest, in which case the largest (fewer padding layers).
  int64_t min_layers = model.num_layers(), max_layers = 0;
  for (const Bucket& b : layout.buckets) {
    min_layers = std::min<int64_t>(min_layers, b.group->num_layers());
    max_layers = std::max<int64_t>(max_layers, b.group->num_layers());
  }
  layout.group_size = (2 * max_layers < 3 * min_layers) ? max_layers : min_layers;
  return layout;
}

int64_t BlocksPerRequest(const LayerSpec& spec, const Bucket& b, const PlanOptions& options,
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
    case LayerKind::kLinearAttention:
      // "align" mode keeps the running state and the one being copied forward.
      return options.enable_prefix_caching ? 2 : 1;
  }
  return 0;
}

}  // namespace

absl::StatusOr<PlanRow> PlanVllmRow(const ModelSpec& model, const PlanOptions& options,
                                    int64_t context, std::optional<int64_t> budget) {
  KVPAGE_ASSIGN_OR_RETURN(VllmLayout layout,
                          BuildLayout(model, options, options.ResolvedKvDtype(model.dtype)));
  PlanRow row;
  row.context = context;
  int64_t blocks_per_request = 0;
  int64_t block_id_bytes = 0;  // what one block id costs across the shared tensors
  if (layout.uniform_single_group) {
    const Bucket& b = layout.buckets[0];
    GroupReservation g;
    g.kind = b.group->spec.kind;
    g.num_layers = model.num_layers();
    g.block_size = static_cast<int32_t>(b.block_size);
    g.blocks = BlocksPerRequest(b.group->spec, b, options, context);
    g.reserved_bytes = g.blocks * layout.uniform_block_bytes;
    blocks_per_request = g.blocks;
    block_id_bytes = layout.uniform_block_bytes;
    row.reserved_bytes = g.reserved_bytes;
    row.groups.push_back(g);
  } else {
    block_id_bytes = layout.group_size * layout.page_bytes;
    for (const Bucket& b : layout.buckets) {
      const int64_t n = b.group->num_layers();
      const int64_t num_groups = CeilDiv(n, layout.group_size);
      const int64_t blocks = BlocksPerRequest(b.group->spec, b, options, context);
      for (int64_t i = 0; i < num_groups; ++i) {
        // Group i takes layers i, i + num_groups, … (strided), so the first n % num_groups
        // groups get one more layer.
        const int64_t real = n / num_groups + (i < n % num_groups ? 1 : 0);
        GroupReservation g;
        g.kind = b.group->spec.kind;
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
