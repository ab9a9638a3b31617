// Parameter counts of the linear-attention hybrids in linear_hybrid.h, from the tensors each
// family's checkpoint holds (vLLM's jamba.py, minimax_linear_attn.py and kimi_k3 modules
// build the same ones).
#include <string>

#include "absl/strings/str_cat.h"
#include "internal/status_macros.h"
#include "model/linear_hybrid.h"

namespace kvpage::internal {
namespace {

template <typename T>
struct Totals {
  T total = 0;
  T routed_experts = 0;
  T embeddings = 0;
};

// Jamba's Mamba-1 mixer: in_proj (x, z), depthwise conv1d, x_proj (dt, B, C), dt_proj with
// bias, A_log, D, out_proj, and the dt/B/C RMSNorms.
template <typename T>
absl::StatusOr<T> JambaMixer(const ConfigReader& cfg, const LinearStateShape& s, T hidden) {
  const T inner = T(s.num_v_heads), state = T(s.k_head_dim);
  T dt_rank = (hidden + 15) / 16;  // "auto": ceil(hidden_size / 16)
  const nlohmann::json* rank = cfg.Find("mamba_dt_rank");
  if (rank != nullptr && !(rank->is_string() && rank->get<std::string>() == "auto")) {
    KVPAGE_ASSIGN_OR_RETURN(dt_rank, cfg.PositiveInt("mamba_dt_rank"));
  }
  KVPAGE_ASSIGN_OR_RETURN(bool conv_bias, cfg.BoolOr("mamba_conv_bias", true));
  KVPAGE_ASSIGN_OR_RETURN(bool proj_bias, cfg.BoolOr("mamba_proj_bias", false));
  T n = hidden * 2 * inner + inner * s.conv_kernel + (conv_bias ? inner : 0);
  n += inner * (dt_rank + 2 * state) + dt_rank * inner + inner;
  n += inner * state + inner + inner * hidden;
  n += proj_bias ? 2 * inner + hidden : 0;
  return n + dt_rank + 2 * state;
}

// MiniMax lightning attention: qkv_proj, output_gate, out_proj and the norm over the heads.
template <typename T>
T LightningParams(const LinearStateShape& s, T hidden) {
  const T inner = T(s.num_v_heads) * s.v_head_dim;
  return 5 * hidden * inner + inner;
}

// Kimi Delta Attention: q/k/v projections and short convs, the f and g low-rank gates (rank
// head_dim), b_proj, A_log, dt_bias, o_norm and o_proj.
template <typename T>
T KdaParams(const LinearStateShape& s, T hidden) {
  const T heads = T(s.num_v_heads), dim = T(s.v_head_dim), proj = heads * dim;
  T n = 3 * hidden * proj + 3 * proj * s.conv_kernel;
  n += 2 * (hidden * dim + dim * proj) + hidden * heads;
  return n + heads + proj + dim + proj * hidden;
}

template <typename T>
T GqaParams(const ModelSpec& spec, const AttentionShape& a) {
  const T hidden = T(spec.hidden_size), q_out = T(spec.num_attention_heads) * a.head_dim_k;
  return 2 * hidden * q_out + 2 * hidden * T(a.num_kv_heads) * a.head_dim_k;
}

// Kimi's MLA without a q LoRA: q_proj, kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj.
template <typename T>
absl::StatusOr<T> MlaParams(const ConfigReader& cfg, const ModelSpec& spec) {
  KVPAGE_ASSIGN_OR_RETURN(T rank, cfg.PositiveInt("kv_lora_rank"));
  KVPAGE_ASSIGN_OR_RETURN(T rope, cfg.PositiveInt("qk_rope_head_dim"));
  KVPAGE_ASSIGN_OR_RETURN(T nope, cfg.PositiveInt("qk_nope_head_dim"));
  KVPAGE_ASSIGN_OR_RETURN(T v_dim, cfg.PositiveInt("v_head_dim"));
  const T hidden = T(spec.hidden_size), heads = T(spec.num_attention_heads);
  return hidden * heads * (nope + rope) + hidden * (rank + rope) + rank +
         rank * heads * (nope + v_dim) + heads * v_dim * hidden;
}

// Routed experts (SwiGLU, `inter` wide) with their router; adds them to the routed count.
template <typename T>
T Experts(T experts, T hidden, T inter, Totals<T>* counts) {
  counts->routed_experts += experts * 3 * hidden * inter;
  return experts * 3 * hidden * inter + hidden * experts;
}

// The feed-forward block of layer i.
template <typename T>
absl::StatusOr<T> FeedForward(const ConfigReader& cfg, LinearHybridFamily family, T hidden,
                              int64_t i, Totals<T>* counts) {
  KVPAGE_ASSIGN_OR_RETURN(T inter, cfg.PositiveInt("intermediate_size"));
  if (family == LinearHybridFamily::kJamba) {  // experts every expert_layer_period-th layer
    KVPAGE_ASSIGN_OR_RETURN(T experts, cfg.NonNegativeIntOr("num_experts", 1));
    KVPAGE_ASSIGN_OR_RETURN(int64_t period, cfg.NonNegativeIntOr("expert_layer_period", 1));
    KVPAGE_ASSIGN_OR_RETURN(int64_t offset, cfg.NonNegativeIntOr("expert_layer_offset", 0));
    if (experts > 1 && period > 0 && i % period == offset) {
      return Experts<T>(experts, hidden, inter, counts);
    }
    return 3 * hidden * inter;
  }
  if (family == LinearHybridFamily::kMiniMax) {  // experts in every layer, optional shared MLP
    KVPAGE_ASSIGN_OR_RETURN(T experts, cfg.PositiveInt("num_local_experts"));
    KVPAGE_ASSIGN_OR_RETURN(T shared, cfg.NonNegativeIntOr("shared_intermediate_size", 0));
    return Experts<T>(experts, hidden, inter, counts) + 3 * hidden * shared;
  }
  // Kimi: dense below first_k_dense_replace or without experts (vLLM's KimiLinearConfig.is_moe),
  // else routed experts, router, e_score_correction_bias and the shared experts.
  KVPAGE_ASSIGN_OR_RETURN(int64_t dense, cfg.NonNegativeIntOr("first_k_dense_replace", 0));
  KVPAGE_ASSIGN_OR_RETURN(T experts, cfg.NonNegativeIntOr("num_experts", 0));
  if (i < dense || experts == 0) return 3 * hidden * inter;
  KVPAGE_ASSIGN_OR_RETURN(T moe_inter, cfg.PositiveInt("moe_intermediate_size"));
  KVPAGE_ASSIGN_OR_RETURN(T shared, cfg.NonNegativeIntOr("num_shared_experts", 0));
  return Experts<T>(experts, hidden, moe_inter, counts) + experts +
         shared * 3 * hidden * moe_inter;
}

// The mixer of one cache layer: the family's recurrent mixer, or its attention.
template <typename T>
absl::StatusOr<T> Mixer(const ConfigReader& cfg, const ModelSpec& spec, const LayerSpec& l,
                        LinearHybridFamily family) {
  const T hidden = T(spec.hidden_size);
  if (l.kind == LayerKind::kMla) return MlaParams<T>(cfg, spec);
  if (l.IsAttention()) return GqaParams<T>(spec, l.attention);
  if (family == LinearHybridFamily::kJamba) return JambaMixer<T>(cfg, l.linear, hidden);
  if (family == LinearHybridFamily::kMiniMax) return LightningParams<T>(l.linear, hidden);
  return KdaParams<T>(l.linear, hidden);
}

template <typename T>
absl::StatusOr<Totals<T>> Count(const ConfigReader& cfg, const ModelSpec& spec,
                                const LinearHybrid& hybrid) {
  const T hidden = T(spec.hidden_size);
  KVPAGE_ASSIGN_OR_RETURN(bool tied, cfg.BoolOr("tie_word_embeddings", false));
  Totals<T> counts;
  counts.embeddings = T(spec.vocab_size) * hidden * (tied ? 1 : 2);
  counts.total = counts.embeddings + hidden;  // + final norm
  for (int64_t i = 0; i < spec.num_layers(); ++i) {
    KVPAGE_ASSIGN_OR_RETURN(T mixer, Mixer<T>(cfg, spec, spec.layers[i], hybrid.family));
    KVPAGE_ASSIGN_OR_RETURN(T ff, FeedForward<T>(cfg, hybrid.family, hidden, i, &counts));
    counts.total += 2 * hidden + mixer + ff;  // + input and post-attention norms
  }
  return counts;
}

}  // namespace

absl::StatusOr<ParamCounts> CountLinearHybridParameters(const ConfigReader& cfg,
                                                        const ModelSpec& spec,
                                                        const LinearHybrid& hybrid) {
  return CountWithoutOverflow(cfg, "the hybrid's shapes", [&](auto zero) {
    return Count<decltype(zero)>(cfg, spec, hybrid);
  });
}

}  // namespace kvpage::internal
