// write_kv kernel body: the step's K/V rows -> paged cache slots.
//
// Device code only; the launcher is in write_kv.cu. Kept in a header so the same source also
// compiles on the host against kernels/emulation/cuda_emulation.h (tests/kernels).
#ifndef KVPAGE_KERNELS_WRITE_KV_KERNEL_CUH_
#define KVPAGE_KERNELS_WRITE_KV_KERNEL_CUH_

#include <cstdint>

#include "kernels/vec.cuh"
#include "kvpage/kernel_layout.h"

namespace kvpage::cuda::internal {

constexpr int kWriteKvThreads = 128;

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

// grid.x = token. Thread i copies vectors i, i + kWriteKvThreads, ... of the token's H*D/8 vectors.
__global__ void __launch_bounds__(kWriteKvThreads) WriteKvKernel(const WriteKvArgs a) {
  const int64_t token = blockIdx.x;
  const int64_t slot = a.slot_mapping[token];
  if (slot < 0 || slot >= a.num_slots) return;
  const int64_t block = slot / a.block_size;
  const int64_t offset = slot % a.block_size;
  uint4* dst = a.cache + block * a.block_stride + offset * a.token_stride;
  const uint4* k = a.k + token * a.k_token_stride;
  const uint4* v = a.v == nullptr ? nullptr : a.v + token * a.v_token_stride;
  for (int32_t i = threadIdx.x; i < a.vecs_per_token; i += kWriteKvThreads) {
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

// Kernel arguments of a validated call (strides converted to 16-byte vectors), shared by the
// launcher and the host emulation test.
inline WriteKvArgs MakeWriteKvArgs(const void* k, const void* v, int64_t k_token_stride,
                                   int64_t v_token_stride, const int64_t* slot_mapping,
                                   const KvCacheView& cache) {
  constexpr int64_t kVec = kHalvesPerVec;
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
  return a;
}

// fp8 (e4m3) cache with per-tensor scales: inputs are T (bf16/fp16) vectors of 8 values, the
// cache is written in vectors of 16 fp8 values; stored value = e4m3_satfinite(x * inv_scale).
struct WriteKvFp8Args {
  const uint4* k;  // input vectors (8 values)
  const uint4* v;
  int64_t k_token_stride;  // in input vectors
  int64_t v_token_stride;
  const int64_t* slot_mapping;
  uint4* cache;  // cache vectors (16 fp8 values)
  int64_t block_stride;  // in cache vectors
  int64_t kv_stride;
  int64_t token_stride;
  int64_t head_stride;
  int64_t num_slots;
  int32_t block_size;
  int32_t vecs_per_head;   // head_dim / 16
  int32_t vecs_per_token;  // num_kv_heads * head_dim / 16
  float k_inv_scale;
  float v_inv_scale;
};

// 16 values of T (two input vectors) -> 16 e4m3 bytes, little-endian in one vector.
template <typename T>
__device__ __forceinline__ uint4 ToE4m3x16(const uint4& lo, const uint4& hi, float inv_scale) {
  float f[16];
  Unpack8<T>(lo, f);
  Unpack8<T>(hi, f + 8);
  uint32_t words[4] = {0, 0, 0, 0};
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const uint32_t byte = __nv_cvt_float_to_fp8(f[i] * inv_scale, __NV_SATFINITE, __NV_E4M3);
    words[i / 4] |= byte << (8 * (i % 4));
  }
  return make_uint4(words[0], words[1], words[2], words[3]);
}

// grid.x = token; as WriteKvKernel, one 16-value cache vector per thread iteration.
template <typename T>
__global__ void __launch_bounds__(kWriteKvThreads) WriteKvFp8Kernel(const WriteKvFp8Args a) {
  const int64_t token = blockIdx.x;
  const int64_t slot = a.slot_mapping[token];
  if (slot < 0 || slot >= a.num_slots) return;
  const int64_t block = slot / a.block_size;
  const int64_t offset = slot % a.block_size;
  uint4* dst = a.cache + block * a.block_stride + offset * a.token_stride;
  const uint4* k = a.k + token * a.k_token_stride;
  const uint4* v = a.v == nullptr ? nullptr : a.v + token * a.v_token_stride;
  for (int32_t i = threadIdx.x; i < a.vecs_per_token; i += kWriteKvThreads) {
    const int32_t head = i / a.vecs_per_head;
    const int32_t j = i - head * a.vecs_per_head;
    const int64_t to = head * a.head_stride + j;
    // Heads are contiguous in the input, so cache vector i covers input vectors 2i and 2i+1.
    const uint4 k_lo = __ldcs(k + 2 * i);
    const uint4 k_hi = __ldcs(k + 2 * i + 1);
    if (v != nullptr) {
      const uint4 v_lo = __ldcs(v + 2 * i);
      const uint4 v_hi = __ldcs(v + 2 * i + 1);
      dst[to + a.kv_stride] = ToE4m3x16<T>(v_lo, v_hi, a.v_inv_scale);
    }
    dst[to] = ToE4m3x16<T>(k_lo, k_hi, a.k_inv_scale);
  }
}

// Kernel arguments of a validated WriteKvFp8 call.
inline WriteKvFp8Args MakeWriteKvFp8Args(const void* k, const void* v, int64_t k_token_stride,
                                         int64_t v_token_stride, const int64_t* slot_mapping,
                                         float k_scale, float v_scale,
                                         const KvCacheView& cache) {
  constexpr int64_t kIn = kHalvesPerVec;  // input values per vector
  constexpr int64_t kOut = 16;            // fp8 values per vector
  WriteKvFp8Args a;
  a.k = static_cast<const uint4*>(k);
  a.v = static_cast<const uint4*>(v);
  a.k_token_stride = k_token_stride / kIn;
  a.v_token_stride = v_token_stride / kIn;
  a.slot_mapping = slot_mapping;
  a.cache = static_cast<uint4*>(cache.base);
  a.block_stride = cache.block_stride / kOut;
  a.kv_stride = cache.kv_stride / kOut;
  a.token_stride = cache.token_stride / kOut;
  a.head_stride = cache.head_stride / kOut;
  a.num_slots = static_cast<int64_t>(cache.num_blocks) * cache.block_size;
  a.block_size = cache.block_size;
  a.vecs_per_head = cache.head_dim / static_cast<int32_t>(kOut);
  a.vecs_per_token = cache.num_kv_heads * a.vecs_per_head;
  a.k_inv_scale = 1.0f / k_scale;
  a.v_inv_scale = 1.0f / v_scale;
  return a;
}

}  // namespace kvpage::cuda::internal

#endif  // KVPAGE_KERNELS_WRITE_KV_KERNEL_CUH_
