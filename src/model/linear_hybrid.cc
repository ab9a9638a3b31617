#include "model/linear_hybrid.h"

#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "internal/status_macros.h"

namespace kvpage::internal {
namespace {

int32_t Narrow(int64_t v) { return static_cast<int32_t>(v); }

// Jamba: layer i is attention when i % attn_layer_period == attn_layer_offset, else Mamba
// (transformers' JambaConfig.layers_block_type, which vLLM's jamba.py:322 reads).
absl::StatusOr<std::vector<LayerKind>> JambaKinds(const ConfigReader& cfg, int64_t num_layers) {
  KVPAGE_ASSIGN_OR_RETURN(int64_t period, cfg.PositiveInt("attn_layer_period"));
  KVPAGE_ASSIGN_OR_RETURN(int64_t offset, cfg.NonNegativeIntOr("attn_layer_offset", 0));
  if (offset >= period) {
    return cfg.Error("attn_layer_offset", absl::StrCat("(", offset, ") must be below "
                                                       "attn_layer_period (", period, ")"));
  }
  std::vector<LayerKind> kinds(num_layers, LayerKind::kLinearAttention);
  for (int64_t i = offset; i < num_layers; i += period) kinds[i] = LayerKind::kFullAttention;
  return kinds;
}

// vLLM's mamba1_state_shape(tp, mamba_expand·hidden_size, mamba_d_state, mamba_d_conv)
// (jamba.py:478-482) in LinearStateShape's terms: see linear_hybrid.h.
absl::StatusOr<LinearStateShape> JambaState(const ConfigReader& cfg, DType dtype) {
  KVPAGE_ASSIGN_OR_RETURN(int64_t expand, cfg.PositiveInt("mamba_expand"));
  KVPAGE_ASSIGN_OR_RETURN(int64_t hidden, cfg.PositiveInt("hidden_size"));
  KVPAGE_ASSIGN_OR_RETURN(int64_t state, cfg.PositiveInt("mamba_d_state"));
  KVPAGE_ASSIGN_OR_RETURN(int64_t conv, cfg.PositiveInt("mamba_d_conv"));
  if (expand * hidden > kMaxConfigInt) {
    return cfg.Error("mamba_expand", absl::StrCat("× hidden_size = ", expand * hidden,
                                                  " is implausibly large"));
  }
  return LinearStateShape{.conv_kernel = Narrow(conv), .num_k_heads = 0,
                          .k_head_dim = Narrow(state), .num_v_heads = Narrow(expand * hidden),
                          .v_head_dim = 1, .conv_dtype = dtype, .recurrent_dtype = dtype};
}

// MiniMax: attn_type_list[i] is 0 for a lightning (linear) layer, 1 for softmax attention.
absl::StatusOr<std::vector<LayerKind>> MiniMaxKinds(const ConfigReader& cfg,
                                                    int64_t num_layers) {
  const nlohmann::json* list = cfg.Find("attn_type_list");
  if (!list->is_array()) return cfg.Error("attn_type_list", "must be an array");
  if (static_cast<int64_t>(list->size()) != num_layers) {
    return cfg.Error("attn_type_list", absl::StrCat("has ", list->size(),
                                                    " entries but num_hidden_layers is ",
                                                    num_layers));
  }
  std::vector<LayerKind> kinds;
  for (size_t i = 0; i < list->size(); ++i) {
    const nlohmann::json& v = (*list)[i];
    if (!v.is_number_integer() || (v.get<int64_t>() != 0 && v.get<int64_t>() != 1)) {
      return cfg.Error(absl::StrCat("attn_type_list[", i, "]"),
                       absl::StrCat("must be 0 (linear) or 1 (softmax), got ", v.dump()));
    }
    kinds.push_back(v.get<int64_t>() == 0 ? LayerKind::kLinearAttention
                                          : LayerKind::kFullAttention);
  }
  return kinds;
}

// vLLM's linear_attention_state_shape(num_attention_heads, tp, head_dim) (linear/base.py:63).
absl::StatusOr<LinearStateShape> MiniMaxState(const ConfigReader& cfg, DType dtype) {
  KVPAGE_ASSIGN_OR_RETURN(int64_t heads, cfg.PositiveInt("num_attention_heads"));
  KVPAGE_ASSIGN_OR_RETURN(std::optional<int64_t> head_dim, cfg.OptionalPositiveInt("head_dim"));
  if (!head_dim.has_value()) {
    KVPAGE_ASSIGN_OR_RETURN(int64_t hidden, cfg.PositiveInt("hidden_size"));
    head_dim = hidden / heads;
  }
  return LinearStateShape{.conv_kernel = 1, .num_k_heads = Narrow(heads),
                          .k_head_dim = Narrow(*head_dim), .num_v_heads = Narrow(heads),
                          .v_head_dim = Narrow(*head_dim), .conv_dtype = dtype,
                          .recurrent_dtype = dtype};
}

// A positive integer inside linear_attn_config, named "linear_attn_config.<key>" in errors.
absl::StatusOr<int32_t> KimiInt(const ConfigReader& cfg, const nlohmann::json& kda,
                                const char* key) {
  const std::string field = absl::StrCat("linear_attn_config.", key);
  auto it = kda.find(key);
  if (it == kda.end() || it->is_null()) return cfg.Error(field, "is missing");
  if (!it->is_number_integer() || it->get<int64_t>() <= 0 ||
      it->get<int64_t>() > kMaxConfigInt) {
    return cfg.Error(field, absl::StrCat("must be a positive integer, got ", it->dump()));
  }
  return Narrow(it->get<int64_t>());
}

// The 1-based layer numbers of linear_attn_config[key] (vLLM's KimiLinearConfig.is_kda_layer
// tests layer_idx + 1, transformers_utils/configs/kimi_linear.py:157-161).
absl::StatusOr<std::set<int64_t>> KimiLayers(const ConfigReader& cfg, const nlohmann::json& kda,
                                             const char* key, int64_t num_layers) {
  const std::string field = absl::StrCat("linear_attn_config.", key);
  auto it = kda.find(key);
  std::set<int64_t> layers;
  if (it == kda.end() || it->is_null()) return layers;
  if (!it->is_array()) return cfg.Error(field, "must be an array");
  for (size_t i = 0; i < it->size(); ++i) {
    const nlohmann::json& v = (*it)[i];
    if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > num_layers ||
        !layers.insert(v.get<int64_t>()).second) {
      return cfg.Error(absl::StrCat(field, "[", i, "]"),
                       absl::StrCat("must be a new layer number in [1, ", num_layers,
                                    "], got ", v.dump()));
    }
  }
  return layers;
}

// Kimi Linear: layer i is KDA when i + 1 is in kda_layers, else MLA; full_attn_layers, when
// given, must not name a KDA layer.
absl::StatusOr<std::vector<LayerKind>> KimiKinds(const ConfigReader& cfg,
                                                 const nlohmann::json& kda,
                                                 int64_t num_layers) {
  KVPAGE_ASSIGN_OR_RETURN(auto linear, KimiLayers(cfg, kda, "kda_layers", num_layers));
  KVPAGE_ASSIGN_OR_RETURN(auto full, KimiLayers(cfg, kda, "full_attn_layers", num_layers));
  std::vector<LayerKind> kinds(num_layers, LayerKind::kFullAttention);
  for (int64_t n : linear) {
    if (full.count(n) > 0) {
      return cfg.Error("linear_attn_config.full_attn_layers",
                       absl::StrCat("names layer ", n, ", which kda_layers also names"));
    }
    kinds[n - 1] = LayerKind::kLinearAttention;
  }
  return kinds;
}

// vLLM's kda_state_shape(tp, num_heads, head_dim, conv_kernel_size=short_conv_kernel_size)
// (models/kimi_k3/nvidia/model.py:1517-1523; the KDA layer's own get_state_shape,
// layers/mamba/gdn/kimi_gdn_linear_attn.py:166-175, passes the same) and kda_state_dtype
// (mamba_utils.py:133-149: the conv state in the model dtype, the recurrent state f32 with
// mamba_ssm_cache_dtype auto).
absl::StatusOr<LinearStateShape> KimiState(const ConfigReader& cfg, const nlohmann::json& kda,
                                           DType dtype) {
  KVPAGE_ASSIGN_OR_RETURN(int32_t heads, KimiInt(cfg, kda, "num_heads"));
  KVPAGE_ASSIGN_OR_RETURN(int32_t head_dim, KimiInt(cfg, kda, "head_dim"));
  KVPAGE_ASSIGN_OR_RETURN(int32_t kernel, KimiInt(cfg, kda, "short_conv_kernel_size"));
  return LinearStateShape{.conv_kernel = kernel, .num_k_heads = heads, .k_head_dim = head_dim,
                          .num_v_heads = heads, .v_head_dim = head_dim, .conv_dtype = dtype,
                          .recurrent_dtype = DType::kF32};
}

absl::StatusOr<LinearHybrid> ReadKimi(const ConfigReader& cfg, int64_t num_layers,
                                      DType dtype) {
  const nlohmann::json* kda = cfg.Find("linear_attn_config");
  if (!kda->is_object()) return cfg.Error("linear_attn_config", "must be an object");
  LinearHybrid h{.family = LinearHybridFamily::kKimi};
  KVPAGE_ASSIGN_OR_RETURN(h.kinds, KimiKinds(cfg, *kda, num_layers));
  KVPAGE_ASSIGN_OR_RETURN(h.state, KimiState(cfg, *kda, dtype));
  return h;
}

}  // namespace

absl::StatusOr<std::optional<LinearHybrid>> ReadLinearHybrid(const ConfigReader& cfg,
                                                             int64_t num_layers,
                                                             DType model_dtype) {
  LinearHybrid h;
  if (cfg.Has("attn_layer_period")) {
    h.family = LinearHybridFamily::kJamba;
    KVPAGE_ASSIGN_OR_RETURN(h.kinds, JambaKinds(cfg, num_layers));
    KVPAGE_ASSIGN_OR_RETURN(h.state, JambaState(cfg, model_dtype));
  } else if (cfg.Has("attn_type_list")) {
    h.family = LinearHybridFamily::kMiniMax;
    KVPAGE_ASSIGN_OR_RETURN(h.kinds, MiniMaxKinds(cfg, num_layers));
    KVPAGE_ASSIGN_OR_RETURN(h.state, MiniMaxState(cfg, model_dtype));
  } else if (cfg.Has("linear_attn_config")) {
    KVPAGE_ASSIGN_OR_RETURN(h, ReadKimi(cfg, num_layers, model_dtype));
  } else {
    return std::nullopt;
  }
  return h;
}

}  // namespace kvpage::internal
