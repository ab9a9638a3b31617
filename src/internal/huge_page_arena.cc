#include "internal/huge_page_arena.h"

#include <sys/mman.h>

#include <bit>
#include <cstdlib>
#include <new>

#include "internal/huge_page_allocator.h"

namespace kvpage::internal {

HugePageArena::~HugePageArena() {
  for (void* slab : slabs_) std::free(slab);
}

int HugePageArena::ClassOf(size_t bytes) {
  if (bytes <= kMinClassBytes) return 0;
  // bytes in (half, 2·half]: four classes, half + q·half/4 for q = 1..4.
  const int k = std::bit_width(bytes - 1);
  const size_t half = size_t{1} << (k - 1);
  const size_t step = half >> 2;
  const size_t q = (bytes - half + step - 1) / step;
  return 1 + 4 * (k - 7) + static_cast<int>(q - 1);
}

size_t HugePageArena::SizeOfClass(int c) {
  if (c == 0) return kMinClassBytes;
  const int k = 7 + (c - 1) / 4;
  const size_t q = 1 + static_cast<size_t>((c - 1) % 4);
  return (size_t{1} << (k - 1)) + q * (size_t{1} << (k - 3));
}

size_t HugePageArena::ClassBytes(size_t bytes) {
  return bytes > kMaxClassBytes ? bytes : SizeOfClass(ClassOf(bytes));
}

void* HugePageArena::Allocate(size_t bytes) {
  if (bytes > kMaxClassBytes) return HugePageAllocator<char>().allocate(bytes);
  const int c = ClassOf(bytes);
  const size_t size = SizeOfClass(c);
  live_bytes_ += size;
  if (FreeNode* node = free_[c]) {
    free_[c] = node->next;
    return node;
  }
  if (static_cast<size_t>(bump_end_ - bump_) < size) {
    // A new slab; the old one's tail (less than this class's size) stays unused.
    void* slab = std::aligned_alloc(kSlabBytes, kSlabBytes);
    if (slab == nullptr) {
      live_bytes_ -= size;
      throw std::bad_alloc();
    }
    madvise(slab, kSlabBytes, MADV_HUGEPAGE);  // advice only: failure leaves 4 KiB pages
    slabs_.push_back(slab);
    bump_ = static_cast<char*>(slab);
    bump_end_ = bump_ + kSlabBytes;
  }
  void* p = bump_;
  bump_ += size;
  return p;
}

void HugePageArena::Deallocate(void* p, size_t bytes) noexcept {
  if (bytes > kMaxClassBytes) {
    HugePageAllocator<char>().deallocate(static_cast<char*>(p), bytes);
    return;
  }
  const int c = ClassOf(bytes);
  live_bytes_ -= SizeOfClass(c);
  FreeNode* node = static_cast<FreeNode*>(p);
  node->next = free_[c];
  free_[c] = node;
}

}  // namespace kvpage::internal
