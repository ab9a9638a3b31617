// Mamba-2 hybrid configs: NVIDIA Nemotron-H, IBM Granite 4.0-H and TII Falcon-H1.
//
// A Mamba-2 layer keeps a fixed state per request, the same two tensors as a Gated DeltaNet
// layer, so it is a kLinearAttention layer with this LinearStateShape:
//   num_k_heads = n_groups, k_head_dim = ssm_state_size, num_v_heads = mamba heads,
//   v_head_dim = mamba head_dim, conv_kernel = conv kernel.
// Then ConvValues() = (kernel − 1) × (heads·head_dim + 2·n_groups·state) and RecurrentValues()
// = heads × state × head_dim: vLLM's mamba2_state_shape (conv state and temporal state).
//
// Nemotron-H blocks that hold no cache ('-' MLP-only, 'E' MoE) are left out of ModelSpec::layers; their
// weights still count in the parameter total.
#ifndef KVPAGE_MODEL_MAMBA_HYBRID_H_
#define KVPAGE_MODEL_MAMBA_HYBRID_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kvpage/model_spec.h"
#include "model/config_reader.h"
#include "model/param_count.h"

namespace kvpage::internal {

struct MambaHybrid {
  // One character per decoder layer: 'M' Mamba-2, '*' attention, '-' MLP only, 'E' MoE,
  // 'P' Mamba-2 and attention side by side (Falcon-H1).
  std::string blocks;
  // The cache-holding layers in order: kLinearAttention for 'M', kFullAttention for '*', both
  // (Mamba first) for 'P'.
  std::vector<LayerKind> kinds;
  LinearStateShape state;
};

// nullopt when the config is not a Mamba-2 hybrid (no "hybrid_override_pattern", no "mamba"
// entry in "layer_types", model_type not "falcon_h1"). Errors name the field: a pattern whose
// length is not num_layers, an unknown block letter, a missing or non-positive Mamba size, a
// Mamba width (Granite's mamba_expand·hidden_size, Falcon-H1's mamba_d_ssm) that differs from
// mamba_n_heads·mamba_d_head.
absl::StatusOr<std::optional<MambaHybrid>> ReadMambaHybrid(const ConfigReader& cfg,
                                                           int64_t num_layers, DType model_dtype);

// Parameters of a Mamba-2 hybrid: embeddings, norms, Mamba-2 mixers, attention, Nemotron-H MLP
// and MoE blocks, Granite's shared MLP and routed experts, Falcon-H1's SwiGLU MLP. `spec` must
// hold hidden_size, vocab_size and model_type.
absl::StatusOr<ParamCounts> CountMambaHybridParameters(const ConfigReader& cfg,
                                                       const ModelSpec& spec,
                                                       const MambaHybrid& hybrid);

}  // namespace kvpage::internal

#endif  // KVPAGE_MODEL_MAMBA_HYBRID_H_
