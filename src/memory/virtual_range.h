// VirtualRange: one reserved range of host address space whose pages are committed and
// released on demand (internal).
//
// Reserve maps the range PROT_NONE with MAP_NORESERVE: it costs address space, no memory, and
// touching it faults. Commit makes pages readable and writable (the kernel backs them with
// zero pages when first touched); Release drops their contents (MADV_DONTNEED, so the resident
// set shrinks at once) and makes them PROT_NONE again. Offsets and lengths are whole pages.
// Move-only; the destructor unmaps the range. Not thread-safe.
#ifndef KVPAGE_MEMORY_VIRTUAL_RANGE_H_
#define KVPAGE_MEMORY_VIRTUAL_RANGE_H_

#include <cstdint>

#include "absl/status/statusor.h"

namespace kvpage::internal {

class VirtualRange {
 public:
  // The host page size (sysconf), the unit of Commit and Release.
  static int64_t PageSize();
  // ResourceExhausted naming the size and errno when the address space cannot be reserved;
  // InvalidArgument for bytes <= 0 or not a multiple of the page size.
  static absl::StatusOr<VirtualRange> Reserve(int64_t bytes);

  VirtualRange() = default;
  VirtualRange(VirtualRange&& other) noexcept;
  VirtualRange& operator=(VirtualRange&& other) noexcept;
  VirtualRange(const VirtualRange&) = delete;
  VirtualRange& operator=(const VirtualRange&) = delete;
  ~VirtualRange();

  char* base() const { return base_; }
  int64_t size() const { return size_; }

  // REQUIRES: offset and bytes are page multiples inside the range. ResourceExhausted (errno
  // named) when the kernel refuses; some of the pages may then be committed, and the caller
  // releases them.
  absl::Status Commit(int64_t offset, int64_t bytes);
  // Internal error (errno named) when the kernel refuses.
  absl::Status Release(int64_t offset, int64_t bytes);

 private:
  VirtualRange(char* base, int64_t size) : base_(base), size_(size) {}
  char* base_ = nullptr;
  int64_t size_ = 0;
};

}  // namespace kvpage::internal

#endif  // KVPAGE_MEMORY_VIRTUAL_RANGE_H_
