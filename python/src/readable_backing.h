// ReadableHostBacking: kvpage's HostMemoryBacking with every chunk readable and writable for
// the backing's whole life, for Python views of the cache (cache_views.cc).
//
// A NumPy array over a layer's K (or any cache tensor) spans every block id the pool may ever
// hand out. With HostMemoryBacking alone the slices of chunks the manager has not mapped are
// PROT_NONE, so printing such an array (NumPy reads its last block) or summing it would kill
// the interpreter with SIGSEGV. Here Reserve commits every chunk of the inner backing at once
// (the ranges are MAP_NORESERVE: a page takes memory only once touched), MapChunk only records
// the chunk, and UnmapChunk drops the chunk's pages (the inner backing's release, then its
// commit again): the memory goes back to the system as before, and the slice reads as zeros
// instead of faulting. The manager still charges its budget per map_unit_bytes of the inner
// backing. The price is at Reserve, one commit per chunk and tensor: Qwen3-8B at 40 GiB
// (18,203 chunks x 36 tensors) takes 2.7 s to create, 0.002 s without a backing, on two
// shared cores; its resident set stays at 40 MiB. Not thread-safe; it must outlive the
// manager that uses it.
#ifndef KVPAGE_PYTHON_READABLE_BACKING_H_
#define KVPAGE_PYTHON_READABLE_BACKING_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "kvpage/host_memory_backing.h"
#include "kvpage/memory_backing.h"

namespace kvpage::python {

class ReadableHostBacking final : public MemoryBacking {
 public:
  // unit_bytes as HostMemoryBacking's (0 = the page size).
  explicit ReadableHostBacking(int64_t unit_bytes) : host_(unit_bytes) {}

  // The inner Reserve's errors, or ResourceExhausted when committing a chunk fails.
  absl::Status Reserve(const MemoryLayout& layout) override;
  // InvalidArgument for a pool or chunk out of range; FailedPrecondition before Reserve or
  // when the chunk is already mapped (not mapped, for UnmapChunk).
  absl::Status MapChunk(int32_t pool, int32_t chunk) override;
  absl::Status UnmapChunk(int32_t pool, int32_t chunk) override;
  int64_t map_unit_bytes() const override { return host_.map_unit_bytes(); }

  // Views and layout (HostMemoryBacking::View, ::layout).
  const HostMemoryBacking& host() const { return host_; }
  // Chunks the manager has mapped now, over all pools.
  int64_t mapped_chunks() const { return mapped_chunks_; }

 private:
  absl::Status CheckChunk(const char* call, int32_t pool, int32_t chunk, bool expect) const;

  HostMemoryBacking host_;
  std::vector<std::vector<bool>> mapped_;  // per pool, per chunk: mapped by the manager
  int64_t mapped_chunks_ = 0;
};

}  // namespace kvpage::python

#endif  // KVPAGE_PYTHON_READABLE_BACKING_H_
