// Validation and planning for the kernel layouts (kernel_layout.h).
#include "kvpage/kernel_layout.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"

namespace kvpage {
namespace {

constexpr int64_t kVectorBytes = 16;

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % kVectorBytes == 0; }

}  // namespace

int64_t VectorElements(DType dtype) { return kVectorBytes / BytesPerValue(dtype); }

KvCacheView BlocksFirstKvCache(void* base, int32_t num_blocks, int32_t block_size,
                               int32_t num_kv_heads, int32_t head_dim, DType dtype) {
  KvCacheView view;
  view.base = base;
  view.head_stride = head_dim;
  view.token_stride = static_cast<int64_t>(num_kv_heads) * head_dim;
  view.kv_stride = view.token_stride * block_size;
  view.block_stride = 2 * view.kv_stride;
  view.num_blocks = num_blocks;
  view.block_size = block_size;
  view.num_kv_heads = num_kv_heads;
  view.head_dim = head_dim;
  view.dtype = dtype;
  return view;
}

KvCacheView MlaKvCache(void* base, int32_t num_blocks, int32_t block_size, int32_t row_dim,
                       DType dtype) {
  KvCacheView view;
  view.base = base;
  view.head_stride = row_dim;
  view.token_stride = row_dim;
  view.kv_stride = 0;
  view.block_stride = static_cast<int64_t>(row_dim) * block_size;
  view.num_blocks = num_blocks;
  view.block_size = block_size;
  view.num_kv_heads = 1;
  view.head_dim = row_dim;
  view.dtype = dtype;
  return view;
}

absl::Status ValidateKvCacheView(const KvCacheView& c) {
  if (c.dtype != DType::kBF16 && c.dtype != DType::kF16 && c.dtype != DType::kFP8) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvCacheView: dtype ", DTypeName(c.dtype), " is not f16, bf16 or fp8"));
  }
  const int64_t vec = VectorElements(c.dtype);
  if (c.base == nullptr) return absl::InvalidArgumentError("KvCacheView: base is null");
  if (!Aligned16(c.base)) {
    return absl::InvalidArgumentError("KvCacheView: base is not 16-byte aligned");
  }
  if (c.num_blocks <= 0 || c.block_size <= 0 || c.num_kv_heads <= 0 || c.head_dim <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KvCacheView: sizes must be positive (num_blocks ", c.num_blocks, ", block_size ",
        c.block_size, ", num_kv_heads ", c.num_kv_heads, ", head_dim ", c.head_dim, ")"));
  }
  if (c.head_dim % vec != 0) {
    return absl::InvalidArgumentError(absl::StrCat("KvCacheView: head_dim ", c.head_dim,
                                                   " is not a multiple of ", vec));
  }
  const int64_t strides[] = {c.block_stride, c.kv_stride, c.token_stride, c.head_stride};
  const char* names[] = {"block_stride", "kv_stride", "token_stride", "head_stride"};
  for (int i = 0; i < 4; ++i) {
    if (strides[i] < 0 || strides[i] % vec != 0) {
      return absl::InvalidArgumentError(absl::StrCat("KvCacheView: ", names[i], " ", strides[i],
                                                     " is not a non-negative multiple of ", vec));
    }
  }
  if (c.num_kv_heads > 1 && c.head_stride < c.head_dim) {
    return absl::InvalidArgumentError(absl::StrCat("KvCacheView: head_stride ", c.head_stride,
                                                   " is below head_dim ", c.head_dim));
  }
  return absl::OkStatus();
}

int64_t ContiguousBlockBytes(const KvCacheView& c) {
  const int64_t row = static_cast<int64_t>(c.num_kv_heads) * c.head_dim;
  if (c.head_stride != c.head_dim || c.token_stride != row) return 0;
  const int64_t half = row * c.block_size;
  int64_t elements = 0;
  if (c.kv_stride == 0) {
    elements = half;  // MLA: one latent row per token
  } else if (c.kv_stride == half) {
    elements = 2 * half;
  } else {
    return 0;
  }
  return elements * BytesPerValue(c.dtype);
}

absl::Status ValidateWriteKvFp8(const KvCacheView& cache, DType input_dtype, float k_scale,
                                float v_scale) {
  absl::Status status = ValidateKvCacheView(cache);
  if (!status.ok()) return status;
  if (cache.dtype != DType::kFP8) {
    return absl::InvalidArgumentError(
        absl::StrCat("WriteKvFp8: cache dtype ", DTypeName(cache.dtype), " is not fp8"));
  }
  if (input_dtype != DType::kBF16 && input_dtype != DType::kF16) {
    return absl::InvalidArgumentError(absl::StrCat("WriteKvFp8: input dtype ",
                                                   DTypeName(input_dtype), " is not f16/bf16"));
  }
  for (float scale : {k_scale, v_scale}) {
    if (!(scale > 0.0f) || std::isinf(scale)) {
      return absl::InvalidArgumentError(
          absl::StrCat("WriteKvFp8: scale ", scale, " is not a positive finite number"));
    }
  }
  return absl::OkStatus();
}

DType DecodeQueryDType(const KvCacheView& cache, const DecodeParams& params) {
  return cache.dtype == DType::kFP8 ? params.fp8_query_dtype : cache.dtype;
}

absl::Status ValidateDecodeParams(const KvCacheView& cache, const DecodeParams& params,
                                  const char* what) {
  const int32_t hq = params.num_q_heads;
  if (hq <= 0 || cache.num_kv_heads <= 0 || hq % cache.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": num_q_heads ", hq,
                                                   " is not a positive multiple of num_kv_heads ",
                                                   cache.num_kv_heads));
  }
  if (cache.dtype != DType::kFP8) {
    if (params.k_scale != 1.0f || params.v_scale != 1.0f) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": k_scale ", params.k_scale, " / v_scale ", params.v_scale, " for a ",
          DTypeName(cache.dtype), " cache (scales apply to fp8 caches only; must be 1)"));
    }
    return absl::OkStatus();
  }
  if (params.fp8_query_dtype != DType::kBF16 && params.fp8_query_dtype != DType::kF16) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": fp8_query_dtype ", DTypeName(params.fp8_query_dtype), " is not f16/bf16"));
  }
  for (float scale : {params.k_scale, params.v_scale}) {
    if (!(scale > 0.0f) || std::isinf(scale)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": scale ", scale, " is not a positive finite number"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateWriteKvArgs(const void* k, const void* v, const int64_t* slot_mapping,
                                 int32_t num_tokens, const KvCacheView& cache, const char* what) {
  if (num_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": num_tokens ", num_tokens, " < 0"));
  }
  if (k == nullptr || slot_mapping == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": k or slot_mapping is null"));
  }
  if (v == nullptr && cache.kv_stride != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": v is null but the view has a V half (kv_stride ", cache.kv_stride, ")"));
  }
  if (v != nullptr && cache.kv_stride == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": v is given but the view has no V half (kv_stride 0, an MLA latent row)"));
  }
  return absl::OkStatus();
}

absl::Status PlanDecode(const DecodePlanInputs& in, DecodePlan* plan) {
  const int32_t counts[] = {in.num_seqs,   in.num_kv_heads, in.head_tiles,       in.block_size,
                            in.num_sms,    in.ctas_per_sm,  in.min_chunk_tokens, in.max_splits};
  const char* names[] = {"num_seqs", "num_kv_heads", "head_tiles",       "block_size",
                         "num_sms",  "ctas_per_sm",  "min_chunk_tokens", "max_splits"};
  for (int i = 0; i < 8; ++i) {
    if (counts[i] <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("PlanDecode: ", names[i], " ", counts[i], " must be positive"));
    }
  }
  if (in.max_attended_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PlanDecode: max_attended_tokens ", in.max_attended_tokens, " is negative"));
  }
  const int64_t bs = in.block_size;
  const int64_t max_tokens = std::max<int64_t>(in.max_attended_tokens, 1);
  const int64_t ctas = static_cast<int64_t>(in.num_seqs) * in.num_kv_heads * in.head_tiles;
  const int64_t wave = static_cast<int64_t>(in.num_sms) * in.ctas_per_sm;
  // As many splits as fit the grid in one wave: a partial second wave would leave most SMs
  // idle while it runs.
  const int64_t splits_in_wave = std::max<int64_t>(wave / ctas, 1);
  const int64_t min_chunk = (in.min_chunk_tokens + bs - 1) / bs * bs;
  int64_t splits = std::min<int64_t>(splits_in_wave, (max_tokens + min_chunk - 1) / min_chunk);
  splits = std::clamp<int64_t>(splits, 1, in.max_splits);
  // Chunks are whole blocks; recount the splits the rounded chunk actually needs.
  int64_t chunk = (max_tokens + splits - 1) / splits;
  chunk = (chunk + bs - 1) / bs * bs;
  splits = (max_tokens + chunk - 1) / chunk;
  plan->num_splits = static_cast<int32_t>(splits);
  plan->chunk_tokens = static_cast<int32_t>(chunk);
  plan->use_tensor_cores = in.tensor_cores;
  plan->force_cuda_cores = in.force_cuda_cores;
  return absl::OkStatus();
}

int32_t Sm90CtasPerSm(int32_t registers_per_thread, int32_t threads_per_cta,
                      int32_t shared_bytes_per_cta) {
  constexpr int32_t kRegistersPerSm = 65536, kMaxRegistersPerThread = 255;
  constexpr int32_t kWarpsPerSm = 64, kCtasPerSm = 32, kMaxThreadsPerCta = 1024;
  constexpr int32_t kSharedPerSm = 233472, kMaxSharedPerCta = 232448;
  constexpr int32_t kSharedReservedPerCta = 1024, kSharedUnit = 128, kRegisterUnit = 256;
  if (registers_per_thread > kMaxRegistersPerThread || threads_per_cta > kMaxThreadsPerCta ||
      shared_bytes_per_cta > kMaxSharedPerCta) {
    return 0;
  }
  const int32_t warps = (threads_per_cta + 31) / 32;
  const int32_t warp_registers =
      (registers_per_thread * 32 + kRegisterUnit - 1) / kRegisterUnit * kRegisterUnit;
  const int32_t by_registers = kRegistersPerSm / warp_registers / warps;
  const int32_t by_warps = kWarpsPerSm / warps;
  const int32_t shared = (shared_bytes_per_cta + kSharedReservedPerCta + kSharedUnit - 1) /
                         kSharedUnit * kSharedUnit;
  const int32_t by_shared = kSharedPerSm / shared;
  return std::min({by_registers, by_warps, by_shared, kCtasPerSm});
}

absl::Status ValidateSlotTensor(const SlotTensor& t, int64_t index) {
  const std::string where = absl::StrCat("SlotTensor ", index, ": ");
  if (t.base == nullptr) return absl::InvalidArgumentError(where + "base is null");
  if (!Aligned16(t.base)) return absl::InvalidArgumentError(where + "base is not 16-byte aligned");
  if (t.copy_bytes <= 0 || t.copy_bytes % kVectorBytes != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "copy_bytes ", t.copy_bytes, " is not a positive multiple of 16"));
  }
  if (t.slot_stride_bytes % kVectorBytes != 0 || t.slot_stride_bytes < t.copy_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "slot_stride_bytes ", t.slot_stride_bytes,
                     " is not a multiple of 16 at least copy_bytes ", t.copy_bytes));
  }
  if (t.num_slots <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "num_slots ", t.num_slots, " must be positive"));
  }
  return absl::OkStatus();
}

absl::Status KvBlockSlotTensor(const KvCacheView& cache, SlotTensor* out) {
  absl::Status status = ValidateKvCacheView(cache);
  if (!status.ok()) return status;
  const int64_t bytes = ContiguousBlockBytes(cache);
  if (bytes == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KvBlockSlotTensor: block is not contiguous (kv_stride ", cache.kv_stride,
        ", token_stride ", cache.token_stride, ", head_stride ", cache.head_stride, ")"));
  }
  out->base = cache.base;
  out->slot_stride_bytes = cache.block_stride * BytesPerValue(cache.dtype);
  out->copy_bytes = bytes;
  out->num_slots = cache.num_blocks;
  return ValidateSlotTensor(*out, 0);
}

}  // namespace kvpage
