// Batched slot copies: KV blocks and recurrent-state slots of every layer of a group in one
// launch (for a server's own moves; the block manager never asks for one), and zeroing of
// newly allocated state slots (SchedulerOutput::slots_to_zero). Built only with
// KVPAGE_BUILD_CUDA. Layouts: kvpage/kernel_layout.h.
#ifndef KVPAGE_CUDA_COPY_SLOTS_H_
#define KVPAGE_CUDA_COPY_SLOTS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kvpage/kernel_layout.h"

namespace kvpage::cuda {

// Descriptors passed by value in one launch; more tensors take ceil(n / 128) launches.
inline constexpr int32_t kMaxSlotTensorsPerLaunch = 128;

// For every tensor and every pair i < num_pairs, copies copy_bytes from slot src[i] to slot
// dst[i]. src, dst: int32 [num_pairs] on the device; a pair with a negative id or src == dst
// is skipped (pad with -1 to a fixed num_pairs for CUDA graphs).
//
// Grid (16 KiB chunk, pair, tensor); each thread moves four 16-byte vectors with streaming
// loads and stores so the copy does not evict hot KV from L2. Asynchronous on `stream`.
// REQUIRES: ids < num_slots of every tensor; no slot is both a source and a destination and
// no destination repeats within one call (the copies run in any order). ref::CopySlots checks
// the same rules on the host.
// Returns InvalidArgument naming the tensor and field for a descriptor that breaks
// ValidateSlotTensor, null ids with num_pairs > 0, or num_pairs < 0; a CUDA launch error
// otherwise.
absl::Status CopySlots(absl::Span<const SlotTensor> tensors, const int32_t* src,
                       const int32_t* dst, int32_t num_pairs, cudaStream_t stream);

// CopySlots over whole KV blocks (K and V) of every layer: `layers` are the group's per-layer
// caches, src/dst kernel-block ids. InvalidArgument when a layer's block is not one
// contiguous chunk (KvBlockSlotTensor).
absl::Status CopyBlocks(absl::Span<const KvCacheView> layers, const int32_t* src,
                        const int32_t* dst, int32_t num_pairs, cudaStream_t stream);

// Zeroes copy_bytes of slot slots[i] in every tensor (negative ids skipped): state for newly
// allocated requests. Same grid and errors as CopySlots.
absl::Status ZeroSlots(absl::Span<const SlotTensor> tensors, const int32_t* slots,
                       int32_t num_slots, cudaStream_t stream);

}  // namespace kvpage::cuda

#endif  // KVPAGE_CUDA_COPY_SLOTS_H_
