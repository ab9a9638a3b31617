// Strong id types and small value types shared by the block manager and scheduler.
//
// Ids are plain integers wrapped in distinct types so a block id cannot be passed where a
// request id is expected. They are trivially copyable and hashable (Abseil).
#ifndef KVPAGE_TYPES_H_
#define KVPAGE_TYPES_H_

#include <compare>
#include <cstdint>
#include <utility>

namespace kvpage {

template <typename Tag, typename Int>
struct StrongId {
  Int value = -1;

  constexpr StrongId() = default;
  constexpr explicit StrongId(Int v) : value(v) {}
  constexpr bool valid() const { return value >= 0; }
  friend constexpr auto operator<=>(StrongId, StrongId) = default;
  template <typename H>
  friend H AbslHashValue(H h, StrongId id) {
    return H::combine(std::move(h), id.value);
  }
};

struct BlockIdTag {};
struct GroupIdTag {};
struct RequestIdTag {};

// Index of a page within one pool. Id 0 of every attention pool is the null block: it stands
// for positions a request no longer holds (out of a sliding window) and is never allocated.
using BlockId = StrongId<BlockIdTag, int32_t>;
// Index of a layer group (ModelSpec::groups order in kvpage mode).
using GroupId = StrongId<GroupIdTag, int32_t>;
// A caller-chosen request id, unique among live requests.
using RequestId = StrongId<RequestIdTag, int64_t>;

inline constexpr BlockId kNullBlock{0};

// A 128-bit block hash: XXH3-128, or the first 16 bytes of a SHA-256 digest.
struct BlockHash {
  uint64_t lo = 0;
  uint64_t hi = 0;

  friend constexpr bool operator==(BlockHash, BlockHash) = default;
  template <typename H>
  friend H AbslHashValue(H h, BlockHash b) {
    return H::combine(std::move(h), b.lo, b.hi);
  }
};

}  // namespace kvpage

#endif  // KVPAGE_TYPES_H_
