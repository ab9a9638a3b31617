// ReadableHostBacking (readable_backing.h says why every chunk stays committed).
#include "readable_backing.h"

#include "absl/strings/str_cat.h"

namespace kvpage::python {

absl::Status ReadableHostBacking::Reserve(const MemoryLayout& layout) {
  if (absl::Status s = host_.Reserve(layout); !s.ok()) return s;
  mapped_.resize(layout.pools.size());
  for (size_t p = 0; p < layout.pools.size(); ++p) {
    mapped_[p].assign(static_cast<size_t>(layout.pools[p].max_chunks), false);
    for (int32_t c = 0; c < layout.pools[p].max_chunks; ++c) {
      if (absl::Status s = host_.MapChunk(static_cast<int32_t>(p), c); !s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

absl::Status ReadableHostBacking::CheckChunk(const char* call, int32_t pool, int32_t chunk,
                                             bool expect) const {
  if (mapped_.empty()) return absl::FailedPreconditionError(absl::StrCat(call, " before Reserve"));
  if (pool < 0 || static_cast<size_t>(pool) >= mapped_.size() || chunk < 0 ||
      static_cast<size_t>(chunk) >= mapped_[pool].size()) {
    return absl::InvalidArgumentError(absl::StrCat(call, ": no chunk ", chunk, " in pool ", pool));
  }
  if (mapped_[pool][chunk] != expect) {
    return absl::FailedPreconditionError(absl::StrCat(
        "chunk ", chunk, " of pool ", pool, expect ? " is not mapped" : " is already mapped"));
  }
  return absl::OkStatus();
}

absl::Status ReadableHostBacking::MapChunk(int32_t pool, int32_t chunk) {
  if (absl::Status s = CheckChunk("MapChunk", pool, chunk, false); !s.ok()) return s;
  mapped_[pool][chunk] = true;
  ++mapped_chunks_;
  return absl::OkStatus();
}

absl::Status ReadableHostBacking::UnmapChunk(int32_t pool, int32_t chunk) {
  if (absl::Status s = CheckChunk("UnmapChunk", pool, chunk, true); !s.ok()) return s;
  mapped_[pool][chunk] = false;
  --mapped_chunks_;
  // Drop the pages (they read as zeros afterwards), then make the slice accessible again.
  absl::Status released = host_.UnmapChunk(pool, chunk);
  absl::Status committed = host_.MapChunk(pool, chunk);
  return released.ok() ? committed : released;
}

}  // namespace kvpage::python
