// HostMemoryBacking's views: where each layer's K, V, latent and state tensors live and how
// they are strided (the shapes are listed in host_memory_backing.h).
#include "absl/strings/str_cat.h"
#include "internal/status_macros.h"
#include "kvpage/host_memory_backing.h"
#include "memory/host_backing_state.h"

namespace kvpage {
namespace {

CacheTensorKind KindOf(TensorPart part) {
  switch (part) {
    case TensorPart::kKey:
    case TensorPart::kValue: return CacheTensorKind::kKv;
    case TensorPart::kLatent: return CacheTensorKind::kMlaLatent;
    case TensorPart::kConvState: return CacheTensorKind::kConvState;
    case TensorPart::kRecurrentState: return CacheTensorKind::kRecurrentState;
  }
  return CacheTensorKind::kKv;
}

// [num_blocks, block_size, heads, head_dim] with the block stride of the whole K+V block.
// `head_dim` 0 means the row is the whole latent.
TensorView AttentionView(char* base, const CacheTensor& t, int64_t num_blocks, int32_t heads,
                         int32_t head_dim) {
  const int64_t value = BytesPerValue(t.dtype);
  return TensorView{.base = base,
                    .dtype = t.dtype,
                    .shape = {num_blocks, t.block_size, heads, head_dim},
                    .byte_strides = {t.block_bytes, int64_t{heads} * head_dim * value,
                                     int64_t{head_dim} * value, value}};
}

TensorView StateView(char* base, const CacheTensor& t, int64_t num_slots) {
  const int64_t value = BytesPerValue(t.dtype);
  const LinearStateShape& l = t.linear;
  if (t.kind == CacheTensorKind::kConvState) {
    const int64_t channels = 2 * int64_t{l.num_k_heads} * l.k_head_dim +
                             int64_t{l.num_v_heads} * l.v_head_dim;
    return TensorView{.base = base,
                      .dtype = t.dtype,
                      .shape = {num_slots, l.conv_kernel - 1, channels},
                      .byte_strides = {t.block_bytes, channels * value, value}};
  }
  return TensorView{
      .base = base,
      .dtype = t.dtype,
      .shape = {num_slots, l.num_v_heads, l.k_head_dim, l.v_head_dim},
      .byte_strides = {t.block_bytes, int64_t{l.k_head_dim} * l.v_head_dim * value,
                       int64_t{l.v_head_dim} * value, value}};
}

}  // namespace

absl::StatusOr<const CacheTensor*> HostMemoryBacking::Tensor(GroupId group, int32_t layer,
                                                             CacheTensorKind kind) const {
  if (!state_->reserved) return absl::FailedPreconditionError("HostMemoryBacking not reserved");
  for (const CacheTensor& t : state_->layout.tensors) {
    if (t.group == group && t.layer == layer && t.kind == kind) return &t;
  }
  return absl::NotFoundError(absl::StrCat("no ", CacheTensorKindName(kind), " tensor for layer ",
                                          layer, " in group ", group.value));
}

absl::StatusOr<TensorView> HostMemoryBacking::View(GroupId group, int32_t layer,
                                                   TensorPart part) const {
  KVPAGE_ASSIGN_OR_RETURN(const CacheTensor* t, Tensor(group, layer, KindOf(part)));
  const size_t index = static_cast<size_t>(t - state_->layout.tensors.data());
  char* base = state_->ranges[index].base();
  const int64_t n = state_->layout.pools[t->pool].num_blocks();
  const AttentionShape& a = t->attention;
  switch (part) {
    case TensorPart::kKey:
      return AttentionView(base, *t, n, a.num_kv_heads, a.head_dim_k);
    case TensorPart::kValue: {
      const int64_t k_row = a.KValuesPerToken() * BytesPerValue(t->dtype);
      return AttentionView(base + k_row * t->block_size, *t, n, a.num_kv_heads, a.head_dim_v);
    }
    case TensorPart::kLatent:
      return AttentionView(base, *t, n, 1, a.head_dim_k);
    case TensorPart::kConvState:
    case TensorPart::kRecurrentState:
      return StateView(base, *t, n);
  }
  return absl::InvalidArgumentError(absl::StrCat("TensorPart ", static_cast<int>(part)));
}

}  // namespace kvpage
