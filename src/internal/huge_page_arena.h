// HugePageArena: the KV cache manager's allocator for per-request memory (a request's token
// vector), carved from 2 MiB slabs advised as transparent huge pages (internal).
//
// Why: a decode step completes a block in one request in block_size and appends it to that
// request's token vector. A thousand requests' vectors, each reserved for its whole output,
// spread over tens of MiB of 4 KiB pages, so nearly every such append misses the TLB, and a
// page walk is what the step then waits on. From 2 MiB slabs the same vectors sit on a few
// dozen huge pages. (glibc's malloc can do the same for a whole process with
// GLIBC_TUNABLES=glibc.malloc.hugetlb=1; the arena gives it to every server by default.)
//
// Sizes up to kMaxClassBytes are rounded up to a size class (four per power of two, so at most
// a quarter is lost to rounding) and served from that class's free list, else from the current
// slab's unused tail. Freed memory goes back to its class's list and is reused by that class
// only; slabs are returned to the system when the arena is destroyed. Larger sizes go to
// HugePageAllocator. Every allocation is 16-byte aligned.
//
// Not thread-safe: the manager that owns it is not either. Must outlive every allocation
// (declare it before the containers that use it).
#ifndef KVPAGE_INTERNAL_HUGE_PAGE_ARENA_H_
#define KVPAGE_INTERNAL_HUGE_PAGE_ARENA_H_

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

namespace kvpage::internal {

class HugePageArena {
 public:
  static constexpr size_t kMaxClassBytes = size_t{256} << 10;
  static constexpr size_t kAlignment = 16;

  HugePageArena() = default;
  ~HugePageArena();
  HugePageArena(const HugePageArena&) = delete;
  HugePageArena& operator=(const HugePageArena&) = delete;

  // REQUIRES: bytes > 0. Throws std::bad_alloc when the system has no memory (as operator new).
  void* Allocate(size_t bytes);
  // REQUIRES: p came from Allocate(bytes) with the same size, and is not yet freed.
  void Deallocate(void* p, size_t bytes) noexcept;

  // Bytes the slabs hold (what the arena took from the system for classed sizes).
  size_t slab_bytes() const { return slabs_.size() * kSlabBytes; }
  // Bytes of classed allocations in use, counted at their class size.
  size_t live_bytes() const { return live_bytes_; }
  // The size an allocation of `bytes` really takes (its class), or `bytes` above the classes.
  static size_t ClassBytes(size_t bytes);

 private:
  static constexpr size_t kSlabBytes = size_t{2} << 20;
  static constexpr size_t kMinClassBytes = 64;
  // Classes: 64 bytes, then four per power of two up to kMaxClassBytes.
  static int ClassOf(size_t bytes);
  static size_t SizeOfClass(int c);
  static constexpr int kNumClasses = 1 + 4 * (18 - 6);  // 64 B, then (64 B, 256 KiB]

  struct FreeNode {
    FreeNode* next;
  };
  FreeNode* free_[kNumClasses] = {};
  std::vector<void*> slabs_;
  char* bump_ = nullptr;      // the current slab's unused tail
  char* bump_end_ = nullptr;
  size_t live_bytes_ = 0;
};

// A standard allocator over a HugePageArena, for std::vector and the like. Allocators over
// the same arena are equal; containers carry theirs along when moved or swapped.
template <typename T>
class ArenaAllocator {
 public:
  static_assert(alignof(T) <= HugePageArena::kAlignment);
  using value_type = T;
  using propagate_on_container_copy_assignment = std::true_type;
  using propagate_on_container_move_assignment = std::true_type;
  using propagate_on_container_swap = std::true_type;

  explicit ArenaAllocator(HugePageArena* arena) : arena_(arena) {}
  template <typename U>
  ArenaAllocator(const ArenaAllocator<U>& other) : arena_(other.arena()) {}  // NOLINT: implicit

  T* allocate(size_t n) { return static_cast<T*>(arena_->Allocate(n * sizeof(T))); }
  void deallocate(T* p, size_t n) noexcept { arena_->Deallocate(p, n * sizeof(T)); }
  HugePageArena* arena() const { return arena_; }
  // Value-less construction default-initializes: a vector's resize(n) then leaves the new
  // elements of a trivial type unwritten (the manager copies its tokens in right after)
  // instead of zeroing them first.
  template <typename U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }

  template <typename U>
  bool operator==(const ArenaAllocator<U>& other) const {
    return arena_ == other.arena();
  }

 private:
  HugePageArena* arena_;
};

}  // namespace kvpage::internal

#endif  // KVPAGE_INTERNAL_HUGE_PAGE_ARENA_H_
