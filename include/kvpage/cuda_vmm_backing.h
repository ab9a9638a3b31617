// CudaVmmBacking: the MemoryBacking that puts a KvCacheManager's cache in GPU memory with
// CUDA virtual memory management (driver API), the shape HostMemoryBacking has on the host.
//
// At Reserve (KvCacheManager::Create) it reserves one device virtual range per cache tensor
// of every layer (cuMemAddressReserve), sized for every block id of its pool and aligned to
// the allocation granularity (2 MiB on H100/H200). Mapping a pool's chunk creates physical
// memory for the granules that chunk's slice of each tensor touches and maps it read/write
// (cuMemCreate, cuMemMap, cuMemSetAccess, one granule per allocation); unmapping unmaps and
// releases the granules no other mapped chunk holds. The null block's granule of every
// tensor stays mapped. Each layer's K and V are then strided device tensors
// [num_blocks][block_size][heads][head_dim] that kernels read with the block table as is.
//
// Granules are 2 MiB (map_unit_bytes): the manager sizes a pool's chunks so that their slice
// of each tensor is whole granules where the budget allows (at least 2 MiB × the pool's
// tensors with one range per layer), starts block 1 of each tensor on a granule, and charges
// its budget for every granule a chunk can map, so mapped_bytes() <= kv_budget_bytes
// (docs/design.md §3).
//
// Errors are absl::Status naming the value: Create fails with FailedPrecondition for a device
// without virtual memory management and Internal for a driver error; Reserve with
// ResourceExhausted when address space runs out; MapChunk with ResourceExhausted when the
// device is out of memory (the chunk is then not mapped and nothing stays allocated for it).
// Not thread-safe; it must outlive the manager. No CUDA header is included here.
#ifndef KVPAGE_CUDA_VMM_BACKING_H_
#define KVPAGE_CUDA_VMM_BACKING_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvpage/memory_backing.h"
#include "kvpage/memory_layout.h"
#include "kvpage/types.h"

namespace kvpage {

class CudaVmmBacking final : public MemoryBacking {
 public:
  // A backing on device `device` (its primary context is made current on this thread).
  static absl::StatusOr<std::unique_ptr<CudaVmmBacking>> Create(int32_t device);
  ~CudaVmmBacking() override;  // unmaps and releases everything
  CudaVmmBacking(const CudaVmmBacking&) = delete;
  CudaVmmBacking& operator=(const CudaVmmBacking&) = delete;

  absl::Status Reserve(const MemoryLayout& layout) override;
  absl::Status MapChunk(int32_t pool, int32_t chunk) override;
  absl::Status UnmapChunk(int32_t pool, int32_t chunk) override;
  int64_t map_unit_bytes() const override { return granularity(); }

  const MemoryLayout& layout() const;
  // As HostMemoryBacking::View; `base` is a device pointer.
  absl::StatusOr<TensorView> View(GroupId group, int32_t layer, TensorPart part) const;
  int64_t granularity() const;   // bytes of one physical allocation
  int64_t mapped_bytes() const;  // device memory allocated now (whole granules)
  int64_t peak_mapped_bytes() const;
  int64_t reserved_bytes() const;  // virtual address space reserved

 private:
  struct State;
  explicit CudaVmmBacking(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace kvpage

#endif  // KVPAGE_CUDA_VMM_BACKING_H_
