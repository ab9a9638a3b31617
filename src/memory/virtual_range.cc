#include "memory/virtual_range.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kvpage::internal {

int64_t VirtualRange::PageSize() {
  static const int64_t page = sysconf(_SC_PAGESIZE);
  return page;
}

absl::StatusOr<VirtualRange> VirtualRange::Reserve(int64_t bytes) {
  if (bytes <= 0 || bytes % PageSize() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("reserve ", bytes, " bytes: not a positive multiple of the page size ",
                     PageSize()));
  }
  void* p = mmap(nullptr, static_cast<size_t>(bytes), PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot reserve ", bytes,
                                                     " bytes of address space: ",
                                                     std::strerror(errno)));
  }
  return VirtualRange(static_cast<char*>(p), bytes);
}

VirtualRange::VirtualRange(VirtualRange&& other) noexcept
    : base_(std::exchange(other.base_, nullptr)), size_(std::exchange(other.size_, 0)) {}

VirtualRange& VirtualRange::operator=(VirtualRange&& other) noexcept {
  if (this != &other) {
    if (base_ != nullptr) munmap(base_, static_cast<size_t>(size_));
    base_ = std::exchange(other.base_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

VirtualRange::~VirtualRange() {
  if (base_ != nullptr) munmap(base_, static_cast<size_t>(size_));
}

absl::Status VirtualRange::Commit(int64_t offset, int64_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  if (mprotect(base_ + offset, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE) != 0) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot commit ", bytes, " bytes at offset ",
                                                     offset, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status VirtualRange::Release(int64_t offset, int64_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  char* p = base_ + offset;
  if (madvise(p, static_cast<size_t>(bytes), MADV_DONTNEED) != 0 ||
      mprotect(p, static_cast<size_t>(bytes), PROT_NONE) != 0) {
    return absl::InternalError(absl::StrCat("cannot release ", bytes, " bytes at offset ", offset,
                                            ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace kvpage::internal
