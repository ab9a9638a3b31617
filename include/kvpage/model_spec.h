// What a model's layers store per token and per request, read from a Hugging Face config.json.
//
// A `ModelSpec` lists every decoder layer with its `LayerSpec` — the kind of context store it
// needs and that store's shape — and partitions the layers into `LayerGroup`s of identical
// specs. Everything downstream (planner, pools, scheduler, kernels) works per group: a group
// is the unit that shares one block table per request.
//
// Layer kinds:
//   * kFullAttention   K and V for every token (MHA or GQA).
//   * kSlidingWindow   K and V, but a token only attends to the last `sliding_window` tokens.
//   * kChunkedLocal    K and V, but a token at position p only attends to its own chunk
//                      [⌊p/C⌋·C, p], C = `attention_chunk_size` (Llama 4's RoPE layers).
//   * kMla             one compressed latent per token (DeepSeek MLA: kv_lora_rank +
//                      qk_rope_head_dim values), stored as "K only": head_dim_v == 0.
//                      DeepSeek-V3.2's sparse attention adds a second per-token tensor
//                      beside it: the lightning indexer's key (AttentionShape::index_head_dim).
//   * kLinearAttention a fixed per-request state (Gated DeltaNet, Mamba-2): a causal-conv
//                      state of (kernel − 1) × (2·n_k·d_k + n_v·d_v) values and a recurrent
//                      state of n_v × d_k × d_v values, each in its own dtype.
//
// ModelSpec is a plain value type; it is immutable once loaded and safe to share across
// threads.
#ifndef KVPAGE_MODEL_SPEC_H_
#define KVPAGE_MODEL_SPEC_H_

#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/statusor.h"
#include "kvpage/dtype.h"

namespace kvpage {

enum class LayerKind : uint8_t {
  kFullAttention,
  kSlidingWindow,
  kMla,
  kLinearAttention,
  kChunkedLocal,
};

// "full_attention", "sliding_window", "mla", "linear_attention", "chunked_local" (the
// planner's JSON names).
absl::string_view LayerKindName(LayerKind kind);

// Shape of the per-token cache of an attention layer (full, sliding, chunked-local or MLA).
struct AttentionShape {
  int32_t num_kv_heads = 0;  // 1 for MLA.
  int32_t head_dim_k = 0;    // MLA: kv_lora_rank + qk_rope_head_dim.
  int32_t head_dim_v = 0;    // MLA: 0 (the latent serves as K and V).
  // DeepSeek-V3.2 sparse attention (MLA only): the lightning indexer's key, one head of
  // index_head_dim values per token, cached beside the latent. 0 without an indexer.
  int32_t index_head_dim = 0;

  int64_t KValuesPerToken() const { return int64_t{num_kv_heads} * head_dim_k; }
  int64_t VValuesPerToken() const { return int64_t{num_kv_heads} * head_dim_v; }
  bool HasIndexer() const { return index_head_dim > 0; }
  friend bool operator==(const AttentionShape&, const AttentionShape&) = default;
};

// Shape of the fixed per-request state of a linear-attention layer (Gated DeltaNet).
struct LinearStateShape {
  int32_t conv_kernel = 0;   // linear_conv_kernel_dim
  int32_t num_k_heads = 0;   // linear_num_key_heads
  int32_t k_head_dim = 0;    // linear_key_head_dim
  int32_t num_v_heads = 0;   // linear_num_value_heads
  int32_t v_head_dim = 0;    // linear_value_head_dim
  DType conv_dtype = DType::kBF16;       // the model dtype
  DType recurrent_dtype = DType::kBF16;  // mamba_ssm_dtype, else the model dtype

  // (kernel − 1) × (2·n_k·d_k + n_v·d_v): the last kernel−1 inputs of q, k and v.
  int64_t ConvValues() const {
    return int64_t{conv_kernel - 1} *
           (2 * int64_t{num_k_heads} * k_head_dim + int64_t{num_v_heads} * v_head_dim);
  }
  // n_v × d_k × d_v: one d_k × d_v matrix per value head.
  int64_t RecurrentValues() const {
    return int64_t{num_v_heads} * k_head_dim * v_head_dim;
  }
  // Bytes of one layer's state in its native dtypes (conv_dtype, recurrent_dtype).
  int64_t NativeBytes() const;
  friend bool operator==(const LinearStateShape&, const LinearStateShape&) = default;
};

struct LayerSpec {
  LayerKind kind = LayerKind::kFullAttention;
  AttentionShape attention;     // unused for kLinearAttention
  int32_t sliding_window = 0;   // > 0 iff kind == kSlidingWindow
  int32_t attention_chunk_size = 0;  // > 0 iff kind == kChunkedLocal
  LinearStateShape linear;      // used only for kLinearAttention

  bool IsAttention() const { return kind != LayerKind::kLinearAttention; }
  friend bool operator==(const LayerSpec&, const LayerSpec&) = default;
};

// Layers with identical LayerSpecs, in increasing layer order.
struct LayerGroup {
  LayerSpec spec;
  std::vector<int32_t> layers;

  int32_t num_layers() const { return static_cast<int32_t>(layers.size()); }
};

struct ModelSpec {
  std::string name;    // bundled name or file stem, e.g. "qwen3.5-9b"
  std::string source;  // where it was loaded from (path or "bundled:NAME"), for messages
  std::string model_type;  // config.json "model_type" (of text_config when nested)
  DType dtype = DType::kBF16;  // torch_dtype / dtype
  int64_t max_position_embeddings = 0;
  // RoPE scaling (config.json "rope_scaling", or "rope_parameters"): its type ("rope_type", or
  // the older "type"; empty when absent) and "factor" (1 when absent or null).
  std::string rope_type;
  double rope_factor = 1.0;
  int64_t model_max_length = 0;  // config.json "model_max_length"; 0 when absent
  int32_t hidden_size = 0;
  int32_t num_attention_heads = 0;  // query heads of the attention layers
  int64_t vocab_size = 0;
  int64_t num_params = 0;  // language model only (vision towers and MTP layers excluded)
  // Bytes of those parameters as published: model dtype, or the checkpoint's quantization
  // (fp8 linear weights for DeepSeek-V3, mxfp4 experts for gpt-oss).
  int64_t weight_bytes = 0;
  int64_t num_embedding_params = 0;  // input embeddings plus LM head (counted once if tied)
  // Mixture of experts; all zero for dense models. Each token runs `experts_per_token` of the
  // `num_experts` routed experts of an MoE layer; `routed_expert_params` counts the weight
  // matrices of all routed experts (a subset of num_params), `routed_expert_weight_bytes`
  // their share of weight_bytes.
  int32_t num_experts = 0;
  int32_t experts_per_token = 0;
  int64_t routed_expert_params = 0;
  int64_t routed_expert_weight_bytes = 0;
  // MLP widths (config.json intermediate_size; moe_intermediate_size, else intermediate_size,
  // for MoE models); 0 when absent. Only the vllm policy's activation estimate reads them.
  int64_t intermediate_size = 0;
  int64_t moe_intermediate_size = 0;
  // DeepSeek-V3.2 sparse attention: the lightning indexer's query heads and the tokens each
  // query attends to (config.json index_n_heads, index_topk); 0 without an indexer. The key's
  // size is in AttentionShape::index_head_dim.
  int32_t index_n_heads = 0;
  int32_t index_topk = 0;

  // One per decoder layer that holds a cache, index = layer id. Equal to the decoder layers
  // except in Nemotron-H, whose MLP-only blocks hold none and are left out.
  std::vector<LayerSpec> layers;
  std::vector<LayerGroup> groups;  // partition of `layers`, ordered by first layer

  int32_t num_layers() const { return static_cast<int32_t>(layers.size()); }
  int32_t NumLayersOfKind(LayerKind kind) const;
  bool HasKind(LayerKind kind) const { return NumLayersOfKind(kind) > 0; }
  int64_t WeightBytes() const { return weight_bytes; }
  // Parameters one token is multiplied through: num_params minus the routed experts it skips.
  int64_t NumActiveParams() const {
    if (num_experts <= 0) return num_params;
    return num_params - routed_expert_params / num_experts * (num_experts - experts_per_token);
  }
};

// Parses config.json text. `name` names the model; `source` is used in error messages
// (usually the file path). Returns InvalidArgument naming the field and `source` when the
// text is not JSON, a required field is missing or has the wrong type, a size is not
// positive, or a layer kind is unknown.
absl::StatusOr<ModelSpec> ParseModelSpec(absl::string_view json_text, absl::string_view name,
                                         absl::string_view source);

// Reads and parses a config.json file. NotFound if it cannot be read.
absl::StatusOr<ModelSpec> LoadModelSpecFromFile(const std::string& path);

// Groups layers with identical specs (exposed for tests; ParseModelSpec already calls it).
std::vector<LayerGroup> GroupLayers(const std::vector<LayerSpec>& layers);

}  // namespace kvpage

#endif  // KVPAGE_MODEL_SPEC_H_
