// HostMemoryBacking's views (memory/tensor_view_of.h computes them).
#include "absl/strings/str_cat.h"
#include "internal/status_macros.h"
#include "kvpage/host_memory_backing.h"
#include "memory/chunk_units.h"
#include "memory/host_backing_state.h"
#include "memory/tensor_view_of.h"

namespace kvpage {

absl::StatusOr<const CacheTensor*> HostMemoryBacking::Tensor(GroupId group, int32_t layer,
                                                             CacheTensorKind kind) const {
  if (!state_->reserved) return absl::FailedPreconditionError("HostMemoryBacking not reserved");
  const CacheTensor* t = internal::FindTensor(state_->layout, group, layer, kind);
  if (t == nullptr) return internal::NoTensor(group, layer, kind);
  return t;
}

absl::StatusOr<TensorView> HostMemoryBacking::View(GroupId group, int32_t layer,
                                                   TensorPart part) const {
  KVPAGE_RETURN_IF_ERROR(internal::CheckTensorPart(part));
  KVPAGE_ASSIGN_OR_RETURN(const CacheTensor* t, Tensor(group, layer, internal::KindOf(part)));
  const size_t index = static_cast<size_t>(t - state_->layout.tensors.data());
  return internal::ViewOf(*t,
                          state_->ranges[index].base() +
                              internal::ViewOffset(t->block_bytes, state_->unit),
                          state_->layout.pools[t->pool].num_blocks(), part);
}

}  // namespace kvpage
