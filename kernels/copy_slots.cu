// copy_slots / copy_blocks / zero_slots (include/kvpage/cuda/copy_slots.h).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cuda_status.h"
#include "kvpage/cuda/copy_slots.h"

namespace kvpage::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kVecsPerThread = 4;
constexpr int64_t kChunkBytes = int64_t{kThreads} * kVecsPerThread * 16;  // 16 KiB
constexpr int32_t kMaxPairsPerLaunch = 65535;  // grid.y limit

struct SlotDesc {
  char* base;
  int64_t slot_stride_bytes;
  int64_t copy_bytes;
};

// By value: 128 * 24 + 8 bytes, inside the classic 4 KiB parameter limit.
struct SlotArgs {
  SlotDesc t[kMaxSlotTensorsPerLaunch];
};

// grid (chunk, pair, tensor). __grid_constant__ keeps the descriptor array in parameter space
// under the dynamic index instead of copying it to local memory.
__global__ void __launch_bounds__(kThreads)
    CopySlotsKernel(const __grid_constant__ SlotArgs args, const int32_t* __restrict__ src,
                    const int32_t* __restrict__ dst) {
  const SlotDesc& t = args.t[blockIdx.z];
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kChunkBytes;
  if (begin >= t.copy_bytes) return;
  const int32_t s = src[blockIdx.y];
  const int32_t d = dst[blockIdx.y];
  if (s < 0 || d < 0 || s == d) return;
  const uint4* from = reinterpret_cast<const uint4*>(t.base + s * t.slot_stride_bytes + begin);
  uint4* to = reinterpret_cast<uint4*>(t.base + d * t.slot_stride_bytes + begin);
  const int32_t n = static_cast<int32_t>(min(kChunkBytes, t.copy_bytes - begin) / 16);
  uint4 r[kVecsPerThread];
#pragma unroll
  for (int k = 0; k < kVecsPerThread; ++k) {
    const int32_t i = threadIdx.x + k * kThreads;
    if (i < n) r[k] = __ldcs(from + i);
  }
#pragma unroll
  for (int k = 0; k < kVecsPerThread; ++k) {
    const int32_t i = threadIdx.x + k * kThreads;
    if (i < n) __stcs(to + i, r[k]);
  }
}

__global__ void __launch_bounds__(kThreads)
    ZeroSlotsKernel(const __grid_constant__ SlotArgs args, const int32_t* __restrict__ slots) {
  const SlotDesc& t = args.t[blockIdx.z];
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kChunkBytes;
  if (begin >= t.copy_bytes) return;
  const int32_t s = slots[blockIdx.y];
  if (s < 0) return;
  uint4* to = reinterpret_cast<uint4*>(t.base + s * t.slot_stride_bytes + begin);
  const int32_t n = static_cast<int32_t>(min(kChunkBytes, t.copy_bytes - begin) / 16);
#pragma unroll
  for (int k = 0; k < kVecsPerThread; ++k) {
    const int32_t i = threadIdx.x + k * kThreads;
    if (i < n) __stcs(to + i, make_uint4(0, 0, 0, 0));
  }
}

// Validates, then launches `launch(args, grid, pair_offset, pairs)` per batch of at most 128
// tensors and 65535 pairs.
template <typename Launch>
absl::Status ForEachBatch(absl::Span<const SlotTensor> tensors, int32_t num_pairs,
                          const char* what, Launch launch) {
  if (num_pairs < 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": count ", num_pairs, " < 0"));
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    absl::Status status = ValidateSlotTensor(tensors[i], static_cast<int64_t>(i));
    if (!status.ok()) return status;
  }
  for (size_t first = 0; first < tensors.size(); first += kMaxSlotTensorsPerLaunch) {
    const size_t count = std::min<size_t>(kMaxSlotTensorsPerLaunch, tensors.size() - first);
    SlotArgs args{};
    int64_t max_bytes = 0;
    for (size_t i = 0; i < count; ++i) {
      const SlotTensor& t = tensors[first + i];
      args.t[i] = SlotDesc{static_cast<char*>(t.base), t.slot_stride_bytes, t.copy_bytes};
      max_bytes = std::max(max_bytes, t.copy_bytes);
    }
    const int64_t chunks = (max_bytes + kChunkBytes - 1) / kChunkBytes;
    if (chunks > 0x7fffffff) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": copy_bytes ", max_bytes));
    }
    for (int32_t pair = 0; pair < num_pairs; pair += kMaxPairsPerLaunch) {
      const int32_t pairs = std::min(kMaxPairsPerLaunch, num_pairs - pair);
      const dim3 grid(static_cast<uint32_t>(chunks), static_cast<uint32_t>(pairs),
                      static_cast<uint32_t>(count));
      launch(args, grid, pair);
      const cudaError_t err = cudaGetLastError();
      if (err != cudaSuccess) return internal::CudaStatus(err, what);
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CopySlots(absl::Span<const SlotTensor> tensors, const int32_t* src,
                       const int32_t* dst, int32_t num_pairs, cudaStream_t stream) {
  if (num_pairs > 0 && (src == nullptr || dst == nullptr)) {
    return absl::InvalidArgumentError("CopySlots: null src or dst ids");
  }
  return ForEachBatch(tensors, num_pairs, "CopySlots",
                      [&](const SlotArgs& args, dim3 grid, int32_t pair) {
                        CopySlotsKernel<<<grid, kThreads, 0, stream>>>(args, src + pair,
                                                                       dst + pair);
                      });
}

absl::Status CopyBlocks(absl::Span<const KvCacheView> layers, const int32_t* src,
                        const int32_t* dst, int32_t num_pairs, cudaStream_t stream) {
  std::vector<SlotTensor> tensors(layers.size());
  for (size_t i = 0; i < layers.size(); ++i) {
    absl::Status status = KvBlockSlotTensor(layers[i], &tensors[i]);
    if (!status.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("CopyBlocks: layer ", i, ": ", status.message()));
    }
  }
  return CopySlots(tensors, src, dst, num_pairs, stream);
}

absl::Status ZeroSlots(absl::Span<const SlotTensor> tensors, const int32_t* slots,
                       int32_t num_slots, cudaStream_t stream) {
  if (num_slots > 0 && slots == nullptr) {
    return absl::InvalidArgumentError("ZeroSlots: null slot ids");
  }
  return ForEachBatch(tensors, num_slots, "ZeroSlots",
                      [&](const SlotArgs& args, dim3 grid, int32_t pair) {
                        ZeroSlotsKernel<<<grid, kThreads, 0, stream>>>(args, slots + pair);
                      });
}

}  // namespace kvpage::cuda
