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

// Where write_kv reads and writes, in 16-byte vectors: the inputs in vectors of 8 values
// (bf16/fp16), the cache in vectors of `cache vector` values (8 for bf16/fp16, 16 for fp8).
struct WriteKvArgs {
  const uint4* k;  // input vectors
  const uint4* v;  // null for MLA (one latent)
  int64_t k_token_stride;  // in input vectors
  int64_t v_token_stride;
  const int64_t* slot_mapping;
  uint4* cache;  // cache vectors
  int64_t block_stride;  // in cache vectors
  int64_t kv_stride;
  int64_t token_stride;
  int64_t head_stride;
  int64_t num_slots;
  int32_t block_size;
  int32_t vecs_per_head;   // head_dim / cache vector
  int32_t vecs_per_token;  // num_kv_heads * head_dim / cache vector
};

// fp8 (e4m3) cache with per-tensor scales: stored value = e4m3_satfinite(x * inv_scale).
struct WriteKvFp8Args {
  WriteKvArgs io;  // cache vectors of 16 fp8 values
  float k_inv_scale;
  float v_inv_scale;
};

// The token's cache slot, or false when its slot is -1 (skip) or out of range.
__device__ __forceinline__ bool TokenRows(const WriteKvArgs& a, int64_t token, uint4** dst,
                                          const uint4** k, const uint4** v) {
  const int64_t slot = a.slot_mapping[token];
  if (slot < 0 || slot >= a.num_slots) return false;
  *dst = a.cache + slot / a.block_size * a.block_stride + slot % a.block_size * a.token_stride;
  *k = a.k + token * a.k_token_stride;
  *v = a.v == nullptr ? nullptr : a.v + token * a.v_token_stride;
  return true;
}

// grid.x = token. Thread i copies vectors i, i + kWriteKvThreads, ... of the token's H*D/8 vectors.
__global__ void __launch_bounds__(kWriteKvThreads) WriteKvKernel(const WriteKvArgs a) {
  uint4* dst;
  const uint4 *k, *v;
  if (!TokenRows(a, blockIdx.x, &dst, &k, &v)) return;
  for (int32_t i = threadIdx.x; i < a.vecs_per_token; i += kWriteKvThreads) {
    const int32_t head = i / a.vecs_per_head;
    const int64_t to = head * a.head_stride + (i - head * a.vecs_per_head);
    const uint4 kv = __ldcs(k + i);  // read once: keep it out of L2's way
    if (v != nullptr) {
      const uint4 vv = __ldcs(v + i);
      dst[to + a.kv_stride] = vv;
    }
    dst[to] = kv;
  }
}

// Kernel arguments of a validated call, strides converted to vectors of `in_per_vec` input
// values and `out_per_vec` cache values; shared by the launchers and the host emulation test.
inline WriteKvArgs MakeWriteKvIo(const void* k, const void* v, int64_t k_token_stride,
                                 int64_t v_token_stride, const int64_t* slot_mapping,
                                 const KvCacheView& cache, int64_t in_per_vec,
                                 int64_t out_per_vec) {
  WriteKvArgs a;
  a.k = static_cast<const uint4*>(k);
  a.v = static_cast<const uint4*>(v);
  a.k_token_stride = k_token_stride / in_per_vec;
  a.v_token_stride = v_token_stride / in_per_vec;
  a.slot_mapping = slot_mapping;
  a.cache = static_cast<uint4*>(cache.base);
  a.block_stride = cache.block_stride / out_per_vec;
  a.kv_stride = cache.kv_stride / out_per_vec;
  a.token_stride = cache.token_stride / out_per_vec;
  a.head_stride = cache.head_stride / out_per_vec;
  a.num_slots = static_cast<int64_t>(cache.num_blocks) * cache.block_size;
  a.block_size = cache.block_size;
  a.vecs_per_head = cache.head_dim / static_cast<int32_t>(out_per_vec);
  a.vecs_per_token = cache.num_kv_heads * a.vecs_per_head;
  return a;
}

inline WriteKvArgs MakeWriteKvArgs(const void* k, const void* v, int64_t k_token_stride,
                                   int64_t v_token_stride, const int64_t* slot_mapping,
                                   const KvCacheView& cache) {
  return MakeWriteKvIo(k, v, k_token_stride, v_token_stride, slot_mapping, cache,
                       kHalvesPerVec, kHalvesPerVec);
}

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
__global__ void __launch_bounds__(kWriteKvThreads) WriteKvFp8Kernel(const WriteKvFp8Args f) {
  const WriteKvArgs& a = f.io;
  uint4* dst;
  const uint4 *k, *v;
  if (!TokenRows(a, blockIdx.x, &dst, &k, &v)) return;
  for (int32_t i = threadIdx.x; i < a.vecs_per_token; i += kWriteKvThreads) {
    const int32_t head = i / a.vecs_per_head;
    const int64_t to = head * a.head_stride + (i - head * a.vecs_per_head);
    // Heads are contiguous in the input, so cache vector i covers input vectors 2i and 2i+1.
    const uint4 k_lo = __ldcs(k + 2 * i);
    const uint4 k_hi = __ldcs(k + 2 * i + 1);
    if (v != nullptr) {
      const uint4 v_lo = __ldcs(v + 2 * i);
      const uint4 v_hi = __ldcs(v + 2 * i + 1);
      dst[to + a.kv_stride] = ToE4m3x16<T>(v_lo, v_hi, f.v_inv_scale);
    }
    dst[to] = ToE4m3x16<T>(k_lo, k_hi, f.k_inv_scale);
  }
}

// Kernel arguments of a validated WriteKvFp8 call.
inline WriteKvFp8Args MakeWriteKvFp8Args(const void* k, const void* v, int64_t k_token_stride,
                                         int64_t v_token_stride, const int64_t* slot_mapping,
                                         float k_scale, float v_scale,
                                         const KvCacheView& cache) {
  WriteKvFp8Args f;
  f.io = MakeWriteKvIo(k, v, k_token_stride, v_token_stride, slot_mapping, cache,
                       kHalvesPerVec, /*out_per_vec=*/16);
  f.k_inv_scale = 1.0f / k_scale;
  f.v_inv_scale = 1.0f / v_scale;
  return f;
}

}  // namespace kvpage::cuda::internal

#endif  // KVPAGE_KERNELS_WRITE_KV_KERNEL_CUH_
