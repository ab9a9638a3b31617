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

}  // namespace kvpage::internal

#endif  // KVPAGE_MODEL_KV_SIZING_H_
