// The strided views of one cache tensor, whatever memory backs it (internal).
#ifndef KVPAGE_MEMORY_TENSOR_VIEW_OF_H_
#define KVPAGE_MEMORY_TENSOR_VIEW_OF_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kvpage/memory_layout.h"

namespace kvpage::internal {

// The tensor kind a part lives in (K and V: kKv).
CacheTensorKind KindOf(TensorPart part);
// InvalidArgument for a value (say a cast integer) that is not a TensorPart.
absl::Status CheckTensorPart(TensorPart part);
// The view of `part` of tensor t whose range starts at `base` and holds num_blocks ids.
// REQUIRES: KindOf(part) == t.kind.
TensorView ViewOf(const CacheTensor& t, char* base, int64_t num_blocks, TensorPart part);
// The tensor of a layer, or null.
const CacheTensor* FindTensor(const MemoryLayout& layout, GroupId group, int32_t layer,
                              CacheTensorKind kind);
// NotFound naming group, layer and kind.
absl::Status NoTensor(GroupId group, int32_t layer, CacheTensorKind kind);

}  // namespace kvpage::internal

#endif  // KVPAGE_MEMORY_TENSOR_VIEW_OF_H_
