// What one GPU holds when a model is split over `tp` GPUs by tensor parallelism, following
// vLLM's rules (vLLM 0.33):
//   * query heads: num_attention_heads / tp; tp must divide them (ModelConfig.
//     verify_with_parallel_config refuses other sizes);
//   * KV heads of full and sliding-window attention: num_kv_heads / tp when tp divides them,
//     else — when num_kv_heads < tp and divides tp — one head per GPU, each replicated on
//     tp / num_kv_heads GPUs (ModelConfig.get_num_kv_heads: max(1, total // tp); the QKV
//     projection asserts one of the two divisions is exact);
//   * MLA: the compressed latent is not split; every GPU holds all of it (get_num_kv_heads
//     returns 1 for MLA whatever tp is);
//   * linear attention (Gated DeltaNet): key and value heads split by tp, so the conv and
//     recurrent states shrink by tp (MambaStateShapeCalculator.gated_delta_net_state_shape
//     divides conv_dim and num_v_heads by tp, both exactly);
//   * weights: weight_bytes / tp, rounded up (norms and other replicated vectors are ignored).
//
// All functions are pure and thread-safe.
#ifndef KVPAGE_TENSOR_PARALLEL_H_
#define KVPAGE_TENSOR_PARALLEL_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvpage/model_spec.h"

namespace kvpage {

// The largest tensor-parallel degree accepted anywhere.
inline constexpr int32_t kMaxTensorParallel = 1024;

// KV heads one GPU holds for an attention layer with `num_kv_heads` heads: max(1, heads / tp).
// REQUIRES: num_kv_heads >= 1, tp >= 1.
int32_t KvHeadsPerGpu(int32_t num_kv_heads, int32_t tp);

// OK when `model` can be split over `tp` GPUs under the rules above. InvalidArgument naming
// tp, the model and the heads that do not divide otherwise (tp outside [1, kMaxTensorParallel],
// query heads, KV heads, linear-attention key or value heads).
absl::Status CheckTensorParallel(const ModelSpec& model, int32_t tp);

// The model as one of the `tp` GPUs holds it: every LayerSpec with its per-GPU heads (layer
// groups unchanged), num_attention_heads / tp, weight_bytes and routed_expert_weight_bytes
// divided by tp (rounded up). Parameter counts, hidden size and vocabulary stay the whole
// model's. tp == 1 returns an equal copy. Errors: those of CheckTensorParallel.
absl::StatusOr<ModelSpec> ShardForTensorParallel(const ModelSpec& model, int32_t tp);

// The least factor by which splitting over `tp` GPUs shrinks any layer group's cache: for a
// group, whole-model bytes per token (or per state) / one GPU's bytes. tp for KV heads that
// tp divides, num_kv_heads when they are replicated, 1 for MLA, tp for linear attention.
// A KV budget of B bytes on every GPU holds at least what a whole-model cache of
// B × factor bytes holds; exactly that when every group shrinks by the same factor.
// REQUIRES: CheckTensorParallel(model, tp).ok().
int32_t TensorParallelCacheFactor(const ModelSpec& model, int32_t tp);

}  // namespace kvpage

#endif  // KVPAGE_TENSOR_PARALLEL_H_
