// Byte sizing of the KV cache that every layer above the model shares: the block manager, the
// scheduler's tables and the planner's policies (internal).
#ifndef KVPAGE_MODEL_KV_SIZING_H_
#define KVPAGE_MODEL_KV_SIZING_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "kvpage/dtype.h"
#include "kvpage/model_spec.h"

namespace kvpage::internal {

// REQUIRES: a >= 0, b > 0.
inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline int64_t RoundUp(int64_t a, int64_t b) { return CeilDiv(a, b) * b; }

// K + V bytes of one token in one attention layer (MLA: the latent only). Fails as RowBytes
// does when a row is not a whole number of the dtype's blocks.
absl::StatusOr<int64_t> AttentionTokenBytes(const AttentionShape& shape, DType dtype);

// Values of the indexer key that share one fp32 scale.
inline constexpr int64_t kIndexKeyQuantBlock = 128;

// Bytes of one token's lightning-indexer key (DeepSeek-V3.2) in one layer, 0 without an
// indexer: fp8 values plus one fp32 scale per kIndexKeyQuantBlock of them, whatever the KV
// cache dtype (vLLM's DeepseekV32IndexerCache: head_dim + head_dim // 128 · 4 = 132 bytes for
// 128 values, vllm/model_executor/models/deepseek_v2.py). Within a block the values of every
// token come first, then their scales (the paged layout DeepGEMM reads; vLLM's
// v1/attention/ops/rocm_aiter_mla_sparse.py splits a block at block_size · head_dim).
inline int64_t IndexKeyTokenBytes(const AttentionShape& shape) {
  const int64_t d = shape.index_head_dim;
  return d + d / kIndexKeyQuantBlock * 4;
}

// Every byte one token occupies in one attention layer: AttentionTokenBytes plus the indexer
// key.
absl::StatusOr<int64_t> CacheTokenBytes(const AttentionShape& shape, DType dtype);

}  // namespace kvpage::internal

#endif  // KVPAGE_MODEL_KV_SIZING_H_
