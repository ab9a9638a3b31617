#include "kvpage/tensor_parallel.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "internal/status_macros.h"

namespace kvpage {
namespace {

absl::Status NotDivisible(const ModelSpec& model, int32_t tp, absl::string_view what,
                          int64_t count) {
  return absl::InvalidArgumentError(
      absl::StrCat("tp ", tp, " does not divide ", model.name, "'s ", what, " (", count, ")"));
}

absl::Status CheckLayer(const ModelSpec& model, const LayerSpec& layer, int32_t tp) {
  if (layer.kind == LayerKind::kMla) return absl::OkStatus();  // latent replicated
  if (layer.kind == LayerKind::kLinearAttention) {
    if (layer.linear.num_k_heads % tp != 0) {
      return NotDivisible(model, tp, "linear-attention key heads", layer.linear.num_k_heads);
    }
    if (layer.linear.num_v_heads % tp != 0) {
      return NotDivisible(model, tp, "linear-attention value heads", layer.linear.num_v_heads);
    }
    return absl::OkStatus();
  }
  const int32_t kv = layer.attention.num_kv_heads;
  if (kv < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(model.name, " has an attention layer with ", kv, " KV heads"));
  }
  if (kv >= tp ? kv % tp != 0 : tp % kv != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tp ", tp, " and ", model.name, "'s ", kv,
        " KV heads do not divide one another (vLLM splits the heads when tp divides them and "
        "replicates them when they divide tp)"));
  }
  return absl::OkStatus();
}

int32_t LayerFactor(const LayerSpec& layer, int32_t tp) {
  switch (layer.kind) {
    case LayerKind::kMla: return 1;
    case LayerKind::kLinearAttention: return tp;
    case LayerKind::kFullAttention:
    case LayerKind::kSlidingWindow:
    case LayerKind::kChunkedLocal:
      return layer.attention.num_kv_heads / KvHeadsPerGpu(layer.attention.num_kv_heads, tp);
  }
  return 1;
}

}  // namespace

int32_t KvHeadsPerGpu(int32_t num_kv_heads, int32_t tp) {
  return std::max<int32_t>(1, num_kv_heads / tp);
}

absl::Status CheckTensorParallel(const ModelSpec& model, int32_t tp) {
  if (tp < 1 || tp > kMaxTensorParallel) {
    return absl::InvalidArgumentError(
        absl::StrCat("tp must be in [1, ", kMaxTensorParallel, "], got ", tp));
  }
  if (tp == 1) return absl::OkStatus();  // nothing is split
  if (model.num_attention_heads % tp != 0) {
    return NotDivisible(model, tp, "attention heads", model.num_attention_heads);
  }
  for (const LayerGroup& group : model.groups) {
    KVPAGE_RETURN_IF_ERROR(CheckLayer(model, group.spec, tp));
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelSpec> ShardForTensorParallel(const ModelSpec& model, int32_t tp) {
  KVPAGE_RETURN_IF_ERROR(CheckTensorParallel(model, tp));
  ModelSpec shard = model;
  if (tp == 1) return shard;
  auto split = [tp](LayerSpec& layer) {
    if (layer.kind == LayerKind::kLinearAttention) {
      layer.linear.num_k_heads /= tp;
      layer.linear.num_v_heads /= tp;
    } else if (layer.kind != LayerKind::kMla) {
      layer.attention.num_kv_heads = KvHeadsPerGpu(layer.attention.num_kv_heads, tp);
    }
  };
  for (LayerSpec& layer : shard.layers) split(layer);
  for (LayerGroup& group : shard.groups) split(group.spec);
  shard.num_attention_heads /= tp;
  shard.weight_bytes = (model.weight_bytes + tp - 1) / tp;
  shard.routed_expert_weight_bytes = (model.routed_expert_weight_bytes + tp - 1) / tp;
  return shard;
}

int32_t TensorParallelCacheFactor(const ModelSpec& model, int32_t tp) {
  int32_t factor = tp;
  for (const LayerGroup& group : model.groups) {
    factor = std::min(factor, LayerFactor(group.spec, tp));
  }
  return factor;
}

}  // namespace kvpage
