// Reserving, committing and releasing the host backing's per-tensor ranges, a page at a time
// (memory/chunk_units.h: which pages a chunk owns).
#include "kvpage/host_memory_backing.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "internal/status_macros.h"
#include "memory/chunk_units.h"
#include "memory/host_backing_state.h"

namespace kvpage {
namespace {

using internal::OwnUnits;
using internal::RoundUpTo;
using internal::UnitSpan;
using internal::VirtualRange;

}  // namespace

HostMemoryBacking::HostMemoryBacking(int64_t unit_bytes) : state_(std::make_unique<State>()) {
  state_->unit_bytes = unit_bytes;
}

int64_t HostMemoryBacking::map_unit_bytes() const {
  // 0 = the page size; any other value as given (Reserve and KvCacheManager::Create check it).
  return state_->unit_bytes != 0 ? state_->unit_bytes : VirtualRange::PageSize();
}
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
  const int64_t page = VirtualRange::PageSize();
  const int64_t unit = map_unit_bytes();
  if (unit < page || (unit & (unit - 1)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "HostMemoryBacking unit_bytes ", unit, " is not a power of two >= the page size ", page));
  }
  State fresh;
  fresh.unit_bytes = s.unit_bytes;
  fresh.unit = unit;
  fresh.layout = layout;
  fresh.pool_tensors.resize(layout.pools.size());
  fresh.mapped.resize(layout.pools.size());
  for (size_t p = 0; p < layout.pools.size(); ++p) {
    fresh.mapped[p].assign(static_cast<size_t>(layout.pools[p].max_chunks), false);
  }
  for (size_t i = 0; i < layout.tensors.size(); ++i) {
    const CacheTensor& t = layout.tensors[i];
    if (t.pool < 0 || static_cast<size_t>(t.pool) >= layout.pools.size() || t.block_bytes <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", i, " of layer ", t.layer,
                                                     " names pool ", t.pool, " with ",
                                                     t.block_bytes, " bytes per block"));
    }
    const int64_t bytes = internal::RangeBytes(layout.pools[t.pool], t.block_bytes, unit);
    KVPAGE_ASSIGN_OR_RETURN(VirtualRange range, VirtualRange::Reserve(bytes));
    // The null block is always mapped: padded block-table entries point at it.
    const int64_t null_bytes = RoundUpTo(t.block_bytes, unit);
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

absl::Status HostMemoryBacking::MapChunk(int32_t pool, int32_t chunk) {
  State& s = *state_;
  KVPAGE_RETURN_IF_ERROR(internal::CheckChunkCall("MapChunk", s.reserved, s.mapped, pool, chunk,
                                                /*expect_mapped=*/false));
  const PoolLayout& layout = s.layout.pools[pool];
  const int64_t page = s.unit;
  int64_t committed = 0;
  size_t done = 0;
  absl::Status status;
  for (; done < s.pool_tensors[pool].size(); ++done) {
    const int32_t t = s.pool_tensors[pool][done];
    const int64_t tb = s.layout.tensors[t].block_bytes;
    const UnitSpan own = OwnUnits(layout, s.mapped[pool], tb, s.ranges[t].size(), chunk, page);
    status = s.ranges[t].Commit(own.first * page, (own.last - own.first) * page);
    if (!status.ok()) break;
    committed += (own.last - own.first) * page;
  }
  if (!status.ok()) {  // give back what this call committed, the failed tensor's pages included
    for (size_t i = 0; i <= done && i < s.pool_tensors[pool].size(); ++i) {
      const int32_t t = s.pool_tensors[pool][i];
      const UnitSpan own = OwnUnits(layout, s.mapped[pool], s.layout.tensors[t].block_bytes,
                                    s.ranges[t].size(), chunk, page);
      s.ranges[t].Release(own.first * page, (own.last - own.first) * page).IgnoreError();
    }
    const int32_t layer = s.layout.tensors[s.pool_tensors[pool][done]].layer;
    return absl::ResourceExhaustedError(absl::StrCat("MapChunk: chunk ", chunk, " of pool ", pool,
                                                     ", layer ", layer, ": ", status.message()));
  }
  s.mapped[pool][chunk] = true;
  s.mapped_bytes += committed;
  s.peak_mapped_bytes = std::max(s.peak_mapped_bytes, s.mapped_bytes);
  return absl::OkStatus();
}

absl::Status HostMemoryBacking::UnmapChunk(int32_t pool, int32_t chunk) {
  State& s = *state_;
  KVPAGE_RETURN_IF_ERROR(internal::CheckChunkCall("UnmapChunk", s.reserved, s.mapped, pool,
                                                chunk, /*expect_mapped=*/true));
  s.mapped[pool][chunk] = false;
  const PoolLayout& layout = s.layout.pools[pool];
  const int64_t page = s.unit;
  absl::Status first_error;
  for (int32_t t : s.pool_tensors[pool]) {
    const UnitSpan own = OwnUnits(layout, s.mapped[pool], s.layout.tensors[t].block_bytes,
                                  s.ranges[t].size(), chunk, page);
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
