// Which units (host pages, CUDA allocation granules) of one tensor's range a pool's chunk
// covers, and which of them no other mapped chunk holds (internal). Shared by the host and
// CUDA backings.
//
// A tensor with tb bytes per block id starts block 1 on a unit boundary: the null block (id 0)
// fills the end of the first RoundUpTo(tb, unit) bytes, and block b >= 1 lies at
// RoundUpTo(tb, unit) + (b − 1)·tb. Chunk c of a pool then covers bytes
// [R + c·bpc·tb, R + (c+1)·bpc·tb), R = RoundUpTo(tb, unit): whole units of its own when
// bpc·tb is a multiple of the unit. Otherwise its first and last units may also hold
// neighbouring chunks' blocks: such a unit stays mapped while any chunk touching it is.
#ifndef KVPAGE_MEMORY_CHUNK_UNITS_H_
#define KVPAGE_MEMORY_CHUNK_UNITS_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "kvpage/memory_layout.h"

namespace kvpage::internal {

struct UnitSpan {
  int64_t first = 0;  // units [first, last)
  int64_t last = 0;
  int64_t size() const { return last - first; }
};

inline int64_t RoundUpTo(int64_t a, int64_t b) { return (a + b - 1) / b * b; }

// Byte of block 1 in a tensor's range; the null block lies just below it.
inline int64_t FirstBlockByte(int64_t tensor_block_bytes, int64_t unit) {
  return RoundUpTo(tensor_block_bytes, unit);
}

// Byte of block 0 (the null block) in a tensor's range: where its view starts.
inline int64_t ViewOffset(int64_t tensor_block_bytes, int64_t unit) {
  return FirstBlockByte(tensor_block_bytes, unit) - tensor_block_bytes;
}

// Units chunk c's slice of a tensor touches.
inline UnitSpan ChunkUnits(const PoolLayout& pool, int64_t tensor_block_bytes, int32_t c,
                           int64_t unit) {
  const int64_t lo = FirstBlockByte(tensor_block_bytes, unit) +
                     int64_t{c} * pool.blocks_per_chunk * tensor_block_bytes;
  const int64_t hi = lo + int64_t{pool.blocks_per_chunk} * tensor_block_bytes;
  return UnitSpan{lo / unit, RoundUpTo(hi, unit) / unit};
}

// The chunk holding byte `offset` of a tensor: -1 for the null block, max_chunks past the
// last block.
inline int64_t ChunkOfByte(const PoolLayout& pool, int64_t tensor_block_bytes, int64_t offset,
                           int64_t unit) {
  const int64_t first = FirstBlockByte(tensor_block_bytes, unit);
  if (offset < first) return -1;
  const int64_t block = (offset - first) / tensor_block_bytes;  // counted from block 1
  return std::min<int64_t>(block / pool.blocks_per_chunk, pool.max_chunks);
}

// Whether unit `index` holds a block of a mapped chunk other than `c` (or the null block).
inline bool HeldByOthers(const PoolLayout& pool, const std::vector<bool>& mapped,
                         int64_t tensor_block_bytes, int64_t range_bytes, int64_t index,
                         int32_t c, int64_t unit) {
  const int64_t lo = index * unit;
  const int64_t hi = std::min(lo + unit, range_bytes);
  const int64_t first = ChunkOfByte(pool, tensor_block_bytes, lo, unit);
  const int64_t last = ChunkOfByte(pool, tensor_block_bytes, hi - 1, unit);
  for (int64_t other = first; other <= last; ++other) {
    if (other == c || other >= pool.max_chunks) continue;
    if (other < 0 || mapped[other]) return true;
  }
  return false;
}

// The units of chunk c in one tensor that no other mapped chunk holds: what mapping c must
// add and unmapping it may drop.
inline UnitSpan OwnUnits(const PoolLayout& pool, const std::vector<bool>& mapped,
                         int64_t tensor_block_bytes, int64_t range_bytes, int32_t c,
                         int64_t unit) {
  UnitSpan span = ChunkUnits(pool, tensor_block_bytes, c, unit);
  if (span.first < span.last &&
      HeldByOthers(pool, mapped, tensor_block_bytes, range_bytes, span.first, c, unit)) {
    ++span.first;
  }
  if (span.first < span.last &&
      HeldByOthers(pool, mapped, tensor_block_bytes, range_bytes, span.last - 1, c, unit)) {
    --span.last;
  }
  return span;
}

// Bytes of one tensor's range: every block id of its pool, rounded up to whole units.
inline int64_t RangeBytes(const PoolLayout& pool, int64_t tensor_block_bytes, int64_t unit) {
  return RoundUpTo(FirstBlockByte(tensor_block_bytes, unit) +
                       (pool.num_blocks() - 1) * tensor_block_bytes,
                   unit);
}

// The checks MapChunk and UnmapChunk (`call`) share: FailedPrecondition before Reserve,
// InvalidArgument for a chunk the layout lacks, FailedPrecondition unless the chunk's mapped
// flag is `expect_mapped`.
inline absl::Status CheckChunkCall(absl::string_view call, bool reserved,
                                   const std::vector<std::vector<bool>>& mapped, int32_t pool,
                                   int32_t chunk, bool expect_mapped) {
  if (!reserved) return absl::FailedPreconditionError(absl::StrCat(call, " before Reserve"));
  if (pool < 0 || static_cast<size_t>(pool) >= mapped.size() || chunk < 0 ||
      static_cast<size_t>(chunk) >= mapped[pool].size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(call, ": no chunk ", chunk, " in pool ", pool));
  }
  if (mapped[pool][chunk] != expect_mapped) {
    return absl::FailedPreconditionError(absl::StrCat(
        "chunk ", chunk, " of pool ", pool, expect_mapped ? " is not mapped" : " is already mapped"));
  }
  return absl::OkStatus();
}

}  // namespace kvpage::internal

#endif  // KVPAGE_MEMORY_CHUNK_UNITS_H_
