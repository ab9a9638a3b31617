// copy_slots / copy_blocks / zero_slots (include/kvpage/cuda/copy_slots.h).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cuda_status.h"
#include "kernels/copy_slots_kernel.cuh"
#include "kvpage/cuda/copy_slots.h"

namespace kvpage::cuda {
namespace {

using internal::CopySlotsKernel;
using internal::kCopyChunkBytes;
using internal::kCopyThreads;
using internal::kMaxPairsPerLaunch;
using internal::SlotArgs;
using internal::SlotDesc;
using internal::ZeroSlotsKernel;

static_assert(internal::kSlotTensorsPerLaunch == kMaxSlotTensorsPerLaunch);

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
    const int64_t chunks = (max_bytes + kCopyChunkBytes - 1) / kCopyChunkBytes;
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
                        CopySlotsKernel<<<grid, kCopyThreads, 0, stream>>>(args, src + pair,
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
                        ZeroSlotsKernel<<<grid, kCopyThreads, 0, stream>>>(args, slots + pair);
                      });
}

}  // namespace kvpage::cuda
