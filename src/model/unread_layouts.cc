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
    {"attn_layer_period", "Jamba", "interleaves Mamba layers kvpage does not place yet"},
    {"attn_type_list", "MiniMax lightning attention", "keeps a linear-attention state"},
    {"linear_attn_config", "Kimi Linear", "keeps a linear-attention state"},
    {"ssm_cfg", "a Mamba state-space model", "keeps a recurrent state"},
};

// model_type values of recurrent or hybrid models whose configs carry none of the fields above.
constexpr absl::string_view kRecurrentTypes[] = {
    "mamba", "mamba2", "falcon_mamba", "jamba", "bamba", "zamba", "zamba2",
    "rwkv", "rwkv5", "rwkv6", "rwkv7", "xlstm", "lfm2", "plamo2", "minimax", "minimax_m1",
    "kimi_linear", "deepseek_v4",
};

constexpr absl::string_view kHint =
    "; kvpage reads full, sliding-window, chunked-local, MLA (with DeepSeek-V3.2's indexer "
    "keys), Gated DeltaNet and Mamba-2 (Nemotron-H, Granite 4.0-H, Falcon-H1) layers";

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
  for (absl::string_view t : kRecurrentTypes) {
    if (**type == t) {
      return cfg.Error("model_type", absl::StrCat("'", t, "' has a cache layout not supported yet",
                                                  kHint));
    }
  }
  return absl::OkStatus();
}

}  // namespace kvpage::internal
