// BlockPool and MemoryBudget with exact block ids, counts and events: vLLM's free-queue order
// within one chunk (vllm.md T11, T12), kvpage's chunks (lazy mapping, fullest-chunk-first,
// idle-chunk release) and two pools trading chunks through one budget.
#include "block/block_pool.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <ostream>
#include <utility>
#include <vector>

#include "block/manager_test_util.h"
#include "block/memory_budget.h"
#include "internal/huge_page_allocator.h"
#include "kvpage/kv_cache_manager.h"
#include "kvpage/kv_events.h"
#include "kvpage/types.h"

namespace kvpage {

// Readable failure messages.
template <typename Tag, typename Int>
void PrintTo(const StrongId<Tag, Int>& id, std::ostream* os) {
  *os << "#" << id.value;
}
void PrintTo(const BlockHash& h, std::ostream* os) { *os << "H{" << h.lo << "," << h.hi << "}"; }
void PrintTo(const KvEvent& e, std::ostream* os) {
  static constexpr const char* kNames[] = {"stored", "removed", "all_cleared"};
  *os << kNames[static_cast<int>(e.type)] << "(g" << e.group.value << ", ";
  PrintTo(e.hash, os);
  *os << ", parent ";
  PrintTo(e.parent, os);
  *os << ")";
}

namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using testing::H;

constexpr GroupId kG0{0};
constexpr GroupId kG1{1};

// Distinct, recognisable hashes: H(i) for the i-th block of a chain.
constexpr BlockHash H(uint64_t i) { return BlockHash{i, 0xABCD0000 + i}; }
constexpr BlockHash kRoot{0, 0};

std::vector<int32_t> Ids(absl::Span<const BlockId> blocks) {
  std::vector<int32_t> ids;
  for (BlockId b : blocks) ids.push_back(b.value);
  return ids;
}

std::vector<BlockId> Blocks(std::initializer_list<int32_t> ids) {
  std::vector<BlockId> out;
  for (int32_t id : ids) out.push_back(BlockId(id));
  return out;
}

std::vector<int32_t> Take(BlockPool& pool, int32_t n) {
  std::vector<BlockId> out;
  EXPECT_TRUE(pool.Allocate(n, &out));
  return Ids(out);
}

KvEvent Stored(GroupId g, BlockHash hash, BlockHash parent) {
  return KvEvent{KvEvent::Type::kStored, g, hash, parent};
}
KvEvent Removed(GroupId g, BlockHash hash) {
  return KvEvent{KvEvent::Type::kRemoved, g, hash, BlockHash{}};
}
KvEvent AllCleared() { return KvEvent{KvEvent::Type::kAllCleared, GroupId(), {}, {}}; }

#define ASSERT_POOL_OK(pool)                          \
  do {                                                \
    const absl::Status s_ = (pool).CheckInvariants(); \
    ASSERT_TRUE(s_.ok()) << s_;                       \
  } while (false)

// Records what the budget asks its backing to map and unmap.
class RecordingBacking final : public MemoryBacking {
 public:
  absl::Status MapChunk(int32_t pool, int32_t chunk) override {
    calls.push_back({+1, pool, chunk});
    return refuse ? absl::ResourceExhaustedError("refused") : absl::OkStatus();
  }
  absl::Status UnmapChunk(int32_t pool, int32_t chunk) override {
    calls.push_back({-1, pool, chunk});
    return absl::OkStatus();
  }
  struct Call {
    int32_t op, pool, chunk;
    friend bool operator==(const Call&, const Call&) = default;
  };
  std::vector<Call> calls;
  bool refuse = false;
};

// ---- One chunk: vLLM's free queue ----------------------------------------------------------

constexpr int64_t kBlockBytes = 64;

// One chunk of 10 blocks; the budget holds exactly that chunk.
struct OneChunk {
  MemoryBudget budget{10 * kBlockBytes};
  KvEventLog events{/*enabled=*/true};
  BlockPool pool{
      BlockPoolConfig{
          .pool_index = 0, .block_bytes = kBlockBytes, .blocks_per_chunk = 10, .max_chunks = 1},
      &budget, &events};
};

TEST(BlockPoolConfigTest, Validate) {
  EXPECT_TRUE((BlockPoolConfig{.block_bytes = 1, .blocks_per_chunk = 1}).Validate().ok());
  EXPECT_TRUE(absl::IsInvalidArgument((BlockPoolConfig{.block_bytes = 0}).Validate()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      (BlockPoolConfig{.block_bytes = 1, .blocks_per_chunk = 0}).Validate()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      (BlockPoolConfig{.block_bytes = 1, .blocks_per_chunk = 1, .max_chunks = -1}).Validate()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      (BlockPoolConfig{.block_bytes = 1, .blocks_per_chunk = 1 << 16, .max_chunks = 1 << 15})
          .Validate()));
}

TEST(BlockPoolTest, AllocatesIdsInOrderAndMapsOnFirstUse) {
  OneChunk f;
  BlockPool& pool = f.pool;
  EXPECT_EQ(pool.capacity(), 10);
  EXPECT_EQ(pool.chunk_bytes(), 640);
  EXPECT_EQ(pool.num_mapped_chunks(), 0);
  EXPECT_EQ(pool.num_free_blocks(), 0);
  EXPECT_EQ(pool.AllocatableNow(), 10);
  EXPECT_EQ(f.budget.used_bytes(), 0);
  // Nothing is mapped yet, but every block can be handed out, in id order (vLLM's free queue).
  EXPECT_THAT(Ids(pool.FreeOrder()), ElementsAre(1, 2, 3, 4, 5, 6, 7, 8, 9, 10));
  EXPECT_FALSE(pool.is_mapped(BlockId(1)));
  EXPECT_FALSE(pool.is_mapped(kNullBlock));
  ASSERT_POOL_OK(pool);
  for (int32_t id = 1; id <= 10; ++id) {
    EXPECT_THAT(Take(pool, 1), ElementsAre(id));
    ASSERT_POOL_OK(pool);
    EXPECT_EQ(pool.num_used_blocks(), id);
    EXPECT_EQ(pool.num_clean_blocks(), 10 - id);
    EXPECT_EQ(pool.AllocatableNow(), 10 - id);
    EXPECT_EQ(pool.ref_count(BlockId(id)), 1);
    EXPECT_EQ(pool.num_mapped_chunks(), 1);
    EXPECT_EQ(pool.num_idle_chunks(), 0);
    EXPECT_EQ(f.budget.used_bytes(), 640);
  }
  EXPECT_TRUE(pool.is_mapped(BlockId(10)));
  EXPECT_THAT(Ids(pool.FreeOrder()), IsEmpty());
  EXPECT_EQ(f.events.size(), 0u);
}

// One-block chunks (blocks of 2 MiB and more): a chunk mapped for an allocation goes
// straight into use, and a freed block's chunk is idle and reused before a new one is mapped.
TEST(BlockPoolTest, OneBlockChunksMapStraightIntoUse) {
  MemoryBudget budget{4 * kBlockBytes};
  KvEventLog events{/*enabled=*/true};
  BlockPool pool{BlockPoolConfig{.pool_index = 0, .block_bytes = kBlockBytes,
                                 .blocks_per_chunk = 1, .max_chunks = 4},
                 &budget, &events};
  for (int32_t id = 1; id <= 3; ++id) {
    EXPECT_THAT(Take(pool, 1), ElementsAre(id));
    ASSERT_POOL_OK(pool);
    EXPECT_EQ(pool.num_mapped_chunks(), id);
    EXPECT_EQ(pool.num_used_blocks(), id);
    EXPECT_EQ(pool.num_clean_blocks(), 0);
    EXPECT_EQ(pool.num_idle_chunks(), 0);
    EXPECT_EQ(budget.used_bytes(), id * kBlockBytes);
  }
  pool.Free(Blocks({2}));
  ASSERT_POOL_OK(pool);
  EXPECT_EQ(pool.num_idle_chunks(), 1);
  EXPECT_EQ(pool.num_clean_blocks(), 1);
  EXPECT_THAT(Take(pool, 2), ElementsAre(2, 4));  // the clean block first, then a new chunk
  ASSERT_POOL_OK(pool);
  EXPECT_EQ(pool.num_mapped_chunks(), 4);
  EXPECT_EQ(pool.num_idle_chunks(), 0);
  EXPECT_EQ(pool.AllocatableNow(), 0);
  pool.Free(Blocks({4, 3, 2, 1}));
  ASSERT_POOL_OK(pool);
  EXPECT_EQ(pool.num_idle_chunks(), 4);
  EXPECT_EQ(pool.num_used_blocks(), 0);
}

TEST(BlockPoolTest, UnhashedFreesAreReusedFirstLifo) {
  OneChunk f;
  BlockPool& pool = f.pool;
  EXPECT_THAT(Take(pool, 4), ElementsAre(1, 2, 3, 4));
  pool.Free(Blocks({2, 4}));
  ASSERT_POOL_OK(pool);
  EXPECT_EQ(pool.num_used_blocks(), 2);
  EXPECT_EQ(pool.num_clean_blocks(), 8);
  EXPECT_EQ(pool.num_cached_free_blocks(), 0);
  EXPECT_EQ(pool.ref_count(BlockId(4)), 0);
  EXPECT_THAT(Ids(pool.FreeOrder()), ElementsAre(4, 2, 5, 6, 7, 8, 9, 10));
  EXPECT_THAT(Take(pool, 3), ElementsAre(4, 2, 5));
  ASSERT_POOL_OK(pool);
  EXPECT_THAT(Ids(pool.FreeOrder()), ElementsAre(6, 7, 8, 9, 10));
  // Null ids in a table are skipped.
  pool.Free(Blocks({0, 5, 0}));
  ASSERT_POOL_OK(pool);
  EXPECT_THAT(Ids(pool.FreeOrder()), ElementsAre(5, 6, 7, 8, 9, 10));
}

TEST(BlockPoolTest, CachedBlocksAreEvictedOldestFirstAfterCleanOnes) {
  OneChunk f;
  BlockPool& pool = f.pool;
  EXPECT_THAT(Take(pool, 10), ElementsAre(1, 2, 3, 4, 5, 6, 7, 8, 9, 10));
  pool.CacheBlock(BlockId(1), H(1), kG0, kRoot);
  pool.CacheBlock(BlockId(2), H(2), kG0, H(1));
  pool.CacheBlock(BlockId(3), H(3), kG0, H(2));
  ASSERT_POOL_OK(pool);
  EXPECT_THAT(f.events.Drain(), ElementsAre(Stored(kG0, H(1), kRoot), Stored(kG0, H(2), H(1)),
                                            Stored(kG0, H(3), H(2))));
  EXPECT_TRUE(pool.is_cached(BlockId(2)));
  EXPECT_EQ(pool.block_hash(BlockId(2)), H(2));
  EXPECT_EQ(pool.Lookup(H(2), kG0), BlockId(2));
  EXPECT_EQ(pool.Lookup(H(2), kG1), kNullBlock);  // the key includes the group
  EXPECT_EQ(pool.num_cached_free_blocks(), 0);    // still used

  pool.Free(Blocks({3, 2, 1}));  // a request's blocks, last to first
  ASSERT_POOL_OK(pool);
  pool.Free(Blocks({7}));
  ASSERT_POOL_OK(pool);
  pool.Free(Blocks({5}));
  ASSERT_POOL_OK(pool);
  EXPECT_EQ(pool.num_cached_free_blocks(), 3);
  EXPECT_EQ(pool.num_clean_blocks(), 2);
  EXPECT_EQ(pool.num_free_blocks(), 5);
  EXPECT_EQ(pool.AllocatableNow(), 5);
  EXPECT_THAT(Ids(pool.FreeOrder()), ElementsAre(5, 7, 3, 2, 1));
  EXPECT_EQ(f.events.size(), 0u);  // freeing keeps the hashes

  EXPECT_THAT(Take(pool, 2), ElementsAre(5, 7));  // clean blocks first
  ASSERT_POOL_OK(pool);
  EXPECT_EQ(f.events.size(), 0u);
  EXPECT_THAT(Take(pool, 1), ElementsAre(3));  // then the least recently freed cached block
  ASSERT_POOL_OK(pool);
  EXPECT_THAT(f.events.Drain(), ElementsAre(Removed(kG0, H(3))));
  EXPECT_FALSE(pool.is_cached(BlockId(3)));
  EXPECT_EQ(pool.block_hash(BlockId(3)), BlockHash{});
  EXPECT_EQ(pool.Lookup(H(3), kG0), kNullBlock);
  EXPECT_EQ(pool.Lookup(H(2), kG0), BlockId(2));
  EXPECT_EQ(pool.Lookup(H(1), kG0), BlockId(1));
  EXPECT_THAT(Ids(pool.FreeOrder()), ElementsAre(2, 1));
  EXPECT_EQ(pool.num_cached_free_blocks(), 2);
  EXPECT_EQ(pool.num_used_blocks(), 8);

  // The reused page is unhashed now: freeing it makes it clean (reused first).
  pool.Free(Blocks({3}));
  ASSERT_POOL_OK(pool);
  EXPECT_THAT(Ids(pool.FreeOrder()), ElementsAre(3, 2, 1));
  EXPECT_THAT(Take(pool, 3), ElementsAre(3, 2, 1));
  ASSERT_POOL_OK(pool);
  EXPECT_THAT(f.events.Drain(), ElementsAre(Removed(kG0, H(2)), Removed(kG0, H(1))));
  EXPECT_EQ(pool.Lookup(H(1), kG0), kNullBlock);
}

TEST(BlockPoolTest, CachingABlockTwiceOrWithCachingOffIsANoOp) {
  MemoryBudget budget(4 * kBlockBytes);
  KvEventLog events(true);
  BlockPool off(BlockPoolConfig{.block_bytes = kBlockBytes,
                                .blocks_per_chunk = 4,
                                .max_chunks = 1,
                                .enable_caching = false},
                &budget, &events);
  EXPECT_THAT(Take(off, 1), ElementsAre(1));
  off.CacheBlock(BlockId(1), H(1), kG0, kRoot);
  ASSERT_POOL_OK(off);
  EXPECT_FALSE(off.is_cached(BlockId(1)));
  EXPECT_EQ(off.Lookup(H(1), kG0), kNullBlock);
  EXPECT_EQ(events.size(), 0u);
  off.Free(Blocks({1}));
  ASSERT_POOL_OK(off);
  EXPECT_EQ(off.num_clean_blocks(), 4);

  OneChunk f;
  EXPECT_THAT(Take(f.pool, 1), ElementsAre(1));
  f.pool.CacheBlock(BlockId(1), H(1), kG0, kRoot);
  f.pool.CacheBlock(BlockId(1), H(9), kG1, H(8));  // already hashed: ignored
  ASSERT_POOL_OK(f.pool);
  EXPECT_EQ(f.pool.block_hash(BlockId(1)), H(1));
  EXPECT_EQ(f.pool.Lookup(H(9), kG1), kNullBlock);
  EXPECT_THAT(f.events.Drain(), ElementsAre(Stored(kG0, H(1), kRoot)));
}

TEST(BlockPoolTest, EventsAreNotRecordedWhileTheLogIsDisabled) {
  MemoryBudget budget(2 * kBlockBytes);
  KvEventLog events(/*enabled=*/false);
  BlockPool pool(
      BlockPoolConfig{.block_bytes = kBlockBytes, .blocks_per_chunk = 2, .max_chunks = 1}, &budget,
      &events);
  EXPECT_THAT(Take(pool, 2), ElementsAre(1, 2));
  pool.CacheBlock(BlockId(1), H(1), kG0, kRoot);
  pool.Free(Blocks({1, 2}));
  EXPECT_THAT(Take(pool, 2), ElementsAre(2, 1));  // evicts block 1
  ASSERT_POOL_OK(pool);
  EXPECT_EQ(events.size(), 0u);
  EXPECT_EQ(pool.Lookup(H(1), kG0), kNullBlock);
}

TEST(BlockPoolTest, TouchTakesACachedFreeBlockOffTheLru) {
  OneChunk f;
  BlockPool& pool = f.pool;
  EXPECT_THAT(Take(pool, 3), ElementsAre(1, 2, 3));
  for (int32_t i = 1; i <= 3; ++i) pool.CacheBlock(BlockId(i), H(i), kG0, i > 1 ? H(i - 1) : kRoot);
  pool.Free(Blocks({3, 2, 1}));
  ASSERT_POOL_OK(pool);
  EXPECT_THAT(Ids(pool.FreeOrder()), ElementsAre(4, 5, 6, 7, 8, 9, 10, 3, 2, 1));
  f.events.Drain();

  pool.Touch(Blocks({2}));  // a prefix hit
  ASSERT_POOL_OK(pool);
  EXPECT_EQ(pool.ref_count(BlockId(2)), 1);
  EXPECT_TRUE(pool.is_cached(BlockId(2)));
  EXPECT_EQ(pool.num_used_blocks(), 1);
  EXPECT_EQ(pool.num_cached_free_blocks(), 2);
  EXPECT_THAT(Ids(pool.FreeOrder()), ElementsAre(4, 5, 6, 7, 8, 9, 10, 3, 1));
  pool.Touch(Blocks({2}));  // a second request shares it
  ASSERT_POOL_OK(pool);
  EXPECT_EQ(pool.ref_count(BlockId(2)), 2);
  EXPECT_EQ(pool.num_used_blocks(), 1);
  pool.Free(Blocks({2}));
  ASSERT_POOL_OK(pool);
  EXPECT_EQ(pool.ref_count(BlockId(2)), 1);
  EXPECT_THAT(Ids(pool.FreeOrder()), ElementsAre(4, 5, 6, 7, 8, 9, 10, 3, 1));
  pool.Free(Blocks({2}));  // the last reference: back at the LRU tail
  ASSERT_POOL_OK(pool);
  EXPECT_THAT(Ids(pool.FreeOrder()), ElementsAre(4, 5, 6, 7, 8, 9, 10, 3, 1, 2));
  EXPECT_EQ(f.events.size(), 0u);  // hits and frees emit nothing
}

// T12: two blocks cached under one (hash, group).
TEST(BlockPoolTest, DuplicateKeysEvictFirstBlockFirst) {
  OneChunk f;
  BlockPool& pool = f.pool;
  EXPECT_THAT(Take(pool, 2), ElementsAre(1, 2));
  pool.CacheBlock(BlockId(1), H(7), kG0, kRoot);
  pool.CacheBlock(BlockId(2), H(7), kG0, kRoot);  // same key: chained, no second event
  ASSERT_POOL_OK(pool);
  EXPECT_THAT(f.events.Drain(), ElementsAre(Stored(kG0, H(7), kRoot)));
  EXPECT_EQ(pool.Lookup(H(7), kG0), BlockId(1));
  EXPECT_TRUE(pool.is_cached(BlockId(2)));

  pool.Free(Blocks({1}));
  pool.Free(Blocks({2}));
  ASSERT_POOL_OK(pool);
  EXPECT_THAT(Ids(pool.FreeOrder()), ElementsAre(3, 4, 5, 6, 7, 8, 9, 10, 1, 2));
  EXPECT_THAT(Take(pool, 8), ElementsAre(3, 4, 5, 6, 7, 8, 9, 10));
  ASSERT_POOL_OK(pool);
  EXPECT_THAT(Take(pool, 1), ElementsAre(1));  // evicting the first keeps the key alive
  ASSERT_POOL_OK(pool);
  EXPECT_EQ(f.events.size(), 0u);
  EXPECT_EQ(pool.Lookup(H(7), kG0), BlockId(2));
  EXPECT_FALSE(pool.is_cached(BlockId(1)));
  EXPECT_THAT(Take(pool, 1), ElementsAre(2));  // evicting both removes the key
  ASSERT_POOL_OK(pool);
  EXPECT_EQ(pool.Lookup(H(7), kG0), kNullBlock);
  EXPECT_THAT(f.events.Drain(), ElementsAre(Removed(kG0, H(7))));
}

TEST(BlockPoolTest, DuplicateKeysEvictSecondBlockFirst) {
  OneChunk f;
  BlockPool& pool = f.pool;
  EXPECT_THAT(Take(pool, 3), ElementsAre(1, 2, 3));
  pool.CacheBlock(BlockId(1), H(7), kG0, kRoot);
  pool.CacheBlock(BlockId(2), H(7), kG0, kRoot);
  pool.CacheBlock(BlockId(3), H(7), kG1, kRoot);  // another group: its own key
  ASSERT_POOL_OK(pool);
  EXPECT_THAT(f.events.Drain(), ElementsAre(Stored(kG0, H(7), kRoot), Stored(kG1, H(7), kRoot)));
  pool.Free(Blocks({2, 1, 3}));
  ASSERT_POOL_OK(pool);
  EXPECT_THAT(Take(pool, 7), ElementsAre(4, 5, 6, 7, 8, 9, 10));
  EXPECT_THAT(Take(pool, 1), ElementsAre(2));  // the chained duplicate goes silently
  ASSERT_POOL_OK(pool);
  EXPECT_EQ(f.events.size(), 0u);
  EXPECT_EQ(pool.Lookup(H(7), kG0), BlockId(1));
  EXPECT_THAT(Take(pool, 1), ElementsAre(1));
  ASSERT_POOL_OK(pool);
  EXPECT_THAT(f.events.Drain(), ElementsAre(Removed(kG0, H(7))));
  EXPECT_EQ(pool.Lookup(H(7), kG0), kNullBlock);
  EXPECT_EQ(pool.Lookup(H(7), kG1), BlockId(3));
  EXPECT_THAT(Take(pool, 1), ElementsAre(3));
  ASSERT_POOL_OK(pool);
  EXPECT_THAT(f.events.Drain(), ElementsAre(Removed(kG1, H(7))));
}

// Issue 24's minimal case, as vLLM runs it: three requests cache the same first block (1, then
// duplicates 3 and 5); the first request is freed and a 96-token request evicts block 1. A
// lookup now returns the oldest duplicate left, 3 (kvpage returned the newest, 5), and after 3
// is evicted, 5.
TEST(BlockPoolTest, DuplicateLookupReturnsTheOldestRemaining) {
  OneChunk f;
  BlockPool& pool = f.pool;
  for (int32_t first : {1, 3, 5}) {  // 17-token prompts: one full block and one partial
    EXPECT_THAT(Take(pool, 2), ElementsAre(first, first + 1));
    pool.CacheBlock(BlockId(first), H(1), kG0, kRoot);
    ASSERT_POOL_OK(pool);
  }
  EXPECT_THAT(f.events.Drain(), ElementsAre(Stored(kG0, H(1), kRoot)));
  EXPECT_EQ(pool.Lookup(H(1), kG0), BlockId(1));
  pool.Free(Blocks({2, 1}));
  ASSERT_POOL_OK(pool);
  EXPECT_THAT(Take(pool, 6), ElementsAre(2, 7, 8, 9, 10, 1));  // 96 tokens: block 1 evicted
  ASSERT_POOL_OK(pool);
  EXPECT_EQ(pool.Lookup(H(1), kG0), BlockId(3));
  pool.Free(Blocks({4, 3}));
  pool.Free(Blocks({6, 5}));
  ASSERT_POOL_OK(pool);
  EXPECT_THAT(Take(pool, 3), ElementsAre(6, 4, 3));  // clean blocks, then 3 is evicted
  EXPECT_EQ(pool.Lookup(H(1), kG0), BlockId(5));
  EXPECT_EQ(f.events.size(), 0u);
  EXPECT_THAT(Take(pool, 1), ElementsAre(5));
  ASSERT_POOL_OK(pool);
  EXPECT_EQ(pool.Lookup(H(1), kG0), kNullBlock);
  EXPECT_THAT(f.events.Drain(), ElementsAre(Removed(kG0, H(1))));
}

// A duplicate dropped from the middle or the end of its chain keeps the others in order.
TEST(BlockPoolTest, UncachingADuplicateKeepsTheChainInOrder) {
  OneChunk f;
  BlockPool& pool = f.pool;
  EXPECT_THAT(Take(pool, 4), ElementsAre(1, 2, 3, 4));
  for (int32_t b : {1, 2, 3, 4}) pool.CacheBlock(BlockId(b), H(9), kG0, kRoot);
  EXPECT_TRUE(pool.Uncache(BlockId(4)));  // the last
  EXPECT_TRUE(pool.Uncache(BlockId(2)));  // one in the middle
  ASSERT_POOL_OK(pool);
  pool.CacheBlock(BlockId(2), H(9), kG0, kRoot);  // back at the end: 1, 3, 2
  ASSERT_POOL_OK(pool);
  EXPECT_TRUE(pool.Uncache(BlockId(1)));
  EXPECT_EQ(pool.Lookup(H(9), kG0), BlockId(3));
  EXPECT_TRUE(pool.Uncache(BlockId(3)));
  EXPECT_EQ(pool.Lookup(H(9), kG0), BlockId(2));
  ASSERT_POOL_OK(pool);
}

// T11: reset is refused while a block is used and afterwards clears every hash.
TEST(BlockPoolTest, ResetPrefixCache) {
  OneChunk f;
  BlockPool& pool = f.pool;
  EXPECT_THAT(Take(pool, 3), ElementsAre(1, 2, 3));
  for (int32_t i = 1; i <= 3; ++i) pool.CacheBlock(BlockId(i), H(i), kG0, i > 1 ? H(i - 1) : kRoot);
  pool.Free(Blocks({3, 2}));
  f.events.Drain();
  const std::vector<BlockId> order = pool.FreeOrder();

  EXPECT_TRUE(absl::IsFailedPrecondition(pool.ResetPrefixCache()));
  ASSERT_POOL_OK(pool);
  EXPECT_EQ(pool.FreeOrder(), order);
  EXPECT_EQ(pool.Lookup(H(3), kG0), BlockId(3));
  EXPECT_EQ(f.events.size(), 0u);

  pool.Free(Blocks({1}));
  EXPECT_THAT(Ids(pool.FreeOrder()), ElementsAre(4, 5, 6, 7, 8, 9, 10, 3, 2, 1));
  ASSERT_TRUE(pool.ResetPrefixCache().ok());
  ASSERT_POOL_OK(pool);
  EXPECT_THAT(f.events.Drain(), ElementsAre(AllCleared()));
  for (int32_t i = 1; i <= 3; ++i) {
    EXPECT_EQ(pool.Lookup(H(i), kG0), kNullBlock);
    EXPECT_FALSE(pool.is_cached(BlockId(i)));
  }
  EXPECT_EQ(pool.num_cached_free_blocks(), 0);
  EXPECT_EQ(pool.num_clean_blocks(), 10);
  EXPECT_THAT(Ids(pool.FreeOrder()), ElementsAre(1, 2, 3, 4, 5, 6, 7, 8, 9, 10));
  // An empty cache resets too (and says so).
  ASSERT_TRUE(pool.ResetPrefixCache().ok());
  EXPECT_THAT(f.events.Drain(), ElementsAre(AllCleared()));
  ASSERT_POOL_OK(pool);
}

// ---- Chunks -----------------------------------------------------------------------------

constexpr int64_t kChunkBlockBytes = 100;  // 4 blocks per chunk: 400 bytes

// 4 chunks × 4 blocks of 100 bytes; the budget holds 3 chunks.
struct FourChunks {
  explicit FourChunks(MemoryBacking* backing = nullptr) : budget(1200, backing) {}
  MemoryBudget budget;
  KvEventLog events{/*enabled=*/true};
  BlockPool pool{
      BlockPoolConfig{
          .pool_index = 0, .block_bytes = kChunkBlockBytes, .blocks_per_chunk = 4, .max_chunks = 4},
      &budget, &events};
};

// CanAllocateNow(n) is n <= AllocatableNow() (it skips the division when free blocks or one
// chunk suffice): checked for every n at every fill of a pool whose budget maps 3 of 4 chunks.
TEST(BlockPoolChunkTest, CanAllocateNowAgreesWithAllocatableNow) {
  FourChunks f;
  BlockPool& pool = f.pool;
  std::vector<int64_t> allocatable;
  for (int taken = 0; taken <= 12; ++taken) {
    const int64_t now = pool.AllocatableNow();
    allocatable.push_back(now);
    for (int64_t n = 0; n <= 17; ++n) {
      EXPECT_EQ(pool.CanAllocateNow(n), n <= now) << "taken " << taken << ", n " << n;
    }
    if (taken < 12) Take(pool, 1);
    ASSERT_POOL_OK(pool);
  }
  EXPECT_THAT(allocatable, ElementsAre(12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0));
  // Freed blocks count as free: 2 blocks back, so 2 fit and 3 do not (no chunk is left).
  pool.Free(Blocks({12, 11}));
  ASSERT_POOL_OK(pool);
  EXPECT_TRUE(pool.CanAllocateNow(2));
  EXPECT_FALSE(pool.CanAllocateNow(3));
}

TEST(BlockPoolChunkTest, ChunksAreMappedLazilyAndFullestChunkFirst) {
  RecordingBacking backing;
  FourChunks f(&backing);
  BlockPool& pool = f.pool;
  EXPECT_EQ(pool.capacity(), 16);
  EXPECT_EQ(pool.chunk_bytes(), 400);
  EXPECT_EQ(pool.num_unmapped_chunks(), 4);
  EXPECT_EQ(pool.AllocatableNow(), 12);  // the budget holds 3 of the 4 chunks
  EXPECT_THAT(Take(pool, 1), ElementsAre(1));
  ASSERT_POOL_OK(pool);
  EXPECT_EQ(pool.num_mapped_chunks(), 1);
  EXPECT_EQ(pool.num_idle_chunks(), 0);
  EXPECT_EQ(f.budget.used_bytes(), 400);
  EXPECT_EQ(pool.AllocatableNow(), 11);
  EXPECT_THAT(Take(pool, 3), ElementsAre(2, 3, 4));  // no new chunk while clean blocks remain
  ASSERT_POOL_OK(pool);
  EXPECT_EQ(pool.num_mapped_chunks(), 1);
  EXPECT_EQ(f.budget.used_bytes(), 400);
  EXPECT_EQ(pool.AllocatableNow(), 8);
  EXPECT_THAT(Take(pool, 1), ElementsAre(5));
  ASSERT_POOL_OK(pool);
  EXPECT_EQ(pool.num_mapped_chunks(), 2);
  EXPECT_EQ(f.budget.used_bytes(), 800);
  EXPECT_EQ(pool.AllocatableNow(), 7);
  EXPECT_THAT(Take(pool, 3), ElementsAre(6, 7, 8));
  ASSERT_POOL_OK(pool);
  EXPECT_EQ(pool.AllocatableNow(), 4);
  EXPECT_FALSE(pool.is_mapped(BlockId(9)));

  // Chunk 0 keeps 2 used blocks, chunk 1 keeps 1.
  pool.Free(Blocks({2, 3}));
  ASSERT_POOL_OK(pool);
  pool.Free(Blocks({6, 7, 8}));
  ASSERT_POOL_OK(pool);
  EXPECT_EQ(pool.num_idle_chunks(), 0);
  EXPECT_EQ(pool.AllocatableNow(), 9);
  // Clean blocks of the fullest chunk first, then the chunk the budget can still map.
  EXPECT_THAT(Ids(pool.FreeOrder()), ElementsAre(3, 2, 8, 7, 6, 9, 10, 11, 12));
  EXPECT_THAT(Take(pool, 1), ElementsAre(3));  // from the fuller chunk 0
  ASSERT_POOL_OK(pool);
  EXPECT_THAT(Take(pool, 1), ElementsAre(2));
  ASSERT_POOL_OK(pool);
  EXPECT_THAT(Take(pool, 1), ElementsAre(8));  // chunk 0 is full: chunk 1
  ASSERT_POOL_OK(pool);
  EXPECT_EQ(pool.num_mapped_chunks(), 2);
  EXPECT_EQ(pool.AllocatableNow(), 6);

  // A chunk with fewer used blocks drains and goes idle first.
  pool.Free(Blocks({5, 8}));
  ASSERT_POOL_OK(pool);
  EXPECT_EQ(pool.num_idle_chunks(), 1);
  EXPECT_EQ(pool.NumCleanIdleChunks(), 1);

  // AllocatableNow is exact: all of it can be taken, and then nothing more.
  const int64_t n = pool.AllocatableNow();
  EXPECT_EQ(n, 8);
  EXPECT_THAT(Take(pool, static_cast<int32_t>(n)), ElementsAre(8, 5, 7, 6, 9, 10, 11, 12));
  ASSERT_POOL_OK(pool);
  EXPECT_EQ(pool.AllocatableNow(), 0);
  EXPECT_EQ(pool.num_mapped_chunks(), 3);
  EXPECT_EQ(pool.num_unmapped_chunks(), 1);
  EXPECT_EQ(f.budget.used_bytes(), 1200);
  EXPECT_EQ(f.budget.free_bytes(), 0);
  EXPECT_THAT(backing.calls,
              ElementsAre(RecordingBacking::Call{+1, 0, 0}, RecordingBacking::Call{+1, 0, 1},
                          RecordingBacking::Call{+1, 0, 2}));
}

TEST(BlockPoolChunkTest, MapsANewChunkBeforeEvictingCachedBlocks) {
  FourChunks f;
  BlockPool& pool = f.pool;
  EXPECT_THAT(Take(pool, 4), ElementsAre(1, 2, 3, 4));
  for (int32_t i = 1; i <= 4; ++i) pool.CacheBlock(BlockId(i), H(i), kG0, i > 1 ? H(i - 1) : kRoot);
  pool.Free(Blocks({4, 3, 2, 1}));
  ASSERT_POOL_OK(pool);
  f.events.Drain();
  EXPECT_EQ(pool.num_idle_chunks(), 1);
  EXPECT_EQ(pool.num_clean_blocks(), 0);
  EXPECT_EQ(pool.num_cached_free_blocks(), 4);
  EXPECT_EQ(pool.AllocatableNow(), 12);

  EXPECT_THAT(Take(pool, 1), ElementsAre(5));  // budget room: a fresh chunk, cache kept
  ASSERT_POOL_OK(pool);
  EXPECT_EQ(f.events.size(), 0u);
  EXPECT_EQ(pool.num_mapped_chunks(), 2);
  EXPECT_EQ(pool.Lookup(H(4), kG0), BlockId(4));
  EXPECT_EQ(pool.AllocatableNow(), 11);
  // The chunk the budget can still map comes before the cached blocks, as Allocate takes them.
  EXPECT_THAT(Ids(pool.FreeOrder()), ElementsAre(6, 7, 8, 9, 10, 11, 12, 4, 3, 2, 1));
  EXPECT_THAT(Take(pool, 7), ElementsAre(6, 7, 8, 9, 10, 11, 12));
  ASSERT_POOL_OK(pool);
  EXPECT_EQ(f.events.size(), 0u);
  EXPECT_EQ(f.budget.free_bytes(), 0);
  // The budget is spent: now the cache goes, tail of the chain first.
  EXPECT_THAT(Take(pool, 2), ElementsAre(4, 3));
  ASSERT_POOL_OK(pool);
  EXPECT_THAT(f.events.Drain(), ElementsAre(Removed(kG0, H(4)), Removed(kG0, H(3))));
  EXPECT_EQ(pool.AllocatableNow(), 2);
  EXPECT_EQ(pool.num_mapped_chunks(), 3);
}

// FreeOrder is the order Allocate hands blocks out in, unmapped chunks included: with one
// chunk of headroom the pool maps one chunk, then evicts its cached blocks rather than eat into
// the headroom, and maps the last chunk the budget holds only when no cached block is left.
TEST(BlockPoolChunkTest, FreeOrderIsTheOrderAllocateTakes) {
  FourChunks f;
  BlockPool& pool = f.pool;
  EXPECT_THAT(Ids(pool.FreeOrder()), ElementsAre(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12));
  EXPECT_THAT(Take(pool, 4), ElementsAre(1, 2, 3, 4));
  for (int32_t i = 1; i <= 4; ++i) pool.CacheBlock(BlockId(i), H(i), kG0, i > 1 ? H(i - 1) : kRoot);
  pool.Free(Blocks({4, 3, 2, 1}));
  f.budget.set_headroom_bytes(400);
  const std::vector<int32_t> order = Ids(pool.FreeOrder());
  EXPECT_THAT(order, ElementsAre(5, 6, 7, 8, 4, 3, 2, 1, 9, 10, 11, 12));
  EXPECT_EQ(static_cast<int64_t>(order.size()), pool.AllocatableNow());
  EXPECT_EQ(Take(pool, 12), order);
  ASSERT_POOL_OK(pool);
  EXPECT_THAT(Ids(pool.FreeOrder()), IsEmpty());
}

TEST(BlockPoolChunkTest, ReleaseIdleChunk) {
  RecordingBacking backing;
  FourChunks f(&backing);
  BlockPool& pool = f.pool;
  EXPECT_FALSE(pool.ReleaseIdleChunk(/*allow_cache_loss=*/true));  // nothing mapped
  EXPECT_THAT(Take(pool, 8), ElementsAre(1, 2, 3, 4, 5, 6, 7, 8));
  for (int32_t i = 1; i <= 4; ++i) pool.CacheBlock(BlockId(i), H(i), kG0, i > 1 ? H(i - 1) : kRoot);
  f.events.Drain();
  EXPECT_FALSE(pool.ReleaseIdleChunk(true));  // both chunks in use
  pool.Free(Blocks({4, 3, 2, 1}));            // chunk 0: idle, 4 cached blocks
  ASSERT_POOL_OK(pool);
  pool.Free(Blocks({8, 7, 6}));  // chunk 1: block 5 still used
  ASSERT_POOL_OK(pool);
  EXPECT_EQ(pool.num_idle_chunks(), 1);
  EXPECT_EQ(pool.NumCleanIdleChunks(), 0);
  EXPECT_FALSE(pool.ReleaseIdleChunk(false));  // the only idle chunk holds cached blocks
  ASSERT_POOL_OK(pool);
  EXPECT_EQ(pool.num_mapped_chunks(), 2);
  EXPECT_EQ(f.events.size(), 0u);

  pool.Free(Blocks({5}));  // chunk 1 idle and clean
  ASSERT_POOL_OK(pool);
  EXPECT_EQ(pool.num_idle_chunks(), 2);
  EXPECT_EQ(pool.NumCleanIdleChunks(), 1);
  EXPECT_EQ(f.budget.used_bytes(), 800);
  EXPECT_TRUE(pool.ReleaseIdleChunk(false));  // releases chunk 1
  ASSERT_POOL_OK(pool);
  EXPECT_EQ(pool.num_mapped_chunks(), 1);
  EXPECT_EQ(pool.num_idle_chunks(), 1);
  EXPECT_EQ(pool.num_clean_blocks(), 0);
  EXPECT_EQ(pool.num_cached_free_blocks(), 4);
  EXPECT_EQ(f.budget.used_bytes(), 400);
  EXPECT_FALSE(pool.is_mapped(BlockId(5)));
  EXPECT_EQ(f.events.size(), 0u);
  // Chunks 1 and 2 would be mapped again before a cached block is evicted.
  EXPECT_THAT(Ids(pool.FreeOrder()), ElementsAre(5, 6, 7, 8, 9, 10, 11, 12, 4, 3, 2, 1));

  EXPECT_FALSE(pool.ReleaseIdleChunk(false));
  EXPECT_TRUE(pool.ReleaseIdleChunk(true));  // chunk 0 with its cache
  ASSERT_POOL_OK(pool);
  EXPECT_THAT(f.events.Drain(), ElementsAre(Removed(kG0, H(1)), Removed(kG0, H(2)),
                                            Removed(kG0, H(3)), Removed(kG0, H(4))));
  for (int32_t i = 1; i <= 4; ++i) EXPECT_EQ(pool.Lookup(H(i), kG0), kNullBlock);
  EXPECT_EQ(pool.num_mapped_chunks(), 0);
  EXPECT_EQ(pool.num_idle_chunks(), 0);
  EXPECT_EQ(pool.num_free_blocks(), 0);
  EXPECT_EQ(f.budget.used_bytes(), 0);
  EXPECT_THAT(Ids(pool.FreeOrder()), ElementsAre(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12));
  EXPECT_FALSE(pool.ReleaseIdleChunk(true));
  EXPECT_THAT(backing.calls,
              ElementsAre(RecordingBacking::Call{+1, 0, 0}, RecordingBacking::Call{+1, 0, 1},
                          RecordingBacking::Call{-1, 0, 1}, RecordingBacking::Call{-1, 0, 0}));

  // Remapping starts from the lowest chunk again, with fresh clean blocks.
  EXPECT_THAT(Take(pool, 2), ElementsAre(1, 2));
  ASSERT_POOL_OK(pool);
  EXPECT_EQ(f.budget.used_bytes(), 400);
  EXPECT_FALSE(pool.ReleaseIdleChunk(true));
}

TEST(BlockPoolChunkTest, ReleasePrefersTheIdleChunkWithFewestCachedBlocks) {
  FourChunks f;
  BlockPool& pool = f.pool;
  EXPECT_THAT(Take(pool, 12), ElementsAre(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12));
  // Chunk 0: 4 cached; chunk 1: 1 cached; chunk 2: 2 cached.
  for (int32_t i : {1, 2, 3, 4, 5, 9, 10}) pool.CacheBlock(BlockId(i), H(i), kG0, kRoot);
  pool.Free(Blocks({12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1}));
  ASSERT_POOL_OK(pool);
  f.events.Drain();
  EXPECT_EQ(pool.num_idle_chunks(), 3);
  EXPECT_EQ(pool.NumCleanIdleChunks(), 0);
  EXPECT_FALSE(pool.ReleaseIdleChunk(false));
  EXPECT_TRUE(pool.ReleaseIdleChunk(true));  // chunk 1
  ASSERT_POOL_OK(pool);
  EXPECT_THAT(f.events.Drain(), ElementsAre(Removed(kG0, H(5))));
  EXPECT_FALSE(pool.is_mapped(BlockId(5)));
  EXPECT_TRUE(pool.ReleaseIdleChunk(true));  // chunk 2
  ASSERT_POOL_OK(pool);
  EXPECT_THAT(f.events.Drain(), ElementsAre(Removed(kG0, H(9)), Removed(kG0, H(10))));
  EXPECT_EQ(pool.num_mapped_chunks(), 1);
  EXPECT_EQ(pool.num_cached_free_blocks(), 4);
  EXPECT_EQ(f.budget.used_bytes(), 400);
}

TEST(MemoryBudgetTest, TakeAndGiveChunks) {
  RecordingBacking backing;
  MemoryBudget budget(1000, &backing);
  EXPECT_TRUE(budget.TakeChunk(2, 5, 600));
  EXPECT_EQ(budget.used_bytes(), 600);
  EXPECT_EQ(budget.free_bytes(), 400);
  EXPECT_FALSE(budget.TakeChunk(2, 6, 600));  // short of bytes: the backing is not asked
  backing.refuse = true;
  EXPECT_FALSE(budget.TakeChunk(1, 0, 100));  // the backing refuses: nothing taken
  EXPECT_EQ(budget.used_bytes(), 600);
  backing.refuse = false;
  budget.GiveChunk(2, 5, 600);
  EXPECT_EQ(budget.used_bytes(), 0);
  EXPECT_EQ(budget.total_bytes(), 1000);
  EXPECT_THAT(backing.calls,
              ElementsAre(RecordingBacking::Call{+1, 2, 5}, RecordingBacking::Call{+1, 1, 0},
                          RecordingBacking::Call{-1, 2, 5}));
}

// A premapped chunk is mapped at once but charged only when taken; its bytes are kept from
// other chunks, and DropPremapped unmaps what was never taken.
TEST(MemoryBudgetTest, PremapKeepsBytesAndChargesOnTake) {
  RecordingBacking backing;
  MemoryBudget budget(1000, &backing);
  ASSERT_TRUE(budget.Premap(0, 3, 600).ok());
  EXPECT_EQ(budget.used_bytes(), 0);
  EXPECT_EQ(budget.free_bytes(), 1000);
  EXPECT_EQ(budget.premapped_bytes(), 600);
  EXPECT_TRUE(budget.IsPremapped(0, 3));
  EXPECT_EQ(budget.num_premapped(0), 1);
  EXPECT_FALSE(budget.TakeChunk(1, 0, 600));  // the premapped bytes are not for chunk (1, 0)
  EXPECT_TRUE(absl::IsResourceExhausted(budget.Premap(1, 0, 600)));
  EXPECT_TRUE(budget.TakeChunk(0, 3, 600));  // only charged: the backing is not asked again
  EXPECT_EQ(budget.used_bytes(), 600);
  EXPECT_EQ(budget.premapped_bytes(), 0);
  ASSERT_TRUE(budget.Premap(0, 4, 300).ok());
  backing.refuse = true;
  const absl::Status refused = budget.Premap(0, 5, 100);
  EXPECT_TRUE(absl::IsResourceExhausted(refused));
  EXPECT_EQ(budget.backing_error(), refused);
  backing.refuse = false;
  budget.DropPremapped();
  EXPECT_EQ(budget.premapped_bytes(), 0);
  EXPECT_EQ(budget.num_premapped(0), 0);
  EXPECT_THAT(backing.calls,
              ElementsAre(RecordingBacking::Call{+1, 0, 3}, RecordingBacking::Call{+1, 0, 4},
                          RecordingBacking::Call{+1, 0, 5}, RecordingBacking::Call{-1, 0, 4}));
}

// A backing that refuses the chunk an allocation needs: Allocate returns false and takes
// nothing; with cached blocks to evict instead, it refuses nothing.
TEST(BlockPoolChunkTest, RefusedChunkFailsAllocateAndChangesNothing) {
  RecordingBacking backing;
  MemoryBudget budget(40 * kBlockBytes, &backing);
  KvEventLog events{/*enabled=*/true};
  BlockPool pool(BlockPoolConfig{.pool_index = 0, .block_bytes = kBlockBytes,
                                 .blocks_per_chunk = 4, .max_chunks = 10},
                 &budget, &events);
  EXPECT_THAT(Take(pool, 3), ElementsAre(1, 2, 3));
  const std::vector<BlockId> order = pool.FreeOrder();
  backing.refuse = true;
  std::vector<BlockId> out;
  EXPECT_FALSE(pool.Allocate(6, &out));  // needs chunk 1: refused
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(pool.num_used_blocks(), 3);
  EXPECT_EQ(pool.num_mapped_chunks(), 1);
  EXPECT_EQ(budget.used_bytes(), 4 * kBlockBytes);
  EXPECT_EQ(budget.premapped_bytes(), 0);
  EXPECT_EQ(pool.FreeOrder(), order);
  ASSERT_POOL_OK(pool);
  // Cached blocks to evict: a refused chunk is only a chunk the pool would rather map.
  pool.CacheBlock(BlockId(1), H(1), kG0, kRoot);
  pool.Free(Blocks({1}));
  EXPECT_TRUE(pool.Allocate(2, &out));
  EXPECT_THAT(Ids(out), ElementsAre(4, 1));
  ASSERT_POOL_OK(pool);
  backing.refuse = false;
  out.clear();
  EXPECT_TRUE(pool.Allocate(6, &out));
  EXPECT_THAT(Ids(out), ElementsAre(5, 6, 7, 8, 9, 10));
  ASSERT_POOL_OK(pool);
}

// ---- Two pools, one budget ------------------------------------------------------------------

TEST(BlockPoolChunkTest, IdleChunkMovesBetweenPoolsSharingABudget) {
  RecordingBacking backing;
  MemoryBudget budget(1200, &backing);  // 3 chunks of 400 bytes
  KvEventLog events(true);
  BlockPool a(
      BlockPoolConfig{.pool_index = 0, .block_bytes = 100, .blocks_per_chunk = 4, .max_chunks = 4},
      &budget, &events);
  BlockPool b(
      BlockPoolConfig{.pool_index = 1, .block_bytes = 200, .blocks_per_chunk = 2, .max_chunks = 6},
      &budget, &events);
  auto check = [&] {
    ASSERT_POOL_OK(a);
    ASSERT_POOL_OK(b);
    ASSERT_EQ(budget.used_bytes(),
              a.num_mapped_chunks() * a.chunk_bytes() + b.num_mapped_chunks() * b.chunk_bytes());
  };
  EXPECT_EQ(a.AllocatableNow(), 12);
  EXPECT_EQ(b.AllocatableNow(), 6);

  EXPECT_THAT(Take(a, 12), ElementsAre(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12));
  check();
  EXPECT_EQ(budget.free_bytes(), 0);
  EXPECT_EQ(b.AllocatableNow(), 0);
  for (int32_t i = 1; i <= 12; ++i) a.CacheBlock(BlockId(i), H(i), kG0, i > 1 ? H(i - 1) : kRoot);
  a.Free(Blocks({12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1}));
  check();
  events.Drain();
  EXPECT_EQ(a.num_idle_chunks(), 3);
  EXPECT_EQ(a.num_cached_free_blocks(), 12);
  EXPECT_EQ(a.AllocatableNow(), 12);
  // A holds every byte in cached blocks: B cannot allocate until A gives a chunk back.
  EXPECT_EQ(b.AllocatableNow(), 0);
  EXPECT_EQ(b.num_mapped_chunks(), 0);
  EXPECT_FALSE(a.ReleaseIdleChunk(false));
  check();
  EXPECT_EQ(b.AllocatableNow(), 0);

  EXPECT_TRUE(a.ReleaseIdleChunk(true));  // every chunk holds 4 cached blocks: chunk 0 goes
  check();
  EXPECT_THAT(events.Drain(), ElementsAre(Removed(kG0, H(1)), Removed(kG0, H(2)),
                                          Removed(kG0, H(3)), Removed(kG0, H(4))));
  EXPECT_EQ(a.num_mapped_chunks(), 2);
  EXPECT_EQ(a.AllocatableNow(), 12);  // 8 cached blocks + the chunk it could map again
  EXPECT_EQ(budget.used_bytes(), 800);
  EXPECT_EQ(b.AllocatableNow(), 2);

  EXPECT_THAT(Take(b, 2), ElementsAre(1, 2));
  check();
  EXPECT_EQ(b.num_mapped_chunks(), 1);
  EXPECT_EQ(budget.used_bytes(), 1200);
  EXPECT_EQ(b.AllocatableNow(), 0);
  EXPECT_EQ(a.AllocatableNow(), 8);  // A still serves its remaining cached blocks
  EXPECT_EQ(a.Lookup(H(5), kG0), BlockId(5));
  EXPECT_EQ(a.Lookup(H(4), kG0), kNullBlock);
  EXPECT_EQ(events.size(), 0u);
  EXPECT_THAT(backing.calls,
              ElementsAre(RecordingBacking::Call{+1, 0, 0}, RecordingBacking::Call{+1, 0, 1},
                          RecordingBacking::Call{+1, 0, 2}, RecordingBacking::Call{-1, 0, 0},
                          RecordingBacking::Call{+1, 1, 0}));

  // And back: B frees (unhashed, clean), gives its chunk up without losing anything.
  b.Free(Blocks({2, 1}));
  check();
  EXPECT_TRUE(b.ReleaseIdleChunk(false));
  check();
  EXPECT_EQ(a.AllocatableNow(), 12);
  EXPECT_THAT(Take(a, 1), ElementsAre(1));  // A remaps its chunk 0, keeping its cache
  check();
  EXPECT_EQ(events.size(), 0u);
  EXPECT_EQ(a.num_cached_free_blocks(), 8);
}

// Arrays of 2 MiB and more start on a 2 MiB boundary (so they can be backed by huge pages);
// smaller ones are ordinary allocations. Either way they hold what is written to them, and a
// vector that grows across the threshold keeps its contents.
// ---- Records follow use ----------------------------------------------------------------------

// A pool whose budget could hold 2^31 - 2 one-block chunks keeps records only for the chunks
// it mapped (at least 64, doubling): the records of the whole capacity would take 100 GiB.
TEST(BlockPoolGrowthTest, OneBlockChunkRecordsFollowMappedChunks) {
  MemoryBudget budget{std::numeric_limits<int64_t>::max()};
  KvEventLog events{/*enabled=*/false};
  BlockPool pool{BlockPoolConfig{.pool_index = 0, .block_bytes = kBlockBytes,
                                 .blocks_per_chunk = 1, .max_chunks = 2147483646},
                 &budget, &events};
  EXPECT_EQ(pool.capacity(), 2147483646);
  EXPECT_EQ(pool.num_block_records(), 1);  // the null block's
  ASSERT_POOL_OK(pool);
  EXPECT_THAT(Take(pool, 3), ElementsAre(1, 2, 3));
  EXPECT_EQ(pool.num_block_records(), 64);
  pool.CacheBlock(BlockId(2), H(1), kG0, kRoot);
  pool.Free(Blocks({3, 2, 1}));
  ASSERT_POOL_OK(pool);
  EXPECT_THAT(Take(pool, 2), ElementsAre(1, 3));  // clean chunks first, last freed first
  const std::vector<int32_t> more = Take(pool, 100);
  ASSERT_EQ(more.size(), 100u);
  EXPECT_EQ(more.front(), 4);
  EXPECT_EQ(more.back(), 103);
  EXPECT_EQ(pool.num_block_records(), 128);
  EXPECT_EQ(pool.num_mapped_chunks(), 103);
  EXPECT_EQ(pool.Lookup(H(1), kG0), BlockId(2));
  EXPECT_EQ(budget.used_bytes(), 103 * kBlockBytes);
  ASSERT_POOL_OK(pool);
  // Ids beyond the records read as unused, unhashed and unmapped.
  EXPECT_EQ(pool.ref_count(BlockId(1000000)), 0);
  EXPECT_FALSE(pool.is_cached(BlockId(1000000)));
  EXPECT_FALSE(pool.is_mapped(BlockId(1000000)));
  EXPECT_FALSE(pool.IsIdleChunk(1000000));
  EXPECT_FALSE(pool.Uncache(BlockId(1000000)));
  EXPECT_EQ(pool.block_hash(BlockId(1000000)), BlockHash{});
}

// vLLM's one pool: a single chunk of 2^31 - 2 blocks. Mapping it writes no block record;
// its ids are handed out in order, freed hash-less blocks first, as from a fully built stack.
TEST(BlockPoolGrowthTest, OneHugeChunkHandsOutIdsInOrderWithoutItsRecords) {
  MemoryBudget budget{std::numeric_limits<int64_t>::max()};
  KvEventLog events{/*enabled=*/true};
  BlockPool pool{BlockPoolConfig{.pool_index = 0, .block_bytes = kBlockBytes,
                                 .blocks_per_chunk = 2147483646, .max_chunks = 1},
                 &budget, &events};
  EXPECT_THAT(Take(pool, 5), ElementsAre(1, 2, 3, 4, 5));
  EXPECT_EQ(pool.num_block_records(), 64);
  EXPECT_EQ(pool.num_clean_blocks(), 2147483646 - 5);
  pool.CacheBlock(BlockId(3), H(3), kG0, kRoot);
  pool.Free(Blocks({4, 3, 2}));
  ASSERT_POOL_OK(pool);
  EXPECT_THAT(Take(pool, 4), ElementsAre(2, 4, 6, 7));  // the stack, then the untouched ids
  EXPECT_EQ(pool.Lookup(H(3), kG0), BlockId(3));
  const std::vector<int32_t> run = Take(pool, 200);
  EXPECT_EQ(run.front(), 8);
  EXPECT_EQ(run.back(), 207);
  EXPECT_EQ(pool.num_block_records(), 208);
  EXPECT_EQ(pool.num_used_blocks(), 207 - 1);  // all but the cached-free block 3
  ASSERT_POOL_OK(pool);
  EXPECT_TRUE(pool.Uncache(BlockId(3)));  // cached-free -> clean: on top of the stack
  EXPECT_THAT(Take(pool, 2), ElementsAre(3, 208));
  ASSERT_POOL_OK(pool);
}

// A multi-block chunk mapped again after a release hands out its ids in order once more.
TEST(BlockPoolGrowthTest, RemappedChunkStartsFreshAgain) {
  MemoryBudget budget{8 * kBlockBytes};
  KvEventLog events{/*enabled=*/false};
  BlockPool pool{BlockPoolConfig{.pool_index = 0, .block_bytes = kBlockBytes,
                                 .blocks_per_chunk = 4, .max_chunks = 2},
                 &budget, &events};
  EXPECT_THAT(Take(pool, 6), ElementsAre(1, 2, 3, 4, 5, 6));
  pool.Free(Blocks({6, 5}));
  pool.Free(Blocks({3, 1}));
  ASSERT_POOL_OK(pool);
  EXPECT_TRUE(pool.ReleaseIdleChunk(/*allow_cache_loss=*/false));  // chunk 1: 5..8 all clean
  EXPECT_EQ(pool.num_mapped_chunks(), 1);
  ASSERT_POOL_OK(pool);
  EXPECT_THAT(Take(pool, 5), ElementsAre(1, 3, 5, 6, 7));
  ASSERT_POOL_OK(pool);
}

// With caching off the pool keeps no key records at all.
TEST(BlockPoolGrowthTest, CachingOffKeepsNoKeys) {
  MemoryBudget budget{std::numeric_limits<int64_t>::max()};
  KvEventLog events{/*enabled=*/true};
  BlockPool pool{BlockPoolConfig{.pool_index = 0, .block_bytes = kBlockBytes,
                                 .blocks_per_chunk = 16, .max_chunks = 1 << 20,
                                 .enable_caching = false},
                 &budget, &events};
  EXPECT_THAT(Take(pool, 2), ElementsAre(1, 2));
  pool.CacheBlock(BlockId(1), H(1), kG0, kRoot);
  EXPECT_FALSE(pool.is_cached(BlockId(1)));
  EXPECT_EQ(pool.Lookup(H(1), kG0), kNullBlock);
  EXPECT_EQ(pool.block_hash(BlockId(1)), BlockHash{});
  pool.Free(Blocks({2, 1}));
  ASSERT_POOL_OK(pool);
  EXPECT_EQ(events.size(), 0u);
}

// ---- A whole manager on a budget of INT64_MAX ------------------------------------------------

// The budget could hold some 2^31 blocks per pool; the pools cost what the requests touch.
// (The manager's own CheckInvariants walks every id of a pool, so it is not called here.)
TEST(BlockPoolGrowthTest, ManagerWithUnlimitedBudgetServesAndHits) {
  for (const AccountingMode mode : {AccountingMode::kKvpage, AccountingMode::kVllm}) {
    SCOPED_TRACE(mode == AccountingMode::kKvpage ? "kvpage" : "vllm");
    KvCacheConfig config;
    config.mode = mode;
    config.kv_budget_bytes = std::numeric_limits<int64_t>::max();
    config.hash_seed = 1;
    auto manager = KvCacheManager::Create(testing::TinyModel(testing::kTinyFull), config);
    ASSERT_TRUE(manager.ok()) << manager.status();
    KvCacheManager& m = **manager;
    for (int64_t id = 0; id < 2; ++id) {
      ASSERT_TRUE(m.AddRequest({RequestId(id), testing::Tokens(40)}).ok());
      auto hit = m.GetComputedBlocks(H(m, RequestId(id)));
      ASSERT_TRUE(hit.ok()) << hit.status();
      EXPECT_EQ(hit->num_tokens, id == 0 ? 0 : 32);  // the second hits the two full blocks
      auto ok = m.AllocateSlots(H(m, RequestId(id)), {.num_computed_tokens = hit->num_tokens,
                                                .num_new_tokens = 40 - hit->num_tokens,
                                                .hit = &*hit});
      ASSERT_TRUE(ok.ok()) << ok.status();
      EXPECT_TRUE(*ok);
      m.CompleteStep();
      ASSERT_TRUE(m.Free(H(m, RequestId(id))).ok());
    }
    const KvCacheUsage usage = m.Usage();
    ASSERT_EQ(usage.pools.size(), 1u);
    EXPECT_EQ(usage.pools[0].used_blocks, 0);
    EXPECT_EQ(usage.pools[0].cached_free_blocks, 2);
  }
}

TEST(HugePageAllocatorTest, LargeArraysAreHugePageAligned) {
  HugePageAllocator<int32_t> alloc;
  const size_t large = (kHugePageBytes + 100) / sizeof(int32_t);
  int32_t* p = alloc.allocate(large);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % kHugePageBytes, 0u);
  p[0] = 7;
  p[large - 1] = 9;
  EXPECT_EQ(p[0] + p[large - 1], 16);
  alloc.deallocate(p, large);

  std::vector<int32_t, HugePageAllocator<int32_t>> v;
  for (int32_t i = 0; i < (1 << 20); ++i) v.push_back(i);  // 4 MiB: crosses the threshold
  EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data()) % kHugePageBytes, 0u);
  int64_t sum = 0;
  for (int32_t x : v) sum += x;
  EXPECT_EQ(sum, (int64_t{1} << 20) * ((1 << 20) - 1) / 2);
}

}  // namespace
}  // namespace kvpage
