#include "model/kv_sizing.h"

#include "internal/status_macros.h"

namespace kvpage::internal {

absl::StatusOr<int64_t> AttentionTokenBytes(const AttentionShape& shape, DType dtype) {
  KVPAGE_ASSIGN_OR_RETURN(int64_t k, RowBytes(dtype, shape.KValuesPerToken()));
  KVPAGE_ASSIGN_OR_RETURN(int64_t v, RowBytes(dtype, shape.VValuesPerToken()));
  return k + v;
}

absl::StatusOr<int64_t> CacheTokenBytes(const AttentionShape& shape, DType dtype) {
  KVPAGE_ASSIGN_OR_RETURN(int64_t kv, AttentionTokenBytes(shape, dtype));
  return kv + IndexKeyTokenBytes(shape);
}

}  // namespace kvpage::internal
