#include "model/unread_layouts.h"

#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace kvpage::internal {
namespace {

// A field whose presence announces a layout kvpage does not read, and the architecture.
struct Marker {
  absl::string_view field;
  absl::string_view architecture;
  absl::string_view what;
};

constexpr Marker kMarkers[] = {
    {"compress_ratios", "DeepSeek-V4 compressed attention",
     "keeps compressed and sliding-window caches per layer"},
    {"index_topk_freq", "GLM-5.2 shared sparse-attention indexers",
     "keeps an indexer key cache in only some layers"},
    {"indexer_types", "GLM-5.2 shared sparse-attention indexers",
     "keeps an indexer key cache in only some layers"},
    {"index_kpool", "pooled sparse-attention indexer keys", "compresses the indexer key cache"},
    {"ssm_cfg", "a Mamba state-space model", "keeps a recurrent state"},
};

// model_type values of recurrent or hybrid models whose configs carry none of the fields above.
constexpr absl::string_view kRecurrentTypes[] = {
    "mamba", "mamba2", "falcon_mamba", "bamba", "zamba", "zamba2", "rwkv", "rwkv5", "rwkv6",
    "rwkv7", "xlstm", "lfm2", "plamo2", "deepseek_v4",
};

// Hybrid model types kvpage reads (linear_hybrid.h) from the field that lays out their layers;
// without it every layer would be planned as attention.
struct LayoutField {
  absl::string_view model_type;
  absl::string_view field;
};
constexpr LayoutField kLayoutFields[] = {
    {"jamba", "attn_layer_period"},
    {"minimax", "attn_type_list"},
    {"minimax_m1", "attn_type_list"},
    {"kimi_linear", "linear_attn_config"},
};

constexpr absl::string_view kHint =
    "; kvpage reads full, sliding-window, chunked-local, MLA (with DeepSeek-V3.2's indexer "
    "keys), Gated DeltaNet, Mamba-2 (Nemotron-H, Granite 4.0-H, Falcon-H1), Mamba-1 (Jamba), "
    "lightning (MiniMax) and KDA (Kimi Linear) layers";

}  // namespace

absl::Status RefuseUnreadLayouts(const ConfigReader& cfg) {
  for (const Marker& m : kMarkers) {
    if (cfg.Has(m.field)) {
      return cfg.Error(m.field, absl::StrCat("marks ", m.architecture, ", which ", m.what,
                                             ": not supported yet", kHint));
    }
  }
  absl::StatusOr<std::optional<std::string>> type = cfg.OptionalString("model_type");
  if (!type.ok() || !type->has_value()) return absl::OkStatus();
  for (const LayoutField& l : kLayoutFields) {
    if (**type == l.model_type && !cfg.Has(l.field)) {
      return cfg.Error(l.field, absl::StrCat("is missing; model_type '", l.model_type,
                                             "' needs it to place its linear-attention layers"));
    }
  }
  for (absl::string_view t : kRecurrentTypes) {
    if (**type == t) {
      return cfg.Error("model_type", absl::StrCat("'", t, "' has a cache layout not supported yet",
                                                  kHint));
    }
  }
  return absl::OkStatus();
}

}  // namespace kvpage::internal
