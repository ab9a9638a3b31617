#include "model/vllm_layout.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/ascii.h"
#include "absl/strings/strip.h"
#include "internal/status_macros.h"
#include "model/kv_sizing.h"

namespace kvpage {

absl::string_view VllmVersionName(VllmVersion version) {
  switch (version) {
    case VllmVersion::kV0_29: return "0.29";
    case VllmVersion::kV0_33: return "0.33";
  }
  return "unknown";
}

absl::StatusOr<VllmVersion> ParseVllmVersion(absl::string_view text) {
  absl::string_view t = text;
  absl::ConsumePrefix(&t, "v");
  const std::pair<absl::string_view, VllmVersion> known[] = {{"0.29", VllmVersion::kV0_29},
                                                             {"0.33", VllmVersion::kV0_33}};
  for (const auto& [name, version] : known) {
    absl::string_view patch = t;
    if (!absl::ConsumePrefix(&patch, name)) continue;
    // A patch level names the same rules: "0.33.0" is "0.33".
    if (patch.empty()) return version;
    if (absl::ConsumePrefix(&patch, ".") && !patch.empty() &&
        std::all_of(patch.begin(), patch.end(), absl::ascii_isdigit)) {
      return version;
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown vLLM version '", text, "' (expected 0.29 or 0.33)"));
}

absl::Status CheckVllmBlockSize(int64_t block_size) {
  // vLLM's CacheConfig.block_size is Literal[1, 8, 16, 32, 64, 128]; its engine refuses others.
  for (int64_t ok : {1, 8, 16, 32, 64, 128}) {
    if (block_size == ok) return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "block_size ", block_size, " is not one vLLM accepts (1, 8, 16, 32, 64 or 128)"));
}

absl::Status ValidateVllmVersion(VllmVersion version) {
  if (version == VllmVersion::kV0_29 || version == VllmVersion::kV0_33) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("vllm_version ", static_cast<int>(version), " is not a VllmVersion"));
}

}  // namespace kvpage

namespace kvpage::internal {

VllmRules RulesFor(VllmVersion version) {
  VllmRules rules;
  // kvpage's 0.29 emulation takes the two blocks of MambaSpec.max_memory_usage_bytes on the
  // first step; vLLM 0.33's MambaManager takes one (docs/capacity_planning.md §3.2).
  rules.extra_first_state_blocks = version == VllmVersion::kV0_29 ? 1 : 0;
  // vLLM 0.29 has the null block too; the 0.29 emulation keeps the block counts it has always
  // reproduced, so only the current release subtracts it.
  rules.null_block_in_pool = version != VllmVersion::kV0_29;
  rules.align_state_blocks = version != VllmVersion::kV0_29;
  return rules;
}

LayerSpec VllmManagedSpec(const ModelSpec& model, const LayerSpec& spec) {
  if (spec.kind != LayerKind::kChunkedLocal ||
      model.NumLayersOfKind(LayerKind::kChunkedLocal) == model.num_layers()) {
    return spec;
  }
  LayerSpec full = spec;
  full.kind = LayerKind::kFullAttention;
  full.attention_chunk_size = 0;
  return full;
}

absl::StatusOr<int64_t> VllmTokenBytes(const LayerSpec& spec, DType dtype) {
  const AttentionShape& a = spec.attention;
  if (!a.HasIndexer()) return AttentionTokenBytes(a, dtype);
  // Sparse MLA: the latent in kv_cache_dtype, where FlashMLASparse serves "fp8" as
  // "fp8_ds_mla" (_canonicalize_sparse_mla_kv_cache_dtype), 656 bytes a token
  // (MLAAttention.get_kv_cache_spec's state_content_bytes, vllm/model_executor/layers/
  // attention/mla_attention.py); beside it the indexer's own MLAAttentionSpec layer of 132
  // uint8 a token (DeepseekV32IndexerCache, vllm/model_executor/models/deepseek_v2.py).
  int64_t latent = kVllmFp8DsMlaTokenBytes;
  if (dtype != DType::kFP8) {
    KVPAGE_ASSIGN_OR_RETURN(latent, AttentionTokenBytes(a, dtype));
  }
  return latent + IndexKeyTokenBytes(a);
}

namespace {

// DeepSeek-V3.2's sparse MLA: without --block-size, vLLM takes the smallest block size every
// attention backend accepts (Platform.update_block_size_for_backend, vllm/platforms/
// interface.py): FlashMLASparse takes multiples of 64 and DeepseekV32IndexerBackend 64 only
// (vllm/v1/attention/backends/mla/flashmla_sparse.py, indexer.py), so 64.
constexpr int64_t kSparseMlaBlockSize = 64;

bool HasIndexer(const ModelSpec& model) {
  for (const LayerGroup& g : model.groups) {
    if (g.spec.IsAttention() && g.spec.attention.HasIndexer()) return true;
  }
  return false;
}

// Hybrid attention + linear attention: the attention block grows until its page holds a
// whole linear-attention state (Platform._align_hybrid_block_size, "align"/"none" modes).
absl::StatusOr<int64_t> AlignedBlockSize(const ModelSpec& model, int32_t requested_block_size,
                                         DType dtype) {
  int64_t block_size = HasIndexer(model) ? kSparseMlaBlockSize : requested_block_size;
  int64_t attn_token_bytes = 0, state_page = 0;
  bool mla = false;
  for (const LayerGroup& g : model.groups) {
    mla |= g.spec.kind == LayerKind::kMla;
    if (g.spec.kind == LayerKind::kLinearAttention) {
      state_page = std::max(state_page, g.spec.linear.NativeBytes());
    } else if (attn_token_bytes == 0) {
      KVPAGE_ASSIGN_OR_RETURN(attn_token_bytes, VllmTokenBytes(g.spec, dtype));
    }
  }
  if (state_page > 0 && attn_token_bytes > 0) {
    int64_t align = std::max<int64_t>(kKernelBlockAlignment, block_size);
    // MLA beside a recurrent state (Kimi Linear): blocks of a multiple of 128 tokens, for
    // the MLA decode kernels (vllm/platforms/interface.py:1081-1087).
    if (mla) align = std::max<int64_t>(align, 128);
    const int64_t attn_block = align * CeilDiv(state_page, align * attn_token_bytes);
    block_size = std::max(block_size, attn_block);
  }
  return block_size;
}

// Every layer has the same kind (and window, and chunk) as vLLM manages it: vLLM's uniform
// specs, one group.
bool ManagedAsOneKind(const ModelSpec& model, const VllmLayout& layout) {
  const LayerSpec first = VllmManagedSpec(model, layout.buckets[0].group->spec);
  for (const VllmBucket& b : layout.buckets) {
    const LayerSpec spec = VllmManagedSpec(model, b.group->spec);
    if (spec.kind != first.kind || spec.sliding_window != first.sliding_window ||
        spec.attention_chunk_size != first.attention_chunk_size || !spec.IsAttention()) {
      return false;
    }
  }
  return true;
}

}  // namespace

absl::StatusOr<VllmLayout> BuildVllmLayout(const ModelSpec& model, int32_t requested_block_size,
                                           DType dtype) {
  if (dtype == DType::kQ8_0) {
    return absl::InvalidArgumentError(
        "kv_cache_dtype q8_0 is a llama.cpp format; vllm supports auto, bf16, f16, f32, fp8");
  }
  VllmLayout layout;
  KVPAGE_ASSIGN_OR_RETURN(const int64_t block_size,
                          AlignedBlockSize(model, requested_block_size, dtype));

  int64_t max_page = 0;
  for (const LayerGroup& g : model.groups) {
    VllmBucket b{&g, 0, 0};
    if (g.spec.kind == LayerKind::kLinearAttention) {
      b.page_bytes = g.spec.linear.NativeBytes();
    } else {
      KVPAGE_ASSIGN_OR_RETURN(int64_t tok, VllmTokenBytes(g.spec, dtype));
      b.block_size = block_size;
      b.page_bytes = block_size * tok;
    }
    max_page = std::max(max_page, b.page_bytes);
    layout.buckets.push_back(b);
  }

  // One group when every layer has the same kind (and window, and chunk) as vLLM manages it:
  // vLLM's uniform specs.
  if (ManagedAsOneKind(model, layout)) {
    layout.uniform_single_group = true;
    for (const VllmBucket& b : layout.buckets) {
      layout.uniform_block_bytes += b.page_bytes * b.group->num_layers();
    }
    layout.group_size = model.num_layers();
    layout.page_bytes = layout.uniform_block_bytes / std::max(1, model.num_layers());
    return layout;
  }

  // unify_kv_cache_spec_page_size: smaller attention pages grow their block size by the page
  // ratio; linear-attention pages are padded.
  for (VllmBucket& b : layout.buckets) {
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
  for (const VllmBucket& b : layout.buckets) {
    min_layers = std::min<int64_t>(min_layers, b.group->num_layers());
    max_layers = std::max<int64_t>(max_layers, b.group->num_layers());
  }
  layout.group_size = (2 * max_layers < 3 * min_layers) ? max_layers : min_layers;
  return layout;
}

}  // namespace kvpage::internal
