// 16-byte vector helpers shared by the kernels: 8 bf16/fp16 values <-> 8 floats.
#ifndef KVPAGE_KERNELS_VEC_CUH_
#define KVPAGE_KERNELS_VEC_CUH_

#if defined(KVPAGE_CUDA_EMULATION)
#include "kernels/emulation/cuda_emulation.h"
#else
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#endif

#include <cstdint>
#include <cstring>

namespace kvpage::cuda::internal {

// Values of a 16-bit type in one 16-byte vector.
inline constexpr int kHalvesPerVec = 8;

template <typename T>
struct Pair;
template <>
struct Pair<__nv_bfloat16> {
  using Type = __nv_bfloat162;
  static __device__ __forceinline__ float2 ToFloat2(Type v) { return __bfloat1622float2(v); }
  static __device__ __forceinline__ Type FromFloat2(float2 v) { return __float22bfloat162_rn(v); }
};
template <>
struct Pair<__half> {
  using Type = __half2;
  static __device__ __forceinline__ float2 ToFloat2(Type v) { return __half22float2(v); }
  static __device__ __forceinline__ Type FromFloat2(float2 v) { return __float22half2_rn(v); }
};

// Unpacks 8 values of T held in a uint4 into floats.
template <typename T>
__device__ __forceinline__ void Unpack8(const uint4& raw, float* out) {
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    typename Pair<T>::Type pair;
    static_assert(sizeof(pair) == sizeof(uint32_t));
    memcpy(&pair, &words[i], sizeof(pair));
    const float2 f = Pair<T>::ToFloat2(pair);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}

// Packs 8 floats into 8 values of T (round to nearest even).
template <typename T>
__device__ __forceinline__ uint4 Pack8(const float* in) {
  uint32_t words[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const typename Pair<T>::Type pair = Pair<T>::FromFloat2(make_float2(in[2 * i], in[2 * i + 1]));
    memcpy(&words[i], &pair, sizeof(uint32_t));
  }
  return make_uint4(words[0], words[1], words[2], words[3]);
}

// Read-only 16-byte load through the non-coherent path (ld.global.nc.v4).
__device__ __forceinline__ uint4 LoadVec(const void* p) {
  return __ldg(static_cast<const uint4*>(p));
}

// Tag type of an fp8 e4m3 KV cache for the kernels that read one (decode).
struct Fp8E4m3 {};

// Eight consecutive KV values of element type TC as decode reads them: `Raw` holds them
// (16 bytes for f16/bf16, 8 for e4m3), `Elem` is the type addresses count in.
template <typename TC>
struct KvVec8 {
  using Elem = TC;
  using Raw = uint4;
  static __device__ __forceinline__ Raw Zero() { return make_uint4(0, 0, 0, 0); }
  static __device__ __forceinline__ Raw Load(const Elem* p) { return LoadVec(p); }
  static __device__ __forceinline__ void Unpack(const Raw& raw, float* out) {
    Unpack8<TC>(raw, out);
  }
};
template <>
struct KvVec8<Fp8E4m3> {
  using Elem = uint8_t;
  using Raw = uint2;
  static __device__ __forceinline__ Raw Zero() { return make_uint2(0, 0); }
  static __device__ __forceinline__ Raw Load(const Elem* p) {
    return __ldg(reinterpret_cast<const uint2*>(p));
  }
  // e4m3 -> f16 is exact (cvt.rn.f16x2.e4m3x2 on sm_89+), then f16 -> f32.
  static __device__ __forceinline__ void Unpack(const Raw& raw, float* out) {
    const uint32_t words[2] = {raw.x, raw.y};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const auto pair = static_cast<__nv_fp8x2_storage_t>(words[i / 2] >> (16 * (i % 2)));
      const __half2_raw raw2 = __nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3);
      __half2 h;
      static_assert(sizeof(h) == sizeof(raw2));
      memcpy(&h, &raw2, sizeof(h));
      const float2 f = __half22float2(h);
      out[2 * i] = f.x;
      out[2 * i + 1] = f.y;
    }
  }
};

}  // namespace kvpage::cuda::internal

#endif  // KVPAGE_KERNELS_VEC_CUH_
