// write_kv: the step's K/V rows -> paged cache slots (include/kvpage/cuda/write_kv.h).
#include <cuda_runtime.h>

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda_status.h"
#include "kernels/vec.cuh"
#include "kvpage/cuda/write_kv.h"

namespace kvpage::cuda {
namespace {

constexpr int kThreads = 128;

struct WriteKvArgs {
  const uint4* k;  // viewed as 16-byte vectors of 8 elements
  const uint4* v;
  int64_t k_token_stride;  // in vectors
  int64_t v_token_stride;
  const int64_t* slot_mapping;
  uint4* cache;
  int64_t block_stride;  // in vectors
  int64_t kv_stride;
  int64_t token_stride;
  int64_t head_stride;
  int64_t num_slots;
  int32_t block_size;
  int32_t vecs_per_head;  // head_dim / 8
  int32_t vecs_per_token;  // num_kv_heads * head_dim / 8
};

// grid.x = token. Thread i copies vectors i, i + kThreads, ... of the token's H*D/8 vectors.
__global__ void __launch_bounds__(kThreads) WriteKvKernel(const WriteKvArgs a) {
  const int64_t token = blockIdx.x;
  const int64_t slot = a.slot_mapping[token];
  if (slot < 0 || slot >= a.num_slots) return;
  const int64_t block = slot / a.block_size;
  const int64_t offset = slot % a.block_size;
  uint4* dst = a.cache + block * a.block_stride + offset * a.token_stride;
  const uint4* k = a.k + token * a.k_token_stride;
  const uint4* v = a.v == nullptr ? nullptr : a.v + token * a.v_token_stride;
  for (int32_t i = threadIdx.x; i < a.vecs_per_token; i += kThreads) {
    const int32_t head = i / a.vecs_per_head;
    const int32_t j = i - head * a.vecs_per_head;
    const int64_t to = head * a.head_stride + j;
    const uint4 kv = __ldcs(k + i);  // read once: keep it out of L2's way
    if (v != nullptr) {
      const uint4 vv = __ldcs(v + i);
      dst[to + a.kv_stride] = vv;
    }
    dst[to] = kv;
  }
}

}  // namespace

absl::Status WriteKv(const void* k, const void* v, int64_t k_token_stride,
                     int64_t v_token_stride, const int64_t* slot_mapping, int32_t num_tokens,
                     const KvCacheView& cache, cudaStream_t stream) {
  absl::Status status = ValidateKvCacheView(cache);
  if (!status.ok()) return status;
  if (num_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat("WriteKv: num_tokens ", num_tokens, " < 0"));
  }
  if (k == nullptr || slot_mapping == nullptr) {
    return absl::InvalidArgumentError("WriteKv: k or slot_mapping is null");
  }
  if (v == nullptr && cache.kv_stride != 0) {
    return absl::InvalidArgumentError("WriteKv: v is null but the view has a V half");
  }
  if (reinterpret_cast<uintptr_t>(k) % 16 != 0 || reinterpret_cast<uintptr_t>(v) % 16 != 0) {
    return absl::InvalidArgumentError("WriteKv: k or v is not 16-byte aligned");
  }
  if (k_token_stride % 8 != 0 || v_token_stride % 8 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("WriteKv: token strides ", k_token_stride,
                                                   " / ", v_token_stride,
                                                   " are not multiples of 8 elements"));
  }
  if (num_tokens == 0) return absl::OkStatus();
  constexpr int64_t kVec = internal::kHalvesPerVec;
  WriteKvArgs a;
  a.k = static_cast<const uint4*>(k);
  a.v = static_cast<const uint4*>(v);
  a.k_token_stride = k_token_stride / kVec;
  a.v_token_stride = v_token_stride / kVec;
  a.slot_mapping = slot_mapping;
  a.cache = static_cast<uint4*>(cache.base);
  a.block_stride = cache.block_stride / kVec;
  a.kv_stride = cache.kv_stride / kVec;
  a.token_stride = cache.token_stride / kVec;
  a.head_stride = cache.head_stride / kVec;
  a.num_slots = static_cast<int64_t>(cache.num_blocks) * cache.block_size;
  a.block_size = cache.block_size;
  a.vecs_per_head = cache.head_dim / static_cast<int32_t>(kVec);
  a.vecs_per_token = cache.num_kv_heads * a.vecs_per_head;
  WriteKvKernel<<<num_tokens, kThreads, 0, stream>>>(a);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return internal::CudaStatus(err, "WriteKvKernel");
  return absl::OkStatus();
}

}  // namespace kvpage::cuda
