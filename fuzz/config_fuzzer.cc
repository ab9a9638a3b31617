// Fuzzes the config.json reader (ParseModelSpec): any text either parses into a model whose
// layers and groups agree, or is refused with a message. Nothing may crash, throw or hang.
#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "fuzz/fuzz_check.h"
#include "kvpage/model_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  const auto spec = kvpage::ParseModelSpec(text, "fuzz", "fuzz/config.json");
  if (!spec.ok()) {
    kvpage::fuzz::CheckError(spec.status());
    return 0;
  }
  // Every layer in exactly one group, groups in first-layer order, sizes positive.
  KVPAGE_FUZZ_CHECK(spec->num_layers() >= 1);
  KVPAGE_FUZZ_CHECK(!spec->groups.empty());
  int64_t grouped = 0;
  int32_t last_first = -1;
  for (const kvpage::LayerGroup& g : spec->groups) {
    KVPAGE_FUZZ_CHECK(g.num_layers() >= 1);
    KVPAGE_FUZZ_CHECK(g.layers.front() > last_first);
    last_first = g.layers.front();
    for (int32_t layer : g.layers) {
      KVPAGE_FUZZ_CHECK(layer >= 0 && layer < spec->num_layers());
      KVPAGE_FUZZ_CHECK(spec->layers[layer] == g.spec);
    }
    grouped += g.num_layers();
    if (g.spec.IsAttention()) {
      KVPAGE_FUZZ_CHECK(g.spec.attention.num_kv_heads > 0 && g.spec.attention.head_dim_k > 0);
      KVPAGE_FUZZ_CHECK(g.spec.attention.head_dim_v >= 0);
    }
    KVPAGE_FUZZ_CHECK((g.spec.kind == kvpage::LayerKind::kSlidingWindow) ==
                      (g.spec.sliding_window > 0));
  }
  KVPAGE_FUZZ_CHECK(grouped == spec->num_layers());
  KVPAGE_FUZZ_CHECK(spec->max_position_embeddings > 0);
  return 0;
}
