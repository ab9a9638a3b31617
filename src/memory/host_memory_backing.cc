// Reserving, committing and releasing the host backing's per-tensor ranges.
//
// Chunk c of a pool covers bytes [(1 + c·bpc)·tb, (1 + (c+1)·bpc)·tb) of a tensor with tb
// bytes per block id. Its first and last pages may also hold neighbouring chunks' blocks (or
// the null block): such a page is committed while any chunk touching it is mapped, so
// mapping commits, and unmapping releases, only the pages no other mapped chunk holds.
#include "kvpage/host_memory_backing.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "internal/status_macros.h"
#include "memory/host_backing_state.h"

namespace kvpage {
namespace {

using internal::VirtualRange;

int64_t RoundUpTo(int64_t a, int64_t b) { return (a + b - 1) / b * b; }

// Pages [first, last) of a tensor that chunk c's slice touches.
struct PageSpan {
  int64_t first = 0;
  int64_t last = 0;
};

PageSpan ChunkPages(const PoolLayout& pool, int64_t tensor_block_bytes, int32_t c) {
  const int64_t page = VirtualRange::PageSize();
  const int64_t lo = (1 + int64_t{c} * pool.blocks_per_chunk) * tensor_block_bytes;
  const int64_t hi = lo + int64_t{pool.blocks_per_chunk} * tensor_block_bytes;
  return PageSpan{lo / page, RoundUpTo(hi, page) / page};
}

// The chunk holding byte `offset` of a tensor: -1 for the null block, max_chunks past the
// last block.
int64_t ChunkOfByte(const PoolLayout& pool, int64_t tensor_block_bytes, int64_t offset) {
  const int64_t block = offset / tensor_block_bytes;
  if (block == 0) return -1;
  return std::min<int64_t>((block - 1) / pool.blocks_per_chunk, pool.max_chunks);
}

}  // namespace

HostMemoryBacking::HostMemoryBacking() : state_(std::make_unique<State>()) {}
HostMemoryBacking::~HostMemoryBacking() = default;

const MemoryLayout& HostMemoryBacking::layout() const { return state_->layout; }
int64_t HostMemoryBacking::mapped_bytes() const { return state_->mapped_bytes; }
int64_t HostMemoryBacking::peak_mapped_bytes() const { return state_->peak_mapped_bytes; }
int64_t HostMemoryBacking::reserved_bytes() const { return state_->reserved_bytes; }

bool HostMemoryBacking::IsChunkMapped(int32_t pool, int32_t chunk) const {
  if (pool < 0 || static_cast<size_t>(pool) >= state_->mapped.size()) return false;
  const std::vector<bool>& m = state_->mapped[pool];
  return chunk >= 0 && static_cast<size_t>(chunk) < m.size() && m[chunk];
}

absl::Status HostMemoryBacking::Reserve(const MemoryLayout& layout) {
  State& s = *state_;
  if (s.reserved) return absl::FailedPreconditionError("HostMemoryBacking reserved twice");
  if (layout.tensors.empty()) {
    return absl::UnimplementedError(
        "HostMemoryBacking needs per-layer tensors (kvpage accounting); the layout has none");
  }
  State fresh;
  fresh.layout = layout;
  fresh.pool_tensors.resize(layout.pools.size());
  fresh.mapped.resize(layout.pools.size());
  for (size_t p = 0; p < layout.pools.size(); ++p) {
    fresh.mapped[p].assign(static_cast<size_t>(layout.pools[p].max_chunks), false);
  }
  const int64_t page = VirtualRange::PageSize();
  for (size_t i = 0; i < layout.tensors.size(); ++i) {
    const CacheTensor& t = layout.tensors[i];
    if (t.pool < 0 || static_cast<size_t>(t.pool) >= layout.pools.size() || t.block_bytes <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", i, " of layer ", t.layer,
                                                     " names pool ", t.pool, " with ",
                                                     t.block_bytes, " bytes per block"));
    }
    const int64_t bytes = RoundUpTo(layout.pools[t.pool].num_blocks() * t.block_bytes, page);
    KVPAGE_ASSIGN_OR_RETURN(VirtualRange range, VirtualRange::Reserve(bytes));
    // The null block is always mapped: padded block-table entries point at it.
    const int64_t null_bytes = RoundUpTo(t.block_bytes, page);
    KVPAGE_RETURN_IF_ERROR(range.Commit(0, null_bytes));
    fresh.mapped_bytes += null_bytes;
    fresh.reserved_bytes += bytes;
    fresh.ranges.push_back(std::move(range));
    fresh.pool_tensors[t.pool].push_back(static_cast<int32_t>(i));
  }
  fresh.peak_mapped_bytes = fresh.mapped_bytes;
  fresh.reserved = true;
  *state_ = std::move(fresh);
  return absl::OkStatus();
}

namespace {

// Whether a page of a tensor holds a block of a mapped chunk other than `c` (or the null
// block), so it stays committed whatever happens to c.
bool HeldByOthers(const PoolLayout& pool, const std::vector<bool>& mapped, int64_t tensor_bytes,
                  int64_t range_bytes, int64_t page_index, int32_t c) {
  const int64_t page = VirtualRange::PageSize();
  const int64_t lo = page_index * page;
  const int64_t hi = std::min(lo + page, range_bytes);
  const int64_t first = ChunkOfByte(pool, tensor_bytes, lo);
  const int64_t last = ChunkOfByte(pool, tensor_bytes, hi - 1);
  for (int64_t other = first; other <= last; ++other) {
    if (other == c || other >= pool.max_chunks) continue;
    if (other < 0 || mapped[other]) return true;
  }
  return false;
}

// The pages of chunk c in one tensor that no other mapped chunk holds.
PageSpan OwnPages(const PoolLayout& pool, const std::vector<bool>& mapped, int64_t tensor_bytes,
                  int64_t range_bytes, int32_t c) {
  PageSpan span = ChunkPages(pool, tensor_bytes, c);
  if (span.first < span.last &&
      HeldByOthers(pool, mapped, tensor_bytes, range_bytes, span.first, c)) {
    ++span.first;
  }
  if (span.first < span.last &&
      HeldByOthers(pool, mapped, tensor_bytes, range_bytes, span.last - 1, c)) {
    --span.last;
  }
  return span;
}

}  // namespace

absl::Status HostMemoryBacking::MapChunk(int32_t pool, int32_t chunk) {
  State& s = *state_;
  if (!s.reserved) return absl::FailedPreconditionError("MapChunk before Reserve");
  if (pool < 0 || static_cast<size_t>(pool) >= s.mapped.size() || chunk < 0 ||
      static_cast<size_t>(chunk) >= s.mapped[pool].size()) {
    return absl::InvalidArgumentError(absl::StrCat("MapChunk: no chunk ", chunk, " in pool ", pool));
  }
  if (s.mapped[pool][chunk]) {
    return absl::FailedPreconditionError(
        absl::StrCat("chunk ", chunk, " of pool ", pool, " is already mapped"));
  }
  const PoolLayout& layout = s.layout.pools[pool];
  const int64_t page = VirtualRange::PageSize();
  int64_t committed = 0;
  size_t done = 0;
  absl::Status status;
  for (; done < s.pool_tensors[pool].size(); ++done) {
    const int32_t t = s.pool_tensors[pool][done];
    const int64_t tb = s.layout.tensors[t].block_bytes;
    const PageSpan own = OwnPages(layout, s.mapped[pool], tb, s.ranges[t].size(), chunk);
    status = s.ranges[t].Commit(own.first * page, (own.last - own.first) * page);
    if (!status.ok()) break;
    committed += (own.last - own.first) * page;
  }
  if (!status.ok()) {  // give back what this call committed, the failed tensor's pages included
    for (size_t i = 0; i <= done && i < s.pool_tensors[pool].size(); ++i) {
      const int32_t t = s.pool_tensors[pool][i];
      const PageSpan own = OwnPages(layout, s.mapped[pool], s.layout.tensors[t].block_bytes,
                                    s.ranges[t].size(), chunk);
      s.ranges[t].Release(own.first * page, (own.last - own.first) * page).IgnoreError();
    }
    return absl::ResourceExhaustedError(absl::StrCat("MapChunk: chunk ", chunk, " of pool ", pool,
                                                     ", layer ", s.layout.tensors[s.pool_tensors[pool][done]].layer,
                                                     ": ", status.message()));
  }
  s.mapped[pool][chunk] = true;
  s.mapped_bytes += committed;
  s.peak_mapped_bytes = std::max(s.peak_mapped_bytes, s.mapped_bytes);
  return absl::OkStatus();
}

absl::Status HostMemoryBacking::UnmapChunk(int32_t pool, int32_t chunk) {
  State& s = *state_;
  if (!s.reserved) return absl::FailedPreconditionError("UnmapChunk before Reserve");
  if (pool < 0 || static_cast<size_t>(pool) >= s.mapped.size() || chunk < 0 ||
      static_cast<size_t>(chunk) >= s.mapped[pool].size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("UnmapChunk: no chunk ", chunk, " in pool ", pool));
  }
  if (!s.mapped[pool][chunk]) {
    return absl::FailedPreconditionError(
        absl::StrCat("chunk ", chunk, " of pool ", pool, " is not mapped"));
  }
  s.mapped[pool][chunk] = false;
  const PoolLayout& layout = s.layout.pools[pool];
  const int64_t page = VirtualRange::PageSize();
  absl::Status first_error;
  for (int32_t t : s.pool_tensors[pool]) {
    const PageSpan own = OwnPages(layout, s.mapped[pool], s.layout.tensors[t].block_bytes,
                                  s.ranges[t].size(), chunk);
    absl::Status released = s.ranges[t].Release(own.first * page, (own.last - own.first) * page);
    if (released.ok()) {
      s.mapped_bytes -= (own.last - own.first) * page;
    } else if (first_error.ok()) {
      first_error = released;
    }
  }
  return first_error;
}

}  // namespace kvpage
