// Host emulation of the small CUDA subset the kvpage kernels use, so the kernel sources
// (kernels/*_kernel.cuh) compile with g++ and run on the CPU in the normal test suite.
//
// It runs every CUDA thread of a CTA as a cooperative fiber (ucontext) and the CTAs one after
// another. __syncthreads is a CTA-wide barrier and __shfl_xor_sync a warp-wide exchange through
// memory plus two warp barriers, so every lane reaches the same points as on a GPU before any
// goes on. Threads that return early drop out of the barriers, as exited CUDA threads do.
// __shared__ becomes a function-local static, which is correct because CTAs run one at a time.
// Not thread-safe: one launch at a time per process.
//
// The warp-wide matrix instructions the tensor-core decode uses (mma.sync m16n8k16, ldmatrix,
// through kernels/mma.cuh) are emulated with the PTX fragment layouts; cp.async copies at once
// and reports each read to cp_async_observer.
//
// What it proves: indexing, masking, fragment bookkeeping, the online-softmax merges and the
// split/merge protocol of the real kernel source. What it does not prove: timing, memory-model
// races beyond those barriers, register limits, that the PTX fragment layouts are as this file
// reads them (only a GPU run can), the accumulation order of mma, or fp rounding of the fast
// intrinsics (__expf, __log2f, exp2f map to libm here). Test-only: nothing in the library
// includes it.
#ifndef KVPAGE_KERNELS_EMULATION_CUDA_EMULATION_H_
#define KVPAGE_KERNELS_EMULATION_CUDA_EMULATION_H_

#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "kvpage/kernel_reference.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#endif

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __grid_constant__
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))

struct dim3 {
  unsigned int x = 1, y = 1, z = 1;
  constexpr dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1)
      : x(x_), y(y_), z(z_) {}
};
struct uint4 {
  unsigned int x, y, z, w;
};
struct uint2 {
  unsigned int x, y;
};
struct float2 {
  float x, y;
};
struct float4 {
  float x, y, z, w;
};
inline uint4 make_uint4(unsigned int x, unsigned int y, unsigned int z, unsigned int w) {
  return uint4{x, y, z, w};
}
inline uint2 make_uint2(unsigned int x, unsigned int y) { return uint2{x, y}; }
inline float2 make_float2(float x, float y) { return float2{x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }

struct __nv_bfloat16 {
  uint16_t bits;
};
struct __half {
  uint16_t bits;
};
struct __nv_bfloat162 {
  __nv_bfloat16 x, y;
};
struct __half2 {
  __half x, y;
};
inline float2 __bfloat1622float2(__nv_bfloat162 v) {
  return float2{kvpage::ref::Bf16ToFloat(v.x.bits), kvpage::ref::Bf16ToFloat(v.y.bits)};
}
inline __nv_bfloat162 __float22bfloat162_rn(float2 v) {
  return __nv_bfloat162{{kvpage::ref::FloatToBf16(v.x)}, {kvpage::ref::FloatToBf16(v.y)}};
}
inline float2 __half22float2(__half2 v) {
  return float2{kvpage::ref::F16ToFloat(v.x.bits), kvpage::ref::F16ToFloat(v.y.bits)};
}
inline __half2 __float22half2_rn(float2 v) {
  return __half2{{kvpage::ref::FloatToF16(v.x)}, {kvpage::ref::FloatToF16(v.y)}};
}
inline __nv_bfloat16 __float2bfloat16_rn(float x) { return {kvpage::ref::FloatToBf16(x)}; }
inline __half __float2half_rn(float x) { return {kvpage::ref::FloatToF16(x)}; }

using __nv_fp8_storage_t = unsigned char;
enum __nv_saturation_t { __NV_NOSAT, __NV_SATFINITE };
enum __nv_fp8_interpretation_t { __NV_E4M3, __NV_E5M2 };
// Only the conversion the kernels use: e4m3 with saturation to the largest finite value.
inline __nv_fp8_storage_t __nv_cvt_float_to_fp8(float x, __nv_saturation_t,
                                                __nv_fp8_interpretation_t) {
  return kvpage::ref::FloatToE4m3(x);
}
// Two e4m3 values (low byte first) widened to two f16 bit patterns; exact, as on the device.
using __nv_fp8x2_storage_t = unsigned short;
struct __half2_raw {
  unsigned short x, y;
};
inline __half2_raw __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t pair,
                                              __nv_fp8_interpretation_t) {
  return __half2_raw{kvpage::ref::FloatToF16(kvpage::ref::E4m3ToFloat(pair & 0xff)),
                     kvpage::ref::FloatToF16(kvpage::ref::E4m3ToFloat(pair >> 8))};
}

inline float __expf(float x) { return std::exp(x); }
inline float __log2f(float x) { return std::log2(x); }
inline int min(int a, int b) { return a < b ? a : b; }
inline int64_t min(int64_t a, int64_t b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }

// The CUDA built-in indices. Fibers of one CTA share the OS thread, so the scheduler sets
// threadIdx on every switch.
inline dim3 threadIdx;
inline dim3 blockIdx;
inline dim3 blockDim;
inline dim3 gridDim;

template <typename T>
T __ldg(const T* p) {
  return *p;
}
template <typename T>
T __ldcs(const T* p) {
  return *p;
}
template <typename T>
void __stcs(T* p, T v) {
  *p = v;
}

namespace kvpage::cuda::emulation {

// One CTA's CUDA threads as cooperative fibers (ucontext) on the calling OS thread. A fiber
// runs until it waits at a barrier that other threads have not reached, then hands over to
// the next unfinished fiber in round-robin order; the last arrival releases the barrier.
class Cta {
 public:
  static constexpr size_t kStackBytes = size_t{256} << 10;

  explicit Cta(int threads) : fibers_(threads), warp_count_((threads + 31) / 32) {
    for (int w = 0; w < warp_count_; ++w) {
      warps_.push_back(Barrier{std::min(32, threads - 32 * w), 0, 0});
    }
    cta_barrier_ = Barrier{threads, 0, 0};
  }

  // Runs body() as every thread of the CTA; returns when all have finished.
  void Run(void (*body)(void*), void* arg) {
    body_ = body;
    arg_ = arg;
    for (size_t i = 0; i < fibers_.size(); ++i) {
      Fiber& f = fibers_[i];
      f.stack.reset(new char[kStackBytes]);
      getcontext(&f.ctx);
      f.ctx.uc_stack.ss_sp = f.stack.get();
      f.ctx.uc_stack.ss_size = kStackBytes;
      f.ctx.uc_link = nullptr;
      makecontext(&f.ctx, reinterpret_cast<void (*)()>(&Cta::Entry), 1, static_cast<int>(i));
    }
    active_ = this;
    SwitchTo(&main_ctx_, 0, /*dying=*/false);
    active_ = nullptr;
  }

  void SyncThreads() { Wait(cta_barrier_); }
  void SyncWarp() { Wait(warps_[current_ / 32]); }
  float* WarpSlots() { return slots_[current_ / 32]; }
  // Per-warp exchange for the warp-wide matrix instructions: 8 words and one pointer a lane.
  uint32_t* WarpWords() { return words_[current_ / 32]; }
  const void** WarpPointers() { return pointers_[current_ / 32]; }
  static Cta* Active() { return active_; }

 private:
  struct Fiber {
    ucontext_t ctx;
    std::unique_ptr<char[]> stack;
    bool done = false;
  };
  struct Barrier {
    int expected;
    int arrived;
    uint64_t generation;
  };

  static void Entry(int index) {
    Cta* self = active_;
#if defined(__SANITIZE_ADDRESS__)
    __sanitizer_finish_switch_fiber(nullptr, &self->main_stack_bottom_, &self->main_stack_size_);
#endif
    self->Enter(index);
    self->body_(self->arg_);
    self->Finish();
  }

  void Enter(int index) {
    current_ = index;
    threadIdx = dim3(static_cast<unsigned int>(index));
  }

  void Finish() {
    Fiber& me = fibers_[current_];
    me.done = true;
    // An exited thread no longer counts at barriers (as on the GPU).
    Leave(warps_[current_ / 32]);
    Leave(cta_barrier_);
    const int next = NextRunnable();
    if (next < 0) {
      ucontext_t unused;
      SwitchTo(&unused, -1, /*dying=*/true);
    } else {
      ucontext_t unused;
      SwitchTo(&unused, next, /*dying=*/true);
    }
  }

  static void Leave(Barrier& b) {
    --b.expected;
    if (b.expected > 0 && b.arrived == b.expected) Release(b);
  }
  static void Release(Barrier& b) {
    b.arrived = 0;
    ++b.generation;
  }

  void Wait(Barrier& b) {
    const uint64_t generation = b.generation;
    if (++b.arrived == b.expected) {
      Release(b);
      return;
    }
    while (b.generation == generation) {
      const int me = current_;
      SwitchTo(&fibers_[me].ctx, NextRunnable(), /*dying=*/false);
      Enter(me);
    }
  }

  // The next unfinished fiber after the current one, or -1.
  int NextRunnable() const {
    const int n = static_cast<int>(fibers_.size());
    for (int step = 1; step <= n; ++step) {
      const int i = (current_ + step) % n;
      if (!fibers_[i].done) return i;
    }
    return -1;
  }

  // Saves the running context into `from` and resumes fiber `to` (-1: the caller of Run).
  void SwitchTo(ucontext_t* from, int to, bool dying) {
    ucontext_t* target = to < 0 ? &main_ctx_ : &fibers_[to].ctx;
#if defined(__SANITIZE_ADDRESS__)
    void* fake_stack = nullptr;
    const void* bottom = to < 0 ? main_stack_bottom_ : fibers_[to].stack.get();
    const size_t size = to < 0 ? main_stack_size_ : kStackBytes;
    __sanitizer_start_switch_fiber(dying ? nullptr : &fake_stack, bottom, size);
#else
    (void)dying;
#endif
    if (to >= 0) current_ = to;
    swapcontext(from, target);
#if defined(__SANITIZE_ADDRESS__)
    __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
#endif
  }

  std::vector<Fiber> fibers_;
  int warp_count_;
  std::vector<Barrier> warps_;
  Barrier cta_barrier_{};
  float slots_[32][32] = {};  // shuffle exchange, one row per warp (up to 1024 threads)
  uint32_t words_[32][32 * 8] = {};
  const void* pointers_[32][32] = {};
  ucontext_t main_ctx_{};
  const void* main_stack_bottom_ = nullptr;
  size_t main_stack_size_ = 0;
  int current_ = 0;
  void (*body_)(void*) = nullptr;
  void* arg_ = nullptr;
  static inline Cta* active_ = nullptr;
};

}  // namespace kvpage::cuda::emulation

inline void __syncthreads() { kvpage::cuda::emulation::Cta::Active()->SyncThreads(); }

inline float __shfl_xor_sync(unsigned int /*mask*/, float value, int lane_mask) {
  kvpage::cuda::emulation::Cta& cta = *kvpage::cuda::emulation::Cta::Active();
  float* slots = cta.WarpSlots();
  const unsigned int lane = threadIdx.x % 32;
  slots[lane] = value;
  cta.SyncWarp();
  const float other = slots[lane ^ static_cast<unsigned int>(lane_mask)];
  cta.SyncWarp();
  return other;
}

inline float __shfl_sync(unsigned int /*mask*/, float value, int src_lane) {
  kvpage::cuda::emulation::Cta& cta = *kvpage::cuda::emulation::Cta::Active();
  float* slots = cta.WarpSlots();
  slots[threadIdx.x % 32] = value;
  cta.SyncWarp();
  const float other = slots[src_lane % 32];
  cta.SyncWarp();
  return other;
}

inline void __syncwarp(unsigned int /*mask*/ = 0xffffffffu) {
  kvpage::cuda::emulation::Cta::Active()->SyncWarp();
}

namespace kvpage::cuda::emulation {

// Value of the 16-bit half `hi` of a register holding two bf16 (or f16) values.
inline float HalfOfWord(uint32_t word, int hi, bool bf16) {
  const uint16_t bits = static_cast<uint16_t>(hi ? word >> 16 : word & 0xffffu);
  return bf16 ? kvpage::ref::Bf16ToFloat(bits) : kvpage::ref::F16ToFloat(bits);
}

// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}: d += A * B over the warp, with the
// fragment layouts of kernels/mma.cuh. Every lane deposits its fragments, then computes its
// own four outputs from the whole matrices (products and sums in float, in k order).
inline void Mma16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], bool bf16) {
  Cta& cta = *Cta::Active();
  uint32_t* words = cta.WarpWords();
  const unsigned int lane = threadIdx.x % 32;
  for (int i = 0; i < 4; ++i) words[lane * 8 + i] = a[i];
  words[lane * 8 + 4] = b[0];
  words[lane * 8 + 5] = b[1];
  cta.SyncWarp();
  // A[r][k]: lane (r % 8) * 4 + (k % 8) / 2, register r / 8 + 2 * (k / 8), half k % 2.
  // B[k][n]: lane n * 4 + (k % 8) / 2, register 4 + k / 8, half k % 2.
  auto a_at = [&](int r, int k) {
    return HalfOfWord(words[((r % 8) * 4 + (k % 8) / 2) * 8 + r / 8 + 2 * (k / 8)], k % 2, bf16);
  };
  auto b_at = [&](int k, int n) {
    return HalfOfWord(words[(n * 4 + (k % 8) / 2) * 8 + 4 + k / 8], k % 2, bf16);
  };
  const int g = static_cast<int>(lane / 4), q = static_cast<int>(lane % 4);
  float out[4];
  for (int i = 0; i < 4; ++i) {
    const int row = g + 8 * (i / 2), col = 2 * q + i % 2;
    float acc = d[i];
    for (int k = 0; k < 16; ++k) acc += a_at(row, k) * b_at(k, col);
    out[i] = acc;
  }
  cta.SyncWarp();
  for (int i = 0; i < 4; ++i) d[i] = out[i];
}

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: lane 8j + i gives the address of row i of
// matrix j (8 values of 16 bits); register j receives M_j[g][2q..2q+1], or with trans
// M_j[2q][g] (low half) and M_j[2q+1][g] (high half).
inline void LdMatrixX4(uint32_t (&r)[4], const void* row, bool trans) {
  Cta& cta = *Cta::Active();
  const void** pointers = cta.WarpPointers();
  const unsigned int lane = threadIdx.x % 32;
  pointers[lane] = row;
  cta.SyncWarp();
  const unsigned int g = lane / 4, q = lane % 4;
  uint32_t out[4];
  for (unsigned int j = 0; j < 4; ++j) {
    if (!trans) {
      std::memcpy(&out[j], static_cast<const char*>(pointers[8 * j + g]) + 4 * q, 4);
    } else {
      uint16_t lo, hi;
      std::memcpy(&lo, static_cast<const char*>(pointers[8 * j + 2 * q]) + 2 * g, 2);
      std::memcpy(&hi, static_cast<const char*>(pointers[8 * j + 2 * q + 1]) + 2 * g, 2);
      out[j] = static_cast<uint32_t>(lo) | static_cast<uint32_t>(hi) << 16;
    }
  }
  cta.SyncWarp();
  for (int j = 0; j < 4; ++j) r[j] = out[j];
}

// Called with the global address of every 16-byte cp.async that reads memory (a zero fill
// reads none); null: nobody listens. Tests count K/V reads with it (one launch at a time).
inline void (*cp_async_observer)(const void* src) = nullptr;

// The dynamic shared memory of the CTA that runs (LaunchShared sizes it; CTAs run one at a
// time, so they share it as they share static __shared__ variables).
inline std::vector<uint4>& DynamicSharedBuffer() {
  static std::vector<uint4> buffer;
  return buffer;
}
inline char* DynamicSharedMemory() {
  return reinterpret_cast<char*>(DynamicSharedBuffer().data());
}

// Runs kernel(args...) over `grid` x `block` (1-D blocks), one CTA at a time.
template <typename Kernel, typename... Args>
void Launch(dim3 grid, dim3 block, Kernel kernel, const Args&... args) {
  auto call = [&] { kernel(args...); };
  using Call = decltype(call);
  blockDim = block;
  gridDim = grid;
  for (unsigned int z = 0; z < grid.z; ++z) {
    for (unsigned int y = 0; y < grid.y; ++y) {
      for (unsigned int x = 0; x < grid.x; ++x) {
        blockIdx = dim3(x, y, z);
        Cta cta(static_cast<int>(block.x));
        cta.Run([](void* c) { (*static_cast<Call*>(c))(); }, &call);
      }
    }
  }
}

// Launch with `shared_bytes` of dynamic shared memory (<<<grid, block, shared_bytes>>>),
// filled with NaN bytes so a read before a write shows.
template <typename Kernel, typename... Args>
void LaunchShared(dim3 grid, dim3 block, size_t shared_bytes, Kernel kernel,
                  const Args&... args) {
  DynamicSharedBuffer().assign((shared_bytes + 15) / 16,
                               uint4{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu});
  Launch(grid, block, kernel, args...);
}

}  // namespace kvpage::cuda::emulation

#endif  // KVPAGE_KERNELS_EMULATION_CUDA_EMULATION_H_
