// The views of a layer's K, V, latent and state tensors (shapes in host_memory_backing.h),
// shared by the host and CUDA backings.
#include "memory/tensor_view_of.h"

#include "absl/strings/str_cat.h"

namespace kvpage {
namespace internal {

absl::Status CheckTensorPart(TensorPart part) {
  if (part <= TensorPart::kIndexKey) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("tensor part ", static_cast<int>(part), " is not a TensorPart"));
}

CacheTensorKind KindOf(TensorPart part) {
  switch (part) {
    case TensorPart::kKey:
    case TensorPart::kValue: return CacheTensorKind::kKv;
    case TensorPart::kLatent: return CacheTensorKind::kMlaLatent;
    case TensorPart::kConvState: return CacheTensorKind::kConvState;
    case TensorPart::kRecurrentState: return CacheTensorKind::kRecurrentState;
    case TensorPart::kIndexKey: return CacheTensorKind::kIndexKey;
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

TensorView ViewOf(const CacheTensor& t, char* base, int64_t num_blocks, TensorPart part) {
  const AttentionShape& a = t.attention;
  switch (part) {
    case TensorPart::kKey:
      return AttentionView(base, t, num_blocks, a.num_kv_heads, a.head_dim_k);
    case TensorPart::kValue: {
      const int64_t k_row = a.KValuesPerToken() * BytesPerValue(t.dtype);
      return AttentionView(base + k_row * t.block_size, t, num_blocks, a.num_kv_heads,
                           a.head_dim_v);
    }
    case TensorPart::kLatent:
      return AttentionView(base, t, num_blocks, 1, a.head_dim_k);
    case TensorPart::kConvState:
    case TensorPart::kRecurrentState:
      return StateView(base, t, num_blocks);
    case TensorPart::kIndexKey:  // values then scales per block: the kernel splits the bytes
      return TensorView{.base = base,
                        .dtype = t.dtype,
                        .shape = {num_blocks, t.block_bytes},
                        .byte_strides = {t.block_bytes, 1}};
  }
  return TensorView{};
}

const CacheTensor* FindTensor(const MemoryLayout& layout, GroupId group, int32_t layer,
                              CacheTensorKind kind) {
  for (const CacheTensor& t : layout.tensors) {
    if (t.group == group && t.layer == layer && t.kind == kind) return &t;
  }
  return nullptr;
}

absl::Status NoTensor(GroupId group, int32_t layer, CacheTensorKind kind) {
  return absl::NotFoundError(absl::StrCat("no ", CacheTensorKindName(kind), " tensor for layer ",
                                          layer, " in group ", group.value));
}

}  // namespace internal

}  // namespace kvpage
