#include "model/mamba_hybrid.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "internal/status_macros.h"

namespace kvpage::internal {
namespace {

// The field spellings of one config family (vLLM's nemotron_h.py and granitemoehybrid.py read
// the same names).
struct MambaFields {
  const char* heads;
  const char* head_dim;
  const char* state;
  const char* kernel;
  const char* groups;
};
constexpr MambaFields kNemotronFields{"mamba_num_heads", "mamba_head_dim", "ssm_state_size",
                                      "conv_kernel", "n_groups"};
constexpr MambaFields kGraniteFields{"mamba_n_heads", "mamba_d_head", "mamba_d_state",
                                     "mamba_d_conv", "mamba_n_groups"};

bool IsNemotron(const ConfigReader& cfg) { return cfg.Has("hybrid_override_pattern"); }
// Falcon-H1 declares no layout: every decoder layer runs attention and a Mamba-2 mixer side by
// side (vLLM's FalconH1ParallelHybrid). It spells the Mamba fields as Granite does.
bool IsFalcon(const ConfigReader& cfg) {
  absl::StatusOr<std::optional<std::string>> type = cfg.OptionalString("model_type");
  return type.ok() && type->has_value() && **type == "falcon_h1";
}

// Nemotron-H: one letter per layer in hybrid_override_pattern.
absl::StatusOr<std::string> ReadPattern(const ConfigReader& cfg, int64_t num_layers) {
  KVPAGE_ASSIGN_OR_RETURN(std::optional<std::string> pattern,
                          cfg.OptionalString("hybrid_override_pattern"));
  if (!pattern.has_value()) return cfg.Error("hybrid_override_pattern", "is missing");
  if (static_cast<int64_t>(pattern->size()) != num_layers) {
    return cfg.Error("hybrid_override_pattern",
                     absl::StrCat("has ", pattern->size(), " letters but num_hidden_layers is ",
                                  num_layers));
  }
  for (size_t i = 0; i < pattern->size(); ++i) {
    const char c = (*pattern)[i];
    if (c == 'M' || c == '*' || c == '-' || c == 'E') continue;
    return cfg.Error("hybrid_override_pattern",
                     absl::StrCat("has '", std::string(1, c), "' at layer ", i,
                                  " (supported: 'M' Mamba-2, '*' attention, '-' MLP, 'E' MoE)"));
  }
  return *std::move(pattern);
}

// Granite 4.0-H: layer_types of "mamba" and "attention". Empty when no layer is "mamba".
absl::StatusOr<std::string> ReadGraniteLayerTypes(const ConfigReader& cfg, int64_t num_layers) {
  const nlohmann::json* types = cfg.Find("layer_types");
  if (types == nullptr || !types->is_array()) return std::string();
  bool any_mamba = false;
  for (const auto& t : *types) any_mamba |= t.is_string() && t.get<std::string>() == "mamba";
  if (!any_mamba) return std::string();
  if (static_cast<int64_t>(types->size()) != num_layers) {
    return cfg.Error("layer_types", absl::StrCat("has ", types->size(),
                                                 " entries but num_hidden_layers is ",
                                                 num_layers));
  }
  std::string blocks;
  for (size_t i = 0; i < types->size(); ++i) {
    const auto& t = (*types)[i];
    const std::string name = t.is_string() ? t.get<std::string>() : t.dump();
    if (name == "mamba") {
      blocks += 'M';
    } else if (name == "attention") {
      blocks += '*';
    } else {
      return cfg.Error(absl::StrCat("layer_types[", i, "]"),
                       absl::StrCat("is '", name, "' in a Mamba hybrid (expected mamba or "
                                                  "attention)"));
    }
  }
  return blocks;
}

absl::StatusOr<int32_t> ReadPositive(const ConfigReader& cfg, const char* field) {
  KVPAGE_ASSIGN_OR_RETURN(int64_t v, cfg.PositiveInt(field));
  return static_cast<int32_t>(v);
}

// The SSM state dtype: Nemotron-H configs name it (vLLM's default for them is float32),
// Granite keeps the model dtype.
absl::StatusOr<DType> ReadSsmDType(const ConfigReader& cfg, DType model_dtype) {
  if (!IsNemotron(cfg)) return model_dtype;
  KVPAGE_ASSIGN_OR_RETURN(std::optional<std::string> text,
                          cfg.OptionalString("mamba_ssm_cache_dtype"));
  if (!text.has_value()) return DType::kF32;
  auto dtype = ParseDType(*text);
  if (!dtype.ok()) return cfg.Error("mamba_ssm_cache_dtype", dtype.status().message());
  if (*dtype == DType::kQ8_0) return cfg.Error("mamba_ssm_cache_dtype", "cannot be q8_0");
  return *dtype;
}

// The Mamba head width; Falcon-H1 may write "auto" for mamba_d_ssm / mamba_n_heads.
absl::StatusOr<int32_t> ReadHeadDim(const ConfigReader& cfg, const char* field, int32_t heads) {
  const nlohmann::json* v = cfg.Find(field);
  if (v == nullptr || !v->is_string() || v->get<std::string>() != "auto" || !IsFalcon(cfg)) {
    return ReadPositive(cfg, field);
  }
  KVPAGE_ASSIGN_OR_RETURN(int64_t d_ssm, cfg.PositiveInt("mamba_d_ssm"));
  if (d_ssm % heads != 0) {
    return cfg.Error(field, absl::StrCat("is auto but mamba_d_ssm ", d_ssm,
                                         " is not a multiple of mamba_n_heads ", heads));
  }
  return static_cast<int32_t>(d_ssm / heads);
}

// vLLM sizes Falcon-H1's conv state from mamba_d_ssm (else mamba_expand·hidden_size) and its
// SSM state from the heads; the shape holds both only when they agree.
absl::Status CheckFalconWidth(const ConfigReader& cfg, const LinearStateShape& s) {
  const int64_t heads_width = int64_t{s.num_v_heads} * s.v_head_dim;
  if (cfg.Has("mamba_d_ssm")) {
    KVPAGE_ASSIGN_OR_RETURN(int64_t d_ssm, cfg.PositiveInt("mamba_d_ssm"));
    if (d_ssm == heads_width) return absl::OkStatus();
    return cfg.Error("mamba_d_ssm", absl::StrCat("(", d_ssm, ") differs from mamba_n_heads × "
                                                 "mamba_d_head = ", heads_width));
  }
  KVPAGE_ASSIGN_OR_RETURN(int64_t expand, cfg.PositiveInt("mamba_expand"));
  KVPAGE_ASSIGN_OR_RETURN(int64_t hidden, cfg.PositiveInt("hidden_size"));
  if (expand * hidden == heads_width) return absl::OkStatus();
  return cfg.Error("mamba_expand", absl::StrCat("× hidden_size = ", expand * hidden,
                                                " differs from mamba_n_heads × mamba_d_head = ",
                                                heads_width));
}

absl::StatusOr<LinearStateShape> ReadMamba2Shape(const ConfigReader& cfg, DType model_dtype) {
  const MambaFields& f = IsNemotron(cfg) ? kNemotronFields : kGraniteFields;
  LinearStateShape s;
  KVPAGE_ASSIGN_OR_RETURN(s.conv_kernel, ReadPositive(cfg, f.kernel));
  KVPAGE_ASSIGN_OR_RETURN(s.num_k_heads, ReadPositive(cfg, f.groups));
  KVPAGE_ASSIGN_OR_RETURN(s.k_head_dim, ReadPositive(cfg, f.state));
  KVPAGE_ASSIGN_OR_RETURN(s.num_v_heads, ReadPositive(cfg, f.heads));
  KVPAGE_ASSIGN_OR_RETURN(s.v_head_dim, ReadHeadDim(cfg, f.head_dim, s.num_v_heads));
  s.conv_dtype = model_dtype;
  KVPAGE_ASSIGN_OR_RETURN(s.recurrent_dtype, ReadSsmDType(cfg, model_dtype));
  if (IsFalcon(cfg)) {
    KVPAGE_RETURN_IF_ERROR(CheckFalconWidth(cfg, s));
  } else if (!IsNemotron(cfg)) {
    // vLLM sizes Granite's conv state from mamba_expand·hidden_size and its SSM state from
    // the heads; the shape above holds both only when they agree.
    KVPAGE_ASSIGN_OR_RETURN(int64_t expand, cfg.PositiveInt("mamba_expand"));
    KVPAGE_ASSIGN_OR_RETURN(int64_t hidden, cfg.PositiveInt("hidden_size"));
    const int64_t heads_width = int64_t{s.num_v_heads} * s.v_head_dim;
    if (expand * hidden != heads_width) {
      return cfg.Error("mamba_expand",
                       absl::StrCat("× hidden_size = ", expand * hidden,
                                    " differs from mamba_n_heads × mamba_d_head = ", heads_width));
    }
  }
  return s;
}

}  // namespace

absl::StatusOr<std::optional<MambaHybrid>> ReadMambaHybrid(const ConfigReader& cfg,
                                                           int64_t num_layers,
                                                           DType model_dtype) {
  MambaHybrid hybrid;
  if (IsNemotron(cfg)) {
    KVPAGE_ASSIGN_OR_RETURN(hybrid.blocks, ReadPattern(cfg, num_layers));
  } else if (IsFalcon(cfg)) {
    hybrid.blocks = std::string(static_cast<size_t>(num_layers), 'P');
  } else {
    KVPAGE_ASSIGN_OR_RETURN(hybrid.blocks, ReadGraniteLayerTypes(cfg, num_layers));
    if (hybrid.blocks.empty()) return std::nullopt;
  }
  for (char c : hybrid.blocks) {
    if (c == 'M' || c == 'P') hybrid.kinds.push_back(LayerKind::kLinearAttention);
    if (c == '*' || c == 'P') hybrid.kinds.push_back(LayerKind::kFullAttention);
  }
  if (hybrid.kinds.empty()) {
    return cfg.Error("hybrid_override_pattern", "has no Mamba or attention layer");
  }
  KVPAGE_ASSIGN_OR_RETURN(hybrid.state, ReadMamba2Shape(cfg, model_dtype));
  return hybrid;
}

namespace {

template <typename T>
struct Totals {
  T total = 0;
  T routed_experts = 0;
  T embeddings = 0;
};

// Mamba2Mixer: in_proj (z, x, B, C, dt), depthwise conv1d, A, D, dt_bias, gated norm, out_proj.
template <typename T>
absl::StatusOr<T> Mamba2MixerParams(const ConfigReader& cfg, const LinearStateShape& s, T hidden) {
  const T inner = T(s.num_v_heads) * s.v_head_dim;
  const T bc = 2 * T(s.num_k_heads) * s.k_head_dim;
  const T conv_dim = inner + bc;
  KVPAGE_ASSIGN_OR_RETURN(bool conv_bias,
                          cfg.BoolOr(IsNemotron(cfg) ? "use_conv_bias" : "mamba_conv_bias", true));
  // The gated RMSNorm's weight exists unless Falcon-H1 turns the norm off (mamba_rms_norm).
  KVPAGE_ASSIGN_OR_RETURN(bool gated_norm,
                          IsFalcon(cfg) ? cfg.BoolOr("mamba_rms_norm", false) : true);
  T n = hidden * (2 * inner + bc + s.num_v_heads);
  n += conv_dim * (s.conv_kernel + (conv_bias ? 1 : 0));
  n += 3 * T(s.num_v_heads) + (gated_norm ? inner : 0);
  n += inner * hidden;
  return n;
}

template <typename T>
T AttentionParams(const ModelSpec& spec, const AttentionShape& a) {
  const T hidden = T(spec.hidden_size);
  const T q_out = T(spec.num_attention_heads) * a.head_dim_k;
  return 2 * hidden * q_out + 2 * hidden * T(a.num_kv_heads) * a.head_dim_k;
}

// Granite 4.0-H: every layer has a shared SwiGLU MLP and, when num_local_experts > 0, routed
// experts with a router.
template <typename T>
absl::Status AddGraniteFeedForward(const ConfigReader& cfg, T hidden, T layers,
                                   Totals<T>* counts) {
  KVPAGE_ASSIGN_OR_RETURN(T shared, cfg.PositiveInt("shared_intermediate_size"));
  KVPAGE_ASSIGN_OR_RETURN(T experts, cfg.NonNegativeIntOr("num_local_experts", 0));
  T per_layer = 3 * hidden * shared;
  if (experts > 0) {
    KVPAGE_ASSIGN_OR_RETURN(T inter, cfg.PositiveInt("intermediate_size"));
    const T routed = experts * 3 * hidden * inter;
    per_layer += routed + hidden * experts;
    counts->routed_experts += layers * routed;
  }
  counts->total += layers * per_layer;
  return absl::OkStatus();
}

// Nemotron-H MoE block ('E', vLLM's NemotronHMoE): a router over the routed experts with a
// score-correction bias, routed experts of squared-ReLU up and down projections (on
// moe_latent_size values when the config sets it, with the two latent projections), and
// n_shared_experts shared experts as one MLP of n_shared·moe_shared_expert_intermediate_size.
template <typename T>
absl::Status AddNemotronMoe(const ConfigReader& cfg, T hidden, Totals<T>* counts) {
  KVPAGE_ASSIGN_OR_RETURN(T experts, cfg.PositiveInt("n_routed_experts"));
  KVPAGE_ASSIGN_OR_RETURN(T inter, cfg.PositiveInt("moe_intermediate_size"));
  KVPAGE_ASSIGN_OR_RETURN(T shared, cfg.NonNegativeIntOr("n_shared_experts", 0));
  T expert_width = hidden;
  const nlohmann::json* latent = cfg.Find("moe_latent_size");
  if (latent != nullptr && !latent->is_null()) {
    KVPAGE_ASSIGN_OR_RETURN(expert_width, cfg.PositiveInt("moe_latent_size"));
    counts->total += 2 * hidden * expert_width;
  }
  const T routed = experts * 2 * expert_width * inter;
  counts->routed_experts += routed;
  counts->total += routed + hidden * experts + experts;
  if (shared > 0) {
    KVPAGE_ASSIGN_OR_RETURN(T shared_inter,
                            cfg.PositiveInt("moe_shared_expert_intermediate_size"));
    counts->total += 2 * hidden * shared * shared_inter;
  }
  return absl::OkStatus();
}

template <typename T>
absl::StatusOr<Totals<T>> Count(const ConfigReader& cfg, const ModelSpec& spec,
                                const MambaHybrid& hybrid) {
  const bool nemotron = IsNemotron(cfg);
  const T hidden = T(spec.hidden_size);
  KVPAGE_ASSIGN_OR_RETURN(bool tied, cfg.BoolOr("tie_word_embeddings", !nemotron));
  Totals<T> counts;
  counts.embeddings = T(spec.vocab_size) * hidden * (tied ? 1 : 2);
  counts.total = counts.embeddings + hidden;  // + final norm
  KVPAGE_ASSIGN_OR_RETURN(T mixer, Mamba2MixerParams<T>(cfg, hybrid.state, hidden));
  AttentionShape attention;
  for (const LayerSpec& l : spec.layers) {
    if (l.IsAttention()) attention = l.attention;
  }
  const T norms = nemotron ? hidden : 2 * hidden;
  for (char c : hybrid.blocks) {
    counts.total += norms;
    if (c == 'M') counts.total += mixer;
    if (c == '*') counts.total += AttentionParams<T>(spec, attention);
    if (c == '-') {  // squared-ReLU MLP: up and down projections
      KVPAGE_ASSIGN_OR_RETURN(T inter, cfg.PositiveInt("intermediate_size"));
      counts.total += 2 * hidden * inter;
    }
    if (c == 'E') KVPAGE_RETURN_IF_ERROR(AddNemotronMoe<T>(cfg, hidden, &counts));
    if (c == 'P') {  // Falcon-H1: Mamba-2 mixer, attention and a SwiGLU MLP in every layer
      KVPAGE_ASSIGN_OR_RETURN(T inter, cfg.PositiveInt("intermediate_size"));
      counts.total += mixer + AttentionParams<T>(spec, attention) + 3 * hidden * inter;
    }
  }
  if (!nemotron && !IsFalcon(cfg)) {
    KVPAGE_RETURN_IF_ERROR(
        AddGraniteFeedForward<T>(cfg, hidden, T(hybrid.blocks.size()), &counts));
  }
  return counts;
}

}  // namespace

absl::StatusOr<ParamCounts> CountMambaHybridParameters(const ConfigReader& cfg,
                                                       const ModelSpec& spec,
                                                       const MambaHybrid& hybrid) {
  return CountWithoutOverflow(cfg, "the Mamba hybrid's shapes", [&](auto zero) {
    return Count<decltype(zero)>(cfg, spec, hybrid);
  });
}

}  // namespace kvpage::internal
