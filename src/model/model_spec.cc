#include "kvpage/model_spec.h"

#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "internal/status_macros.h"
#include "model/config_reader.h"
#include "model/linear_hybrid.h"
#include "model/mamba_hybrid.h"
#include "model/unread_layouts.h"
#include "model/param_count.h"

namespace kvpage {
namespace {

using internal::ConfigReader;

absl::StatusOr<LayerKind> ParseLayerType(const ConfigReader& cfg, const nlohmann::json& value,
                                         size_t index) {
  const std::string field = absl::StrCat("layer_types[", index, "]");
  if (!value.is_string()) {
    return cfg.Error(field, absl::StrCat("must be a string, got ", value.dump()));
  }
  const std::string type = value.get<std::string>();
  if (type == "full_attention" || type == "attention") return LayerKind::kFullAttention;
  if (type == "sliding_attention" || type == "sliding_window") return LayerKind::kSlidingWindow;
  if (type == "linear_attention") return LayerKind::kLinearAttention;
  return cfg.Error(field, absl::StrCat("has unknown layer kind '", type,
                                       "' (expected full_attention, sliding_attention or "
                                       "linear_attention)"));
}

// Decides full / sliding / linear per layer from whichever convention the config uses.
// MLA is decided later: it changes the cache shape, not the layer's reach.
absl::StatusOr<std::vector<LayerKind>> ReadLayerKinds(const ConfigReader& cfg,
                                                      int64_t num_layers) {
  std::vector<LayerKind> kinds(num_layers, LayerKind::kFullAttention);
  if (const nlohmann::json* types = cfg.Find("layer_types"); types != nullptr) {
    if (!types->is_array()) return cfg.Error("layer_types", "must be an array");
    if (static_cast<int64_t>(types->size()) != num_layers) {
      return cfg.Error("layer_types", absl::StrCat("has ", types->size(),
                                                   " entries but num_hidden_layers is ",
                                                   num_layers));
    }
    for (size_t i = 0; i < types->size(); ++i) {
      KVPAGE_ASSIGN_OR_RETURN(kinds[i], ParseLayerType(cfg, (*types)[i], i));
    }
    return kinds;
  }
  // Qwen3-Next: every k-th layer is full attention, the rest Gated DeltaNet.
  KVPAGE_ASSIGN_OR_RETURN(std::optional<int64_t> interval,
                          cfg.OptionalPositiveInt("full_attention_interval"));
  if (interval.has_value()) {
    for (int64_t i = 0; i < num_layers; ++i) {
      kinds[i] = (i + 1) % *interval == 0 ? LayerKind::kFullAttention
                                          : LayerKind::kLinearAttention;
    }
    return kinds;
  }
  KVPAGE_ASSIGN_OR_RETURN(bool use_sliding, cfg.BoolOr("use_sliding_window", true));
  const bool has_window = cfg.Has("sliding_window") && use_sliding;
  // Gemma 2/3: every p-th layer is global, the rest local (sliding).
  KVPAGE_ASSIGN_OR_RETURN(std::optional<int64_t> pattern,
                          cfg.OptionalPositiveInt("sliding_window_pattern"));
  if (pattern.has_value() && has_window) {
    for (int64_t i = 0; i < num_layers; ++i) {
      kinds[i] = (i + 1) % *pattern == 0 ? LayerKind::kFullAttention
                                         : LayerKind::kSlidingWindow;
    }
    return kinds;
  }
  if (has_window) {
    // Mistral v0.1 style: every layer slides. Qwen2 style: layers from max_window_layers on.
    KVPAGE_ASSIGN_OR_RETURN(int64_t first_sliding, cfg.NonNegativeIntOr("max_window_layers", 0));
    for (int64_t i = first_sliding; i < num_layers; ++i) kinds[i] = LayerKind::kSlidingWindow;
  }
  return kinds;
}

// Whether each layer applies RoPE (Llama 4): no_rope_layers[i] != 0, or, when that list is
// absent or empty, every layer but each no_rope_layer_interval-th (default 4, as transformers'
// Llama4TextConfig derives it).
absl::StatusOr<std::vector<bool>> ReadRopeLayers(const ConfigReader& cfg, int64_t num_layers) {
  std::vector<bool> rope(num_layers, true);
  const nlohmann::json* list = cfg.Find("no_rope_layers");
  if (list != nullptr && !list->is_null() && !(list->is_array() && list->empty())) {
    if (!list->is_array()) return cfg.Error("no_rope_layers", "must be an array");
    if (static_cast<int64_t>(list->size()) != num_layers) {
      return cfg.Error("no_rope_layers", absl::StrCat("has ", list->size(),
                                                      " entries but num_hidden_layers is ",
                                                      num_layers));
    }
    for (size_t i = 0; i < list->size(); ++i) {
      const nlohmann::json& v = (*list)[i];
      if (!v.is_number_integer() || (v.get<int64_t>() != 0 && v.get<int64_t>() != 1)) {
        return cfg.Error(absl::StrCat("no_rope_layers[", i, "]"),
                         absl::StrCat("must be 0 or 1, got ", v.dump()));
      }
      rope[i] = v.get<int64_t>() != 0;
    }
    return rope;
  }
  KVPAGE_ASSIGN_OR_RETURN(std::optional<int64_t> interval,
                          cfg.OptionalPositiveInt("no_rope_layer_interval"));
  for (int64_t i = 0; i < num_layers; ++i) rope[i] = (i + 1) % interval.value_or(4) != 0;
  return rope;
}

// Llama 4's chunked-local attention: with an attention_chunk_size, the full-attention layers
// that apply RoPE attend within their chunk, the NoPE layers globally (vLLM's Llama4Attention).
// Returns the chunk size, 0 when the config has none (kinds then stay as they are).
absl::StatusOr<int32_t> ApplyChunkedLocal(const ConfigReader& cfg,
                                          std::vector<LayerKind>& kinds) {
  const nlohmann::json* field = cfg.Find("attention_chunk_size");
  if (field == nullptr || field->is_null()) return 0;
  KVPAGE_ASSIGN_OR_RETURN(int64_t chunk, cfg.PositiveInt("attention_chunk_size"));
  if (chunk > std::numeric_limits<int32_t>::max()) {
    return cfg.Error("attention_chunk_size", absl::StrCat("(", chunk, ") is too large"));
  }
  KVPAGE_ASSIGN_OR_RETURN(std::vector<bool> rope,
                          ReadRopeLayers(cfg, static_cast<int64_t>(kinds.size())));
  for (size_t i = 0; i < kinds.size(); ++i) {
    if (rope[i] && kinds[i] == LayerKind::kFullAttention) kinds[i] = LayerKind::kChunkedLocal;
  }
  return static_cast<int32_t>(chunk);
}

absl::StatusOr<LinearStateShape> ReadLinearShape(const ConfigReader& cfg, DType model_dtype) {
  LinearStateShape s;
  KVPAGE_ASSIGN_OR_RETURN(int64_t kernel, cfg.PositiveInt("linear_conv_kernel_dim"));
  KVPAGE_ASSIGN_OR_RETURN(int64_t nk, cfg.PositiveInt("linear_num_key_heads"));
  KVPAGE_ASSIGN_OR_RETURN(int64_t dk, cfg.PositiveInt("linear_key_head_dim"));
  KVPAGE_ASSIGN_OR_RETURN(int64_t nv, cfg.PositiveInt("linear_num_value_heads"));
  KVPAGE_ASSIGN_OR_RETURN(int64_t dv, cfg.PositiveInt("linear_value_head_dim"));
  s.conv_kernel = static_cast<int32_t>(kernel);
  s.num_k_heads = static_cast<int32_t>(nk);
  s.k_head_dim = static_cast<int32_t>(dk);
  s.num_v_heads = static_cast<int32_t>(nv);
  s.v_head_dim = static_cast<int32_t>(dv);
  s.conv_dtype = model_dtype;
  s.recurrent_dtype = model_dtype;
  KVPAGE_ASSIGN_OR_RETURN(std::optional<std::string> ssm, cfg.OptionalString("mamba_ssm_dtype"));
  if (ssm.has_value()) {
    auto dtype = ParseDType(*ssm);
    if (!dtype.ok()) return cfg.Error("mamba_ssm_dtype", dtype.status().message());
    if (*dtype == DType::kQ8_0) return cfg.Error("mamba_ssm_dtype", "cannot be q8_0");
    s.recurrent_dtype = *dtype;
  }
  return s;
}

// max_position_embeddings. Kimi Linear's config.json omits it (its length is model_max_length);
// vLLM's KimiLinearConfig then holds its default, 4096
// (vllm/transformers_utils/configs/kimi_linear.py:55).
absl::StatusOr<int64_t> ReadMaxPositions(const ConfigReader& cfg, const std::string& type) {
  if (type == "kimi_linear" && !cfg.Has("max_position_embeddings")) return 4096;
  return cfg.PositiveInt("max_position_embeddings");
}

absl::StatusOr<DType> ReadModelDType(const ConfigReader& cfg) {
  for (const char* field : {"torch_dtype", "dtype"}) {
    KVPAGE_ASSIGN_OR_RETURN(std::optional<std::string> text, cfg.OptionalString(field));
    if (!text.has_value()) continue;
    auto dtype = ParseDType(*text);
    if (!dtype.ok()) return cfg.Error(field, dtype.status().message());
    if (*dtype == DType::kQ8_0) return cfg.Error(field, "cannot be q8_0 for model weights");
    return *dtype;
  }
  return DType::kBF16;  // Hugging Face checkpoints without the field are published in bf16.
}

int32_t Narrow(int64_t v) { return static_cast<int32_t>(v); }

// Routed-expert counts of an MoE config (the same field spellings param_count.cc accepts).
absl::Status ReadExperts(const internal::ConfigReader& cfg, ModelSpec* spec) {
  std::optional<int64_t> experts;
  for (const char* field : {"n_routed_experts", "num_experts", "num_local_experts"}) {
    KVPAGE_ASSIGN_OR_RETURN(experts, cfg.OptionalPositiveInt(field));
    if (experts.has_value()) break;
  }
  std::optional<int64_t> per_token;
  for (const char* field : {"num_experts_per_tok", "experts_per_token", "num_experts_per_token"}) {
    KVPAGE_ASSIGN_OR_RETURN(per_token, cfg.OptionalPositiveInt(field));
    if (per_token.has_value()) break;
  }
  if (!experts.has_value()) return cfg.Error("num_experts", "is missing");
  if (!per_token.has_value()) return cfg.Error("num_experts_per_tok", "is missing");
  if (*per_token > *experts) {
    return cfg.Error("num_experts_per_tok", absl::StrCat("(", *per_token,
                                                         ") exceeds the number of experts (",
                                                         *experts, ")"));
  }
  spec->num_experts = Narrow(*experts);
  spec->experts_per_token = Narrow(*per_token);
  return absl::OkStatus();
}

}  // namespace

absl::string_view LayerKindName(LayerKind kind) {
  switch (kind) {
    case LayerKind::kFullAttention: return "full_attention";
    case LayerKind::kSlidingWindow: return "sliding_window";
    case LayerKind::kMla: return "mla";
    case LayerKind::kLinearAttention: return "linear_attention";
    case LayerKind::kChunkedLocal: return "chunked_local";
  }
  return "unknown";
}

int64_t LinearStateShape::NativeBytes() const {
  // Both dtypes are byte-aligned (the loader rejects q8_0 state), so RowBytes cannot fail.
  return ConvValues() * BytesPerValue(conv_dtype) +
         RecurrentValues() * BytesPerValue(recurrent_dtype);
}

int32_t ModelSpec::NumLayersOfKind(LayerKind kind) const {
  int32_t n = 0;
  for (const LayerSpec& layer : layers) n += layer.kind == kind ? 1 : 0;
  return n;
}

std::vector<LayerGroup> GroupLayers(const std::vector<LayerSpec>& layers) {
  std::vector<LayerGroup> groups;
  for (size_t i = 0; i < layers.size(); ++i) {
    LayerGroup* match = nullptr;
    for (LayerGroup& g : groups) {
      if (g.spec == layers[i]) {
        match = &g;
        break;
      }
    }
    if (match == nullptr) {
      groups.push_back(LayerGroup{layers[i], {}});
      match = &groups.back();
    }
    match->layers.push_back(static_cast<int32_t>(i));
  }
  return groups;
}

namespace {

// rope_scaling (or rope_parameters): the type and factor that decide how far positions go.
absl::Status ReadRopeScaling(const ConfigReader& cfg, ModelSpec& spec) {
  const char* field = cfg.Has("rope_scaling") ? "rope_scaling" : "rope_parameters";
  const nlohmann::json* rope = cfg.Find(field);
  if (rope == nullptr || rope->is_null()) return absl::OkStatus();
  if (!rope->is_object()) return cfg.Error(field, "is not an object");
  for (const char* key : {"rope_type", "type"}) {
    const auto it = rope->find(key);
    if (it == rope->end() || it->is_null()) continue;
    if (!it->is_string()) return cfg.Error(field, absl::StrCat("has a '", key, "' that is not a string"));
    spec.rope_type = it->get<std::string>();
    break;
  }
  const auto factor = rope->find("factor");
  if (factor != rope->end() && !factor->is_null()) {
    if (!factor->is_number() || !(factor->get<double>() > 0) ||
        !(factor->get<double>() < 1e6)) {
      return cfg.Error(field, "has a 'factor' that is not a positive number below 1e6");
    }
    spec.rope_factor = factor->get<double>();
  }
  return absl::OkStatus();
}

// The attention layers' K/V shape: grouped-query heads, or MLA's one latent per token.
absl::StatusOr<AttentionShape> ReadAttention(const ConfigReader& cfg, int64_t num_heads,
                                             std::optional<int64_t> kv_heads, int64_t head_dim,
                                             bool any_sliding, int32_t chunk) {
  const bool is_mla = cfg.Has("kv_lora_rank");
  AttentionShape attention{Narrow(kv_heads.value_or(num_heads)), Narrow(head_dim),
                           Narrow(head_dim)};
  if (attention.num_kv_heads > num_heads) {
    return cfg.Error("num_key_value_heads",
                     absl::StrCat("(", attention.num_kv_heads,
                                  ") exceeds num_attention_heads (", num_heads, ")"));
  }
  // Grouped-query attention shares each KV head among the same number of query heads.
  if (num_heads % attention.num_kv_heads != 0) {
    return cfg.Error("num_key_value_heads",
                     absl::StrCat("(", attention.num_kv_heads,
                                  ") does not divide num_attention_heads (", num_heads, ")"));
  }
  if (is_mla) {
    if (chunk > 0) return cfg.Error("kv_lora_rank", "with attention_chunk_size is unsupported");
    if (any_sliding) return cfg.Error("kv_lora_rank", "with sliding-window layers is unsupported");
    KVPAGE_ASSIGN_OR_RETURN(int64_t rank, cfg.PositiveInt("kv_lora_rank"));
    KVPAGE_ASSIGN_OR_RETURN(int64_t rope, cfg.PositiveInt("qk_rope_head_dim"));
    attention = AttentionShape{1, Narrow(rank + rope), 0};
  }
  return attention;
}

// DeepSeek-V3.2's lightning indexer: its key size goes into the MLA layers' shape, its heads
// and top-k into the spec. A config names all three fields or none, and only beside MLA.
absl::Status ReadIndexer(const ConfigReader& cfg, AttentionShape& attention, ModelSpec& spec) {
  constexpr const char* kFields[] = {"index_head_dim", "index_n_heads", "index_topk"};
  const char* present = nullptr;
  for (const char* field : kFields) {
    if (cfg.Has(field)) present = field;
  }
  if (present == nullptr) return absl::OkStatus();
  if (!cfg.Has("kv_lora_rank")) {
    return cfg.Error(present, "marks a sparse-attention indexer, which kvpage reads only beside "
                              "MLA (kv_lora_rank)");
  }
  int64_t values[3] = {0, 0, 0};
  for (int i = 0; i < 3; ++i) {
    KVPAGE_ASSIGN_OR_RETURN(values[i], cfg.PositiveInt(kFields[i]));
    if (values[i] > std::numeric_limits<int32_t>::max()) {
      return cfg.Error(kFields[i], absl::StrCat("(", values[i], ") is too large"));
    }
  }
  attention.index_head_dim = Narrow(values[0]);
  spec.index_n_heads = Narrow(values[1]);
  spec.index_topk = Narrow(values[2]);
  return absl::OkStatus();
}

// One LayerSpec per layer kind: full attention is MLA when the config has a latent, and each
// layer takes from `shapes` the fields its kind uses.
std::vector<LayerSpec> BuildLayers(const std::vector<LayerKind>& kinds, bool is_mla,
                                   const LayerSpec& shapes) {
  std::vector<LayerSpec> layers;
  layers.reserve(kinds.size());
  for (LayerKind kind : kinds) {
    LayerSpec layer;
    layer.kind = (kind == LayerKind::kFullAttention && is_mla) ? LayerKind::kMla : kind;
    if (layer.IsAttention()) layer.attention = shapes.attention;
    if (kind == LayerKind::kSlidingWindow) layer.sliding_window = shapes.sliding_window;
    if (kind == LayerKind::kChunkedLocal) layer.attention_chunk_size = shapes.attention_chunk_size;
    if (kind == LayerKind::kLinearAttention) layer.linear = shapes.linear;
    layers.push_back(layer);
  }
  return layers;
}

// The Mamba-2 hybrid (mamba_hybrid.h) or other linear-attention hybrid (linear_hybrid.h) a
// config describes, if any: its layer kinds and recurrent state shape.
struct Hybrid {
  std::optional<internal::MambaHybrid> mamba;
  std::optional<internal::LinearHybrid> linear;

  bool has_value() const { return mamba.has_value() || linear.has_value(); }
  const std::vector<LayerKind>& kinds() const { return mamba ? mamba->kinds : linear->kinds; }
  const LinearStateShape& state() const { return mamba ? mamba->state : linear->state; }
};

absl::StatusOr<Hybrid> ReadHybrid(const ConfigReader& cfg, int64_t num_layers, DType dtype) {
  Hybrid h;
  KVPAGE_ASSIGN_OR_RETURN(h.mamba, internal::ReadMambaHybrid(cfg, num_layers, dtype));
  if (h.mamba.has_value()) return h;
  KVPAGE_ASSIGN_OR_RETURN(h.linear, internal::ReadLinearHybrid(cfg, num_layers, dtype));
  return h;
}

absl::StatusOr<internal::ParamCounts> CountHybridOrPlain(const ConfigReader& cfg,
                                                         const Hybrid& hybrid,
                                                         const ModelSpec& spec) {
  if (hybrid.mamba.has_value()) {
    return internal::CountMambaHybridParameters(cfg, spec, *hybrid.mamba);
  }
  if (hybrid.linear.has_value()) {
    return internal::CountLinearHybridParameters(cfg, spec, *hybrid.linear);
  }
  return internal::CountParameters(cfg, spec);
}

// Parameter counts and weight bytes, routed experts apart.
absl::Status ReadWeights(const ConfigReader& cfg, const Hybrid& hybrid, ModelSpec& spec) {
  KVPAGE_ASSIGN_OR_RETURN(internal::ParamCounts counts, CountHybridOrPlain(cfg, hybrid, spec));
  spec.num_params = counts.total;
  KVPAGE_ASSIGN_OR_RETURN(spec.weight_bytes, internal::WeightBytes(cfg, counts, spec.dtype));
  spec.num_embedding_params = counts.embeddings;
  if (counts.routed_experts > 0) {
    KVPAGE_RETURN_IF_ERROR(ReadExperts(cfg, &spec));
    spec.routed_expert_params = counts.routed_experts;
    internal::ParamCounts rest = counts;  // the same model without its routed experts
    rest.total -= counts.routed_experts;
    rest.routed_experts = 0;
    KVPAGE_ASSIGN_OR_RETURN(int64_t rest_bytes, internal::WeightBytes(cfg, rest, spec.dtype));
    spec.routed_expert_weight_bytes = spec.weight_bytes - rest_bytes;
  }
  return absl::OkStatus();
}

// The MLP widths the vllm policy's activation estimate reads: intermediate_size, and for MoE
// models moe_intermediate_size (Mixtral and gpt-oss name the expert width intermediate_size).
absl::Status ReadMlpWidths(const ConfigReader& cfg, ModelSpec& spec) {
  KVPAGE_ASSIGN_OR_RETURN(const std::optional<int64_t> dense,
                          cfg.OptionalPositiveInt("intermediate_size"));
  KVPAGE_ASSIGN_OR_RETURN(const std::optional<int64_t> expert,
                          cfg.OptionalPositiveInt("moe_intermediate_size"));
  spec.intermediate_size = dense.value_or(0);
  if (spec.num_experts > 0) spec.moe_intermediate_size = expert.value_or(spec.intermediate_size);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelSpec> ParseModelSpec(absl::string_view json_text, absl::string_view name,
                                         absl::string_view source) {
  KVPAGE_ASSIGN_OR_RETURN(ConfigReader cfg, ConfigReader::Parse(json_text, source));
  ModelSpec spec;
  spec.name = std::string(name);
  spec.source = std::string(source);
  KVPAGE_ASSIGN_OR_RETURN(std::optional<std::string> model_type,
                          cfg.OptionalString("model_type"));
  spec.model_type = model_type.value_or("");
  KVPAGE_RETURN_IF_ERROR(internal::RefuseUnreadLayouts(cfg));
  KVPAGE_ASSIGN_OR_RETURN(spec.dtype, ReadModelDType(cfg));

  KVPAGE_ASSIGN_OR_RETURN(int64_t num_layers, cfg.PositiveInt("num_hidden_layers"));
  KVPAGE_ASSIGN_OR_RETURN(int64_t hidden, cfg.PositiveInt("hidden_size"));
  KVPAGE_ASSIGN_OR_RETURN(int64_t num_heads, cfg.PositiveInt("num_attention_heads"));
  KVPAGE_ASSIGN_OR_RETURN(std::optional<int64_t> kv_heads,
                          cfg.OptionalPositiveInt("num_key_value_heads"));
  KVPAGE_ASSIGN_OR_RETURN(std::optional<int64_t> head_dim, cfg.OptionalPositiveInt("head_dim"));
  KVPAGE_ASSIGN_OR_RETURN(spec.vocab_size, cfg.PositiveInt("vocab_size"));
  KVPAGE_ASSIGN_OR_RETURN(spec.max_position_embeddings, ReadMaxPositions(cfg, spec.model_type));
  KVPAGE_RETURN_IF_ERROR(ReadRopeScaling(cfg, spec));
  KVPAGE_ASSIGN_OR_RETURN(spec.model_max_length, cfg.NonNegativeIntOr("model_max_length", 0));
  if (num_layers > 100000) return cfg.Error("num_hidden_layers", "is implausibly large");
  if (!head_dim.has_value()) {
    if (hidden % num_heads != 0) {
      return cfg.Error("head_dim", absl::StrCat("is missing and hidden_size ", hidden,
                                                " is not divisible by num_attention_heads ",
                                                num_heads));
    }
    head_dim = hidden / num_heads;
  }
  spec.hidden_size = Narrow(hidden);
  spec.num_attention_heads = Narrow(num_heads);

  // Mamba-2 hybrids (Nemotron-H, Granite 4.0-H) list only their cache-holding layers.
  KVPAGE_ASSIGN_OR_RETURN(const Hybrid hybrid, ReadHybrid(cfg, num_layers, spec.dtype));
  std::vector<LayerKind> kinds;
  if (hybrid.has_value()) {
    kinds = hybrid.kinds();
  } else {
    KVPAGE_ASSIGN_OR_RETURN(kinds, ReadLayerKinds(cfg, num_layers));
  }
  KVPAGE_ASSIGN_OR_RETURN(const int32_t chunk, ApplyChunkedLocal(cfg, kinds));
  bool any_sliding = false, any_linear = false;
  for (LayerKind k : kinds) {
    any_sliding |= k == LayerKind::kSlidingWindow;
    any_linear |= k == LayerKind::kLinearAttention;
  }
  const bool is_mla = cfg.Has("kv_lora_rank");

  KVPAGE_ASSIGN_OR_RETURN(AttentionShape attention,
                          ReadAttention(cfg, num_heads, kv_heads, *head_dim, any_sliding, chunk));
  KVPAGE_RETURN_IF_ERROR(ReadIndexer(cfg, attention, spec));
  int32_t window = 0;
  if (any_sliding) {
    KVPAGE_ASSIGN_OR_RETURN(int64_t w, cfg.PositiveInt("sliding_window"));
    window = Narrow(w);
  }
  LinearStateShape linear;
  if (hybrid.has_value()) {
    linear = hybrid.state();
  } else if (any_linear) {
    KVPAGE_ASSIGN_OR_RETURN(linear, ReadLinearShape(cfg, spec.dtype));
  }

  LayerSpec shapes;  // the shapes every layer of a kind shares
  shapes.attention = attention;
  shapes.sliding_window = window;
  shapes.attention_chunk_size = chunk;
  shapes.linear = linear;
  spec.layers = BuildLayers(kinds, is_mla, shapes);
  spec.groups = GroupLayers(spec.layers);
  KVPAGE_RETURN_IF_ERROR(ReadWeights(cfg, hybrid, spec));
  KVPAGE_RETURN_IF_ERROR(ReadMlpWidths(cfg, spec));
  return spec;
}

absl::StatusOr<ModelSpec> LoadModelSpecFromFile(const std::string& path) {
  std::error_code ec;
  std::ifstream in(path);
  if (!std::filesystem::is_regular_file(path, ec) || !in) {
    return absl::NotFoundError(absl::StrCat("cannot read model config '", path, "'"));
  }
  std::stringstream text;
  text << in.rdbuf();
  std::string name = path;
  if (size_t slash = name.find_last_of('/'); slash != std::string::npos) name.erase(0, slash + 1);
  if (name.size() > 5 && name.ends_with(".json")) name.resize(name.size() - 5);
  if (name == "config") {  // a Hugging Face snapshot: name it after its directory
    std::string dir = path.substr(0, path.find_last_of('/'));
    if (size_t slash = dir.find_last_of('/'); slash != std::string::npos) dir.erase(0, slash + 1);
    if (!dir.empty() && dir != path) name = dir;
  }
  return ParseModelSpec(text.str(), name, path);
}

}  // namespace kvpage
