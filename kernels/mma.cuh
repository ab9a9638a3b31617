// Warp-level tensor-core and async-copy helpers for sm_80+ (used on sm_90): mma.sync
// m16n8k16 with fp32 accumulators, ldmatrix, cp.async with zero fill, and the CTA's dynamic
// shared memory. Under
// KVPAGE_CUDA_EMULATION they map to the host emulation in kernels/emulation/cuda_emulation.h,
// which implements the same fragment layouts, so the kernels that use them run in the CPU tests.
//
// Fragment layouts of mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16} (PTX ISA, "Matrix
// Fragments for mma.m16n8k16"), with g = lane / 4 and q = lane % 4; a 32-bit register holds
// two 16-bit values, the lower-indexed one in the low half:
//   A (16 x 16, row-major):  a0 = A[g][2q..2q+1]    a1 = A[g+8][2q..2q+1]
//                            a2 = A[g][2q+8..2q+9]  a3 = A[g+8][2q+8..2q+9]
//   B (16 x 8, k x n):       b0 = B[2q..2q+1][g]    b1 = B[2q+8..2q+9][g]
//   C, D (16 x 8, fp32):     c0, c1 = C[g][2q], C[g][2q+1]; c2, c3 = C[g+8][2q], C[g+8][2q+1]
// ldmatrix.x4: lanes 8j..8j+7 give the 16-byte row addresses of 8x8 matrix j; register j of
// every lane receives M_j[g][2q..2q+1] (with .trans: M_j[2q][g] and M_j[2q+1][g]).
#ifndef KVPAGE_KERNELS_MMA_CUH_
#define KVPAGE_KERNELS_MMA_CUH_

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/vec.cuh"

namespace kvpage::cuda::internal {

#if defined(KVPAGE_CUDA_EMULATION)

template <typename T>
__device__ __forceinline__ void Mma16816(float (&d)[4], const uint32_t (&a)[4],
                                         const uint32_t (&b)[2]) {
  emulation::Mma16816(d, a, b, std::is_same_v<T, __nv_bfloat16>);
}
__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], const void* row) {
  emulation::LdMatrixX4(r, row, /*trans=*/false);
}
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], const void* row) {
  emulation::LdMatrixX4(r, row, /*trans=*/true);
}
// Copies 16 bytes global -> shared, or writes 16 zero bytes when !valid (src not read).
__device__ __forceinline__ void CpAsync16(void* dst, const void* src, bool valid) {
  if (valid) {
    if (emulation::cp_async_observer != nullptr) emulation::cp_async_observer(src);
    memcpy(dst, src, 16);
  } else {
    memset(dst, 0, 16);
  }
}
__device__ __forceinline__ void CpAsyncCommit() {}
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {}
// The CTA's dynamic shared memory (emulation::LaunchShared sizes it).
__device__ __forceinline__ char* DynamicShared() { return emulation::DynamicSharedMemory(); }

#else

template <typename T>
__device__ __forceinline__ void Mma16816(float (&d)[4], const uint32_t (&a)[4],
                                         const uint32_t (&b)[2]) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
}
__device__ __forceinline__ uint32_t SharedAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SharedAddress(row)));
}
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SharedAddress(row)));
}
// cp.async.cg (L2 only: K/V are streamed once) with src-size 0 for an invalid row, which fills
// the 16 bytes with zeros and reads nothing.
__device__ __forceinline__ void CpAsync16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SharedAddress(dst)),
               "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n"); }
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}
// The CTA's dynamic shared memory (the launch's third <<<>>> argument), 128-byte aligned.
__device__ __forceinline__ char* DynamicShared() {
  extern __shared__ __align__(128) char dynamic_smem[];
  return dynamic_smem;
}

#endif

// Two floats -> one register of two T values (lo = first).
template <typename T>
__device__ __forceinline__ uint32_t PackPair(float lo, float hi) {
  const typename Pair<T>::Type pair = Pair<T>::FromFloat2(make_float2(lo, hi));
  uint32_t word;
  memcpy(&word, &pair, sizeof(word));
  return word;
}

}  // namespace kvpage::cuda::internal

#endif  // KVPAGE_KERNELS_MMA_CUH_
