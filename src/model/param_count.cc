#include "model/param_count.h"

#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "internal/status_macros.h"

namespace kvpage::internal {
namespace {
template <typename T>
struct Counts {
  T total = 0;
  T routed_experts = 0;
  T embeddings = 0;
};


template <typename T>
struct Dims {
  T hidden = 0;
  T num_heads = 0;
  T head_dim = 0;
  T kv_heads = 0;
  std::string model_type;
};

bool StartsWith(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

// q, k, v, o projections of a GQA/MHA layer, with the optional biases and per-head norms.
template <typename T>
absl::StatusOr<T> AttentionParams(const ConfigReader& cfg, const Dims<T>& d) {
  const T q_out = d.num_heads * d.head_dim;
  const T kv_out = d.kv_heads * d.head_dim;
  // Qwen3-Next and Qwen3.5 gate the attention output: q_proj also emits the gate.
  const bool gated = StartsWith(d.model_type, "qwen3_next") || StartsWith(d.model_type, "qwen3_5");
  T n = d.hidden * q_out * (gated ? 2 : 1) + 2 * d.hidden * kv_out + q_out * d.hidden;
  KVPAGE_ASSIGN_OR_RETURN(bool bias, cfg.BoolOr("attention_bias", false));
  if (bias) n += q_out * (gated ? 2 : 1) + 2 * kv_out + d.hidden;
  if (StartsWith(d.model_type, "qwen3") || StartsWith(d.model_type, "gemma3")) {
    n += 2 * d.head_dim;  // q_norm and k_norm over head_dim
  }
  return n;
}

template <typename T>
absl::StatusOr<T> MlaParams(const ConfigReader& cfg, const Dims<T>& d) {
  KVPAGE_ASSIGN_OR_RETURN(T rank, cfg.PositiveInt("kv_lora_rank"));
  KVPAGE_ASSIGN_OR_RETURN(T rope, cfg.PositiveInt("qk_rope_head_dim"));
  KVPAGE_ASSIGN_OR_RETURN(T nope, cfg.PositiveInt("qk_nope_head_dim"));
  KVPAGE_ASSIGN_OR_RETURN(T v_dim, cfg.PositiveInt("v_head_dim"));
  KVPAGE_ASSIGN_OR_RETURN(std::optional<int64_t> q_rank, cfg.OptionalPositiveInt("q_lora_rank"));
  const T q_out = d.num_heads * (nope + rope);
  T n = q_rank.has_value() ? d.hidden * T(*q_rank) + T(*q_rank) + T(*q_rank) * q_out
                           : d.hidden * q_out;
  n += d.hidden * (rank + rope) + rank;      // kv_a_proj_with_mqa + kv_a_layernorm
  n += rank * d.num_heads * (nope + v_dim);  // kv_b_proj
  n += d.num_heads * v_dim * d.hidden;       // o_proj
  KVPAGE_ASSIGN_OR_RETURN(std::optional<int64_t> index_dim,
                          cfg.OptionalPositiveInt("index_head_dim"));
  if (index_dim.has_value()) {
    // DeepSeek-V3.2's lightning indexer: wq_b (from the query latent), wk, k_norm (weight and
    // bias) and weights_proj (one weight per indexer head).
    KVPAGE_ASSIGN_OR_RETURN(T heads, cfg.PositiveInt("index_n_heads"));
    const T q_in = q_rank.has_value() ? T(*q_rank) : d.hidden;
    n += q_in * heads * T(*index_dim) + d.hidden * T(*index_dim) + 2 * T(*index_dim) +
         d.hidden * heads;
  }
  return n;
}

template <typename T>
T GatedDeltaNetParams(const LinearStateShape& s, T hidden) {
  const T key_dim = T(s.num_k_heads) * s.k_head_dim;
  const T value_dim = T(s.num_v_heads) * s.v_head_dim;
  const T conv_channels = 2 * key_dim + value_dim;
  T n = hidden * (2 * key_dim + 2 * value_dim);  // in_proj_qkvz
  n += hidden * 2 * s.num_v_heads;                     // in_proj_ba
  n += conv_channels * s.conv_kernel;                  // depthwise conv1d
  n += 2 * s.num_v_heads + s.v_head_dim;               // dt_bias, A_log, gated norm
  n += value_dim * hidden;                             // out_proj
  return n;
}

// The feed-forward part of layer `layer`: dense SwiGLU or a mixture of experts. Adds the
// routed experts' weight matrices to *routed.
// Llama 4: every interleave_moe_layer_step-th layer is MoE (routed experts and a router, plus
// one shared expert, all intermediate_size wide); the others are dense, intermediate_size_mlp
// wide (transformers' Llama4TextConfig.moe_layers).
template <typename T>
absl::StatusOr<T> Llama4FeedForwardParams(const ConfigReader& cfg, const Dims<T>& d,
                                          int64_t layer, T* routed) {
  KVPAGE_ASSIGN_OR_RETURN(std::optional<int64_t> step,
                          cfg.OptionalPositiveInt("interleave_moe_layer_step"));
  if ((layer + 1) % step.value_or(1) != 0) {
    KVPAGE_ASSIGN_OR_RETURN(T dense, cfg.PositiveInt("intermediate_size_mlp"));
    return 3 * d.hidden * dense;
  }
  KVPAGE_ASSIGN_OR_RETURN(T experts, cfg.PositiveInt("num_local_experts"));
  KVPAGE_ASSIGN_OR_RETURN(T inter, cfg.PositiveInt("intermediate_size"));
  *routed += experts * 3 * d.hidden * inter;
  return (experts + 1) * 3 * d.hidden * inter + d.hidden * experts;
}

template <typename T>
absl::StatusOr<T> FeedForwardParams(const ConfigReader& cfg, const Dims<T>& d, int64_t layer,
                                    T* routed) {
  if (d.model_type == "llama4_text") return Llama4FeedForwardParams(cfg, d, layer, routed);
  std::optional<int64_t> experts;
  for (const char* field : {"n_routed_experts", "num_experts", "num_local_experts"}) {
    KVPAGE_ASSIGN_OR_RETURN(experts, cfg.OptionalPositiveInt(field));
    if (experts.has_value()) break;
  }
  KVPAGE_ASSIGN_OR_RETURN(int64_t first_dense, cfg.NonNegativeIntOr("first_k_dense_replace", 0));
  bool dense = !experts.has_value() || layer < first_dense;
  if (const nlohmann::json* only = cfg.Find("mlp_only_layers"); only && only->is_array()) {
    for (const auto& v : *only) dense |= v.is_number_integer() && v.get<int64_t>() == layer;
  }
  if (dense) {
    KVPAGE_ASSIGN_OR_RETURN(T inter, cfg.PositiveInt("intermediate_size"));
    return 3 * d.hidden * inter;
  }
  // gpt-oss names the per-expert width intermediate_size and adds biases to every projection.
  if (d.model_type == "gpt_oss") {
    KVPAGE_ASSIGN_OR_RETURN(T inter, cfg.PositiveInt("intermediate_size"));
    const T per_expert = 3 * d.hidden * inter + 2 * inter + d.hidden;
    *routed += T(*experts) * 3 * d.hidden * inter;
    return T(*experts) * per_expert + d.hidden * T(*experts) + T(*experts);
  }
  KVPAGE_ASSIGN_OR_RETURN(T moe_inter, cfg.PositiveInt("moe_intermediate_size"));
  T n = T(*experts) * 3 * d.hidden * moe_inter + d.hidden * T(*experts);  // experts + router
  *routed += T(*experts) * 3 * d.hidden * moe_inter;
  KVPAGE_ASSIGN_OR_RETURN(std::optional<int64_t> shared_inter,
                          cfg.OptionalPositiveInt("shared_expert_intermediate_size"));
  KVPAGE_ASSIGN_OR_RETURN(T n_shared, cfg.NonNegativeIntOr("n_shared_experts", 0));
  if (shared_inter.has_value()) n += 3 * d.hidden * T(*shared_inter) + d.hidden;  // + its gate
  n += n_shared * 3 * d.hidden * moe_inter;
  if (d.model_type == "deepseek_v3" || d.model_type == "deepseek_v32") {
    n += T(*experts);  // e_score_correction_bias
  }
  return n;
}


// Whether the LM head shares the embeddings when a config omits tie_word_embeddings: Hugging
// Face's PretrainedConfig ties them, but these families' transformers configs default to false.
bool TiedByDefault(absl::string_view model_type) {
  for (absl::string_view untied : {"llama", "llama4_text", "mistral", "mixtral", "qwen2",
                                   "qwen3", "qwen3_moe", "deepseek_v2", "deepseek_v3",
                                   "deepseek_v32", "gpt_oss"}) {
    if (model_type == untied) return false;
  }
  return true;
}

template <typename T>
absl::StatusOr<Counts<T>> Count(const ConfigReader& cfg, const ModelSpec& spec) {
  Dims<T> d;
  d.hidden = T(spec.hidden_size);
  KVPAGE_ASSIGN_OR_RETURN(int64_t heads, cfg.PositiveInt("num_attention_heads"));
  d.num_heads = T(heads);
  KVPAGE_ASSIGN_OR_RETURN(std::optional<int64_t> head_dim, cfg.OptionalPositiveInt("head_dim"));
  d.head_dim = T(head_dim.value_or(int64_t{spec.hidden_size} / heads));
  KVPAGE_ASSIGN_OR_RETURN(std::optional<int64_t> kv, cfg.OptionalPositiveInt("num_key_value_heads"));
  d.kv_heads = T(kv.value_or(heads));
  d.model_type = spec.model_type;

  KVPAGE_ASSIGN_OR_RETURN(bool tied,
                          cfg.BoolOr("tie_word_embeddings", TiedByDefault(spec.model_type)));
  Counts<T> counts;
  counts.embeddings = T(spec.vocab_size) * d.hidden * (tied ? 1 : 2);
  T total = counts.embeddings + d.hidden;  // + final norm

  for (int64_t i = 0; i < spec.num_layers(); ++i) {
    const LayerSpec& layer = spec.layers[i];
    T n = 2 * d.hidden;  // input and post-attention norms
    switch (layer.kind) {
      case LayerKind::kFullAttention:
      case LayerKind::kSlidingWindow:
      case LayerKind::kChunkedLocal: {
        KVPAGE_ASSIGN_OR_RETURN(T a, AttentionParams<T>(cfg, d));
        n += a;
        break;
      }
      case LayerKind::kMla: {
        KVPAGE_ASSIGN_OR_RETURN(T a, MlaParams<T>(cfg, d));
        n += a;
        break;
      }
      case LayerKind::kLinearAttention:
        n += GatedDeltaNetParams<T>(layer.linear, d.hidden);
        break;
    }
    KVPAGE_ASSIGN_OR_RETURN(T ff, FeedForwardParams<T>(cfg, d, i, &counts.routed_experts));
    total += n + ff;
  }
  counts.total = total;
  return counts;
}

}  // namespace

absl::StatusOr<ParamCounts> CountParameters(const ConfigReader& cfg, const ModelSpec& spec) {
  // Count once in floating point first: every field may be up to 2^31, and their products must
  // not overflow int64 in the exact count below.
  KVPAGE_ASSIGN_OR_RETURN(Counts<double> estimate, Count<double>(cfg, spec));
  constexpr double kMaxParams = 1e16;  // ~10,000× the largest published models
  if (!(estimate.total < kMaxParams)) {
    // No one field is to blame: name the shapes the count multiplies.
    const int32_t head_dim = spec.groups.empty() ? 0 : spec.groups[0].spec.attention.head_dim_k;
    return absl::InvalidArgumentError(absl::StrCat(
        cfg.source(), ": the layer shapes give an implausible ", estimate.total,
        " parameters (over 1e16): num_hidden_layers ", spec.num_layers(), ", hidden_size ",
        spec.hidden_size, ", num_attention_heads ", spec.num_attention_heads, ", head_dim ",
        head_dim, ", vocab_size ", spec.vocab_size));
  }
  KVPAGE_ASSIGN_OR_RETURN(Counts<int64_t> exact, Count<int64_t>(cfg, spec));
  return ParamCounts{exact.total, exact.routed_experts, exact.embeddings};
}


absl::StatusOr<int64_t> WeightBytes(const ConfigReader& cfg, const ParamCounts& counts,
                                    DType dtype) {
  const int64_t bytes = BytesPerValue(dtype);
  const nlohmann::json* quant = cfg.Find("quantization_config");
  if (quant == nullptr) return counts.total * bytes;
  if (!quant->is_object()) return cfg.Error("quantization_config", "must be an object");
  auto method = quant->find("quant_method");
  if (method == quant->end() || !method->is_string()) {
    return cfg.Error("quantization_config.quant_method", "is missing");
  }
  const std::string m = method->get<std::string>();
  if (m == "fp8") {
    // Norms are a rounding error next to the matrices; count them as linear weights too.
    const int64_t linear = counts.total - counts.embeddings;
    return counts.embeddings * bytes + linear + linear * 4 / (128 * 128);
  }
  if (m == "mxfp4") {
    // 32 four-bit values share one 8-bit scale: 17 bytes per 32 weights.
    return (counts.total - counts.routed_experts) * bytes + counts.routed_experts * 17 / 32;
  }
  if (m == "gptq" || m == "awq") {
    // Integer weights of `bits` bits with an f16 scale and a packed zero point per group.
    auto bits = quant->find("bits");
    if (bits == quant->end() || !bits->is_number_integer() || bits->get<int64_t>() <= 0 ||
        bits->get<int64_t>() > 16) {
      return cfg.Error("quantization_config.bits", "must be an integer in [1, 16]");
    }
    int64_t group = 128;
    if (auto g = quant->find("group_size"); g != quant->end() && g->is_number_integer() &&
                                            g->get<int64_t>() > 0) {
      group = g->get<int64_t>();
    }
    const int64_t linear = counts.total - counts.embeddings;
    const int64_t b = bits->get<int64_t>();
    return counts.embeddings * bytes + linear * b / 8 + linear / group * (2 + b / 8);
  }
  return cfg.Error("quantization_config.quant_method",
                   absl::StrCat("'", m, "' is not supported (fp8, mxfp4, gptq, awq)"));
}

}  // namespace kvpage::internal
