// copy_slots / zero_slots kernel bodies.
//
// Device code only; the launcher is in copy_slots.cu. Kept in a header so the same source also
// compiles on the host against kernels/emulation/cuda_emulation.h (tests/kernels).
#ifndef KVPAGE_KERNELS_COPY_SLOTS_KERNEL_CUH_
#define KVPAGE_KERNELS_COPY_SLOTS_KERNEL_CUH_

#include <cstdint>

#include "kernels/vec.cuh"

namespace kvpage::cuda::internal {

constexpr int kCopyThreads = 256;
constexpr int kCopyVecsPerThread = 4;
constexpr int64_t kCopyChunkBytes = int64_t{kCopyThreads} * kCopyVecsPerThread * 16;  // 16 KiB
constexpr int32_t kMaxPairsPerLaunch = 65535;  // grid.y limit
constexpr int32_t kSlotTensorsPerLaunch = 128;  // kvpage::cuda::kMaxSlotTensorsPerLaunch

struct SlotDesc {
  char* base;
  int64_t slot_stride_bytes;
  int64_t copy_bytes;
};

// By value: 128 * 24 + 8 bytes, inside the classic 4 KiB parameter limit.
struct SlotArgs {
  SlotDesc t[kSlotTensorsPerLaunch];
};

// grid (chunk, pair, tensor). __grid_constant__ keeps the descriptor array in parameter space
// under the dynamic index instead of copying it to local memory.
__global__ void __launch_bounds__(kCopyThreads)
    CopySlotsKernel(const __grid_constant__ SlotArgs args, const int32_t* __restrict__ src,
                    const int32_t* __restrict__ dst) {
  const SlotDesc& t = args.t[blockIdx.z];
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kCopyChunkBytes;
  if (begin >= t.copy_bytes) return;
  const int32_t s = src[blockIdx.y];
  const int32_t d = dst[blockIdx.y];
  if (s < 0 || d < 0 || s == d) return;
  const uint4* from = reinterpret_cast<const uint4*>(t.base + s * t.slot_stride_bytes + begin);
  uint4* to = reinterpret_cast<uint4*>(t.base + d * t.slot_stride_bytes + begin);
  const int32_t n = static_cast<int32_t>(min(kCopyChunkBytes, t.copy_bytes - begin) / 16);
  uint4 r[kCopyVecsPerThread];
#pragma unroll
  for (int k = 0; k < kCopyVecsPerThread; ++k) {
    const int32_t i = threadIdx.x + k * kCopyThreads;
    if (i < n) r[k] = __ldcs(from + i);
  }
#pragma unroll
  for (int k = 0; k < kCopyVecsPerThread; ++k) {
    const int32_t i = threadIdx.x + k * kCopyThreads;
    if (i < n) __stcs(to + i, r[k]);
  }
}

__global__ void __launch_bounds__(kCopyThreads)
    ZeroSlotsKernel(const __grid_constant__ SlotArgs args, const int32_t* __restrict__ slots) {
  const SlotDesc& t = args.t[blockIdx.z];
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kCopyChunkBytes;
  if (begin >= t.copy_bytes) return;
  const int32_t s = slots[blockIdx.y];
  if (s < 0) return;
  uint4* to = reinterpret_cast<uint4*>(t.base + s * t.slot_stride_bytes + begin);
  const int32_t n = static_cast<int32_t>(min(kCopyChunkBytes, t.copy_bytes - begin) / 16);
#pragma unroll
  for (int k = 0; k < kCopyVecsPerThread; ++k) {
    const int32_t i = threadIdx.x + k * kCopyThreads;
    if (i < n) __stcs(to + i, make_uint4(0, 0, 0, 0));
  }
}

// Validates, then launches `launch(args, grid, pair_offset, pairs)` per batch of at most 128
// tensors and 65535 pairs.

}  // namespace kvpage::cuda::internal

#endif  // KVPAGE_KERNELS_COPY_SLOTS_KERNEL_CUH_
