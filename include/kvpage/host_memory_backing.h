// HostMemoryBacking: a MemoryBacking in host memory with the shape the CUDA backing has on a
// GPU, so that the whole path — block manager, scheduler, kernels' CPU references — runs on
// real mapped memory on a machine without a GPU.
//
// At Reserve (KvCacheManager::Create) it reserves one virtual range per cache tensor of every
// layer (memory_layout.h: a layer's K/V, MLA latent, conv state, recurrent state), each sized
// for every block id its pool may ever hand out, PROT_NONE: address space only. Mapping a
// pool's chunk commits that chunk's slice of every tensor of the pool (read/write); unmapping
// it drops the pages (MADV_DONTNEED, so the resident set shrinks at once) and makes them
// PROT_NONE again, so a kernel that touches a block of an unmapped chunk faults instead of
// reading stale data. The null block (id 0) of every tensor stays mapped.
//
// Commits are whole units: pages, or the unit given at construction (2 MiB to behave as
// CudaVmmBacking on an H100). Block 1 of every tensor starts a unit, so the null block's units
// are its own; a unit that two chunks share (a chunk smaller than a unit) stays committed
// while either is mapped, and is counted once in mapped_bytes(). The manager charges its
// budget for every unit (MemoryBacking::map_unit_bytes), so mapped_bytes() <= kv_budget_bytes.
//
// Usage:
//   HostMemoryBacking backing;
//   config.kv.backing = &backing;                      // before Scheduler / manager Create
//   auto scheduler = *Scheduler::Create(model, config);
//   TensorView k = *backing.View(group, layer, TensorPart::kKey);
//
// Views stay valid for the backing's lifetime; the memory behind a block is readable only
// while its chunk is mapped. Errors are absl::Status naming the value: Reserve fails with
// ResourceExhausted when address space runs out and Unimplemented for vllm accounting (no
// per-layer layout); MapChunk with ResourceExhausted when the kernel refuses to commit (the
// chunk is then not mapped and nothing stays committed for it). Not thread-safe; it must
// outlive the manager that uses it.
#ifndef KVPAGE_HOST_MEMORY_BACKING_H_
#define KVPAGE_HOST_MEMORY_BACKING_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvpage/memory_backing.h"
#include "kvpage/memory_layout.h"
#include "kvpage/types.h"

namespace kvpage {

class HostMemoryBacking final : public MemoryBacking {
 public:
  // Commits memory in units of `unit_bytes` (0 = the page size; else a power of two at least
  // the page size, checked at Reserve): 2 MiB makes mapped_bytes() and the manager's budget
  // charges those of CudaVmmBacking on a GPU with 2 MiB granules.
  explicit HostMemoryBacking(int64_t unit_bytes = 0);
  ~HostMemoryBacking() override;
  HostMemoryBacking(const HostMemoryBacking&) = delete;
  HostMemoryBacking& operator=(const HostMemoryBacking&) = delete;

  // FailedPrecondition when called twice.
  absl::Status Reserve(const MemoryLayout& layout) override;
  // InvalidArgument for a pool or chunk out of range; FailedPrecondition before Reserve or
  // when the chunk is already mapped (not mapped, for UnmapChunk).
  absl::Status MapChunk(int32_t pool, int32_t chunk) override;
  absl::Status UnmapChunk(int32_t pool, int32_t chunk) override;
  int64_t map_unit_bytes() const override;

  // ---- What a server reads ----------------------------------------------------------------
  const MemoryLayout& layout() const;
  // The view of one layer's tensor:
  //   kKey, kValue  [num_blocks, block_size, num_kv_heads, head_dim] of a full or sliding
  //                 attention layer (block stride = the whole K+V block);
  //   kLatent       [num_blocks, block_size, 1, row] of an MLA layer;
  //   kConvState    [num_slots, conv_kernel − 1, conv_channels];
  //   kRecurrentState [num_slots, num_v_heads, k_head_dim, v_head_dim].
  // NotFound naming group, layer and part when the layer has no such tensor (wrong group,
  // wrong kind, or vllm accounting); FailedPrecondition before Reserve; InvalidArgument for
  // a `part` that is not a TensorPart (a cast integer).
  absl::StatusOr<TensorView> View(GroupId group, int32_t layer, TensorPart part) const;
  // The whole tensor a view lies in, as the manager described it.
  absl::StatusOr<const CacheTensor*> Tensor(GroupId group, int32_t layer,
                                            CacheTensorKind kind) const;
  // Bytes committed now (whole pages, shared pages once, null blocks included), and the most
  // ever committed at once.
  int64_t mapped_bytes() const;
  int64_t peak_mapped_bytes() const;
  // Address space reserved for all tensors.
  int64_t reserved_bytes() const;
  bool IsChunkMapped(int32_t pool, int32_t chunk) const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace kvpage

#endif  // KVPAGE_HOST_MEMORY_BACKING_H_
