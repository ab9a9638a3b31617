// HugePageArena: size classes, reuse of freed memory, slabs, and the allocator adaptor; and
// HugePageAllocator's alignment.
#include "internal/huge_page_arena.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <set>
#include <vector>

#include "internal/huge_page_allocator.h"

namespace kvpage::internal {
namespace {

TEST(HugePageArenaTest, SizeClassesLoseAtMostAQuarter) {
  EXPECT_EQ(HugePageArena::ClassBytes(1), 64u);
  EXPECT_EQ(HugePageArena::ClassBytes(64), 64u);
  EXPECT_EQ(HugePageArena::ClassBytes(65), 80u);
  EXPECT_EQ(HugePageArena::ClassBytes(80), 80u);
  EXPECT_EQ(HugePageArena::ClassBytes(81), 96u);
  EXPECT_EQ(HugePageArena::ClassBytes(128), 128u);
  EXPECT_EQ(HugePageArena::ClassBytes(129), 160u);
  EXPECT_EQ(HugePageArena::ClassBytes(4000), 4096u);
  EXPECT_EQ(HugePageArena::ClassBytes(73536), 81920u);  // 18,384 tokens of 4 bytes
  EXPECT_EQ(HugePageArena::ClassBytes(HugePageArena::kMaxClassBytes),
            HugePageArena::kMaxClassBytes);
  EXPECT_EQ(HugePageArena::ClassBytes(HugePageArena::kMaxClassBytes + 1),
            HugePageArena::kMaxClassBytes + 1);  // above the classes: the size itself
  for (size_t bytes = 65; bytes <= HugePageArena::kMaxClassBytes; bytes += 37) {
    const size_t c = HugePageArena::ClassBytes(bytes);
    ASSERT_GE(c, bytes);
    ASSERT_LE(4 * c, 5 * bytes + 4 * 16) << bytes;  // within a quarter (and 16-byte steps)
    ASSERT_EQ(c % HugePageArena::kAlignment, 0u);
  }
}

TEST(HugePageArenaTest, FreedMemoryIsReusedByItsClass) {
  HugePageArena arena;
  void* a = arena.Allocate(1000);
  void* b = arena.Allocate(1000);
  EXPECT_NE(a, b);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % HugePageArena::kAlignment, 0u);
  EXPECT_EQ(arena.live_bytes(), 2 * HugePageArena::ClassBytes(1000));
  EXPECT_EQ(arena.slab_bytes(), size_t{2} << 20);
  arena.Deallocate(a, 1000);
  EXPECT_EQ(arena.live_bytes(), HugePageArena::ClassBytes(1000));
  EXPECT_EQ(arena.Allocate(1010), a);  // same class (1,024): last freed, first reused
  void* c = arena.Allocate(3000);      // another class: fresh memory
  EXPECT_NE(c, a);
  EXPECT_NE(c, b);
  arena.Deallocate(a, 1010);
  arena.Deallocate(b, 1000);
  arena.Deallocate(c, 3000);
  EXPECT_EQ(arena.live_bytes(), 0u);
}

TEST(HugePageArenaTest, SlabsAreCarvedWithoutOverlap) {
  HugePageArena arena;
  // 40 allocations of 200 KiB (the 224 KiB class: 9 per 2 MiB slab) take 5 slabs; every
  // byte written must survive the others' writes.
  std::vector<unsigned char*> blocks;
  const size_t bytes = size_t{200} << 10;
  for (int i = 0; i < 40; ++i) {
    auto* p = static_cast<unsigned char*>(arena.Allocate(bytes));
    std::memset(p, i, bytes);
    blocks.push_back(p);
  }
  EXPECT_EQ(arena.slab_bytes(), 5 * (size_t{2} << 20));
  for (int i = 0; i < 40; ++i) {
    ASSERT_EQ(blocks[i][0], i);
    ASSERT_EQ(blocks[i][bytes - 1], i);
  }
  std::set<unsigned char*> distinct(blocks.begin(), blocks.end());
  EXPECT_EQ(distinct.size(), 40u);
  for (unsigned char* p : blocks) arena.Deallocate(p, bytes);
  EXPECT_EQ(arena.live_bytes(), 0u);
  // Above the classes: served (and freed) outside the slabs.
  void* big = arena.Allocate(size_t{3} << 20);
  std::memset(big, 1, size_t{3} << 20);
  arena.Deallocate(big, size_t{3} << 20);
  EXPECT_EQ(arena.slab_bytes(), 5 * (size_t{2} << 20));
}

TEST(HugePageArenaTest, VectorsGrowShrinkAndMoveOverTheArena) {
  HugePageArena arena;
  using Vec = std::vector<int32_t, ArenaAllocator<int32_t>>;
  Vec v{ArenaAllocator<int32_t>(&arena)};
  for (int32_t i = 0; i < 100000; ++i) v.push_back(i);  // grows through many classes
  for (int32_t i = 0; i < 100000; ++i) ASSERT_EQ(v[static_cast<size_t>(i)], i);
  // 131,072 entries (512 KiB) are above the classes, and every smaller buffer it grew
  // through went back to its class.
  EXPECT_EQ(v.capacity(), 131072u);
  EXPECT_EQ(arena.live_bytes(), 0u);
  Vec w = std::move(v);
  EXPECT_EQ(w.get_allocator(), ArenaAllocator<int32_t>(&arena));
  EXPECT_EQ(w.size(), 100000u);
  w.resize(10);
  w.shrink_to_fit();
  EXPECT_EQ(arena.live_bytes(), HugePageArena::ClassBytes(10 * sizeof(int32_t)));
  w = Vec(ArenaAllocator<int32_t>(&arena));
  EXPECT_EQ(arena.live_bytes(), 0u);
}

// A 32-byte-aligned record (as BlockPool's chunk records are) in vectors of every size:
// below 2 MiB the allocator takes operator new's aligned form, above it the huge-page path.
TEST(HugePageAllocatorTest, OverAlignedRecordsAreAligned) {
  struct alignas(32) Record {
    int32_t value[8];
  };
  for (const size_t n : {size_t{1}, size_t{3}, size_t{1000}, (size_t{2} << 20) / 32 + 1}) {
    std::vector<Record, HugePageAllocator<Record>> records(n);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(records.data()) % 32, 0u) << n << " records";
    records.back().value[7] = 7;
    EXPECT_EQ(records.back().value[7], 7);
  }
}

}  // namespace
}  // namespace kvpage::internal
