// HugePageAllocator: a standard allocator for the large arrays a decode step reads at random
// (block records, the prefix-cache map, the scheduler's batch tables). An allocation of 2 MiB
// or more is 2 MiB-aligned, rounded up to whole 2 MiB pages and advised to the kernel as
// transparent huge pages (madvise MADV_HUGEPAGE), so one TLB entry covers 2 MiB of it instead
// of 4 KiB; a step that touches a few thousand random records then walks the page tables far
// less often. Smaller allocations come from operator new (its aligned form for an
// over-aligned type). Where transparent huge pages are off ("never"), the advice is ignored
// and nothing else changes.
#ifndef KVPAGE_INTERNAL_HUGE_PAGE_ALLOCATOR_H_
#define KVPAGE_INTERNAL_HUGE_PAGE_ALLOCATOR_H_

#include <sys/mman.h>

#include <cstddef>
#include <cstdlib>
#include <new>

namespace kvpage {

inline constexpr size_t kHugePageBytes = size_t{2} << 20;

template <typename T>
class HugePageAllocator {
 public:
  using value_type = T;

  HugePageAllocator() = default;
  template <typename U>
  HugePageAllocator(const HugePageAllocator<U>&) {}  // NOLINT: allocators convert implicitly

  T* allocate(size_t n) {
    const size_t bytes = n * sizeof(T);
    if (n > static_cast<size_t>(-1) / sizeof(T)) throw std::bad_array_new_length();
    if (bytes < kHugePageBytes) {
      if constexpr (kOverAligned) {
        return static_cast<T*>(::operator new(bytes, std::align_val_t{alignof(T)}));
      }
      return static_cast<T*>(::operator new(bytes));
    }
    const size_t rounded = (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
    void* p = std::aligned_alloc(kHugePageBytes, rounded);
    if (p == nullptr) throw std::bad_alloc();
    madvise(p, rounded, MADV_HUGEPAGE);  // advice only: failure leaves 4 KiB pages
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t n) noexcept {
    if (n * sizeof(T) < kHugePageBytes) {
      if constexpr (kOverAligned) {
        ::operator delete(p, std::align_val_t{alignof(T)});
      } else {
        ::operator delete(p);
      }
    } else {
      std::free(p);
    }
  }

  template <typename U>
  bool operator==(const HugePageAllocator<U>&) const {
    return true;
  }

 private:
  // A type aligned beyond what plain operator new guarantees (a 32-byte record) takes the
  // aligned form for small sizes; the huge-page path is 2 MiB-aligned anyway.
  static constexpr bool kOverAligned = alignof(T) > __STDCPP_DEFAULT_NEW_ALIGNMENT__;
};

}  // namespace kvpage

#endif  // KVPAGE_INTERNAL_HUGE_PAGE_ALLOCATOR_H_
