// Linear-attention hybrid configs beyond Mamba-2: AI21 Jamba (Mamba-1 + attention), MiniMax-M1
// (lightning attention + softmax attention) and Kimi Linear (Kimi Delta Attention + MLA).
//
// Each recurrent layer keeps a fixed state per request and becomes a kLinearAttention layer
// whose LinearStateShape gives the same conv and recurrent value counts as the shapes vLLM
// 0.33 declares (vllm/model_executor/layers/mamba/mamba_utils.py, MambaStateShapeCalculator):
//   Jamba       mamba1_state_shape (:171): conv (d_conv − 1) × d_inner, SSM d_inner × d_state,
//               as num_k_heads = 0, num_v_heads = d_inner, k_head_dim = d_state, v_head_dim = 1,
//               d_inner = mamba_expand · hidden_size (jamba.py:131). Both in the model dtype.
//   MiniMax-M1  linear_attention_state_shape (:154): one heads × head_dim × head_dim state,
//               no conv state (conv_kernel = 1), in the model dtype (mamba_utils.py:55).
//   Kimi Linear kda_state_shape (:296): conv (kernel − 1) × 3·heads·head_dim and a
//               heads × head_dim × head_dim state: the Gated DeltaNet shape with
//               num_k_heads = num_v_heads = heads; the state in f32 (kda_state_dtype, :133).
// The attention layers are full attention (Jamba, MiniMax) or MLA (Kimi, from kv_lora_rank).
#ifndef KVPAGE_MODEL_LINEAR_HYBRID_H_
#define KVPAGE_MODEL_LINEAR_HYBRID_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "kvpage/model_spec.h"
#include "model/config_reader.h"
#include "model/param_count.h"

namespace kvpage::internal {

enum class LinearHybridFamily : uint8_t { kJamba, kMiniMax, kKimi };

struct LinearHybrid {
  LinearHybridFamily family = LinearHybridFamily::kJamba;
  // One per decoder layer: kLinearAttention for the recurrent layers, kFullAttention for the
  // others (ParseModelSpec turns them into kMla when the config has kv_lora_rank).
  std::vector<LayerKind> kinds;
  LinearStateShape state;
};

// nullopt when the config has none of attn_layer_period (Jamba), attn_type_list (MiniMax) or
// linear_attn_config (Kimi Linear). Errors name the field: an offset not below the period, a
// layer list of the wrong length or with an entry out of range, a missing or non-positive
// state size.
absl::StatusOr<std::optional<LinearHybrid>> ReadLinearHybrid(const ConfigReader& cfg,
                                                             int64_t num_layers,
                                                             DType model_dtype);

// Parameters of these hybrids: embeddings, norms, the recurrent mixers, attention and the
// dense, MoE and shared-expert feed-forward blocks. `spec` must hold its layers,
// hidden_size, vocab_size and num_attention_heads.
absl::StatusOr<ParamCounts> CountLinearHybridParameters(const ConfigReader& cfg,
                                                        const ModelSpec& spec,
                                                        const LinearHybrid& hybrid);

}  // namespace kvpage::internal

#endif  // KVPAGE_MODEL_LINEAR_HYBRID_H_
