// Parameter count of a model's language part, from its config.json shapes.
#ifndef KVPAGE_MODEL_PARAM_COUNT_H_
#define KVPAGE_MODEL_PARAM_COUNT_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "kvpage/model_spec.h"
#include "model/config_reader.h"

namespace kvpage::internal {

// Counts embeddings, LM head (unless tied), per-layer norms, attention projections (GQA, MLA,
// gated attention of Qwen3-Next/Qwen3.5), Gated DeltaNet projections and conv, dense MLPs and
// MoE experts with shared experts and routers. Vision towers and MTP / next-token-prediction
// layers are not counted: they are not resident in the decode path the planner sizes.
// `spec.layers` must already be filled in. Errors name the missing field.
absl::StatusOr<int64_t> CountParameters(const ConfigReader& cfg, const ModelSpec& spec);

}  // namespace kvpage::internal

#endif  // KVPAGE_MODEL_PARAM_COUNT_H_
