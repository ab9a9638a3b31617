// Parameter count of a model's language part, from its config.json shapes.
#ifndef KVPAGE_MODEL_PARAM_COUNT_H_
#define KVPAGE_MODEL_PARAM_COUNT_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "kvpage/model_spec.h"
#include "model/config_reader.h"

namespace kvpage::internal {

// Counts embeddings, LM head (unless tied), per-layer norms, attention projections (GQA, MLA,
// gated attention of Qwen3-Next/Qwen3.5), Gated DeltaNet projections and conv, dense MLPs and
// MoE experts with shared experts and routers. Vision towers and MTP / next-token-prediction
// layers are not counted: they are not resident in the decode path the planner sizes.
// `spec.layers` must already be filled in. Errors name the missing field.
struct ParamCounts {
  int64_t total = 0;
  int64_t routed_experts = 0;  // weight matrices of routed MoE experts (subset of total)
  int64_t embeddings = 0;      // input embeddings and LM head (subset of total)
};
absl::StatusOr<ParamCounts> CountParameters(const ConfigReader& cfg, const ModelSpec& spec);

// A count made twice: `count(0.0)` in floating point first, so that `count(int64_t{0})`, the
// exact one, cannot overflow int64 when every field is up to 2^31. `count(zero)` returns a
// StatusOr of a struct with `total`, `routed_experts` and `embeddings` of zero's type.
// InvalidArgument "<source>: <what> give an implausible N parameters (over 1e16)" otherwise.
template <typename CountFn>
absl::StatusOr<ParamCounts> CountWithoutOverflow(const ConfigReader& cfg, absl::string_view what,
                                                 CountFn count) {
  auto estimate = count(0.0);
  if (!estimate.ok()) return estimate.status();
  if (!(estimate->total < 1e16)) {
    return absl::InvalidArgumentError(absl::StrCat(cfg.source(), ": ", what,
                                                   " give an implausible ", estimate->total,
                                                   " parameters (over 1e16)"));
  }
  auto exact = count(int64_t{0});
  if (!exact.ok()) return exact.status();
  return ParamCounts{exact->total, exact->routed_experts, exact->embeddings};
}

// Bytes of the weights as published: the model dtype, except what `quantization_config`
// quantizes — "fp8" (DeepSeek-V3: every linear weight in 1 byte plus an f32 scale per 128×128
// block), "mxfp4" (gpt-oss: routed experts in 4.25 bits per weight) and "gptq"/"awq" (`bits`
// per linear weight plus an f16 scale and a packed zero point per `group_size` weights). Embeddings, LM head and
// norms stay in the model dtype. Unknown quantization methods are an error naming the method.
absl::StatusOr<int64_t> WeightBytes(const ConfigReader& cfg, const ParamCounts& counts,
                                    DType dtype);

}  // namespace kvpage::internal

#endif  // KVPAGE_MODEL_PARAM_COUNT_H_
