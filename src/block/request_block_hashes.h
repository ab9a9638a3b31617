// RequestBlockHashes: the chained hashes of one request's full blocks (internal; the hasher is
// kvpage/block_hash.h, the byte encoding src/block/block_hash.cc). The KvCacheManager keeps one
// per request.
//
// Thread-safety: belongs to one request; concurrent calls on the same object need external
// synchronisation.
#ifndef KVPAGE_BLOCK_REQUEST_BLOCK_HASHES_H_
#define KVPAGE_BLOCK_REQUEST_BLOCK_HASHES_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "kvpage/block_hash.h"
#include "kvpage/types.h"

namespace kvpage {

// The hashes of one request's full blocks, extended as tokens arrive. hashes()[i] covers
// tokens [i * block_size, (i + 1) * block_size); a trailing partial block has no hash yet.
// The hasher is passed to each Update, not kept: a KvCacheManager holds one for all its
// requests, and the 8 bytes a pointer per request would take keep what hashing a block reads
// within one cache line of the manager's request state.
class RequestBlockHashes {
 public:
  // REQUIRES: block_size > 0; extras.mm_items sorted by offset.
  RequestBlockHashes(int32_t block_size, BlockHashExtras extras);

  // Hashes every full block of `tokens` — the request's whole sequence so far — that has no
  // hash yet, with `hasher` (REQUIRES: the same hasher every time). Blocks already hashed are
  // not read again, so tokens may only ever be appended (after a Truncate, the tokens past the
  // truncation point may be replaced).
  void Update(const BlockHasher& hasher, absl::Span<const int32_t> tokens);

  // Forgets the hashes of blocks not wholly inside the first `num_tokens` tokens, e.g. when
  // rejected speculative tokens are rolled back. A no-op if nothing lies beyond.
  // REQUIRES: num_tokens >= 0.
  void Truncate(int64_t num_tokens);

  absl::Span<const BlockHash> hashes() const { return hashes_; }
  int32_t block_size() const { return block_size_; }
  const BlockHashExtras& extras() const { return extras_; }
  // Some extra key is set (a LoRA id, a cache salt or multimodal items).
  bool has_extras() const { return has_extras_; }

  // What hashing one more block of a request without extra keys reads of this object: its
  // first kHotBytes (the block size, whether there are extras, the hashes' vector). The
  // extras follow, read only when there are some.
  static constexpr size_t kHotBytes = 32;

 private:
  int32_t block_size_;             // > 0
  bool has_extras_;                // some key of extras_ is set
  std::vector<BlockHash> hashes_;  // hashes_[i] chains from hashes_[i − 1] (or the root)
  BlockHashExtras extras_;
};

}  // namespace kvpage

#endif  // KVPAGE_BLOCK_REQUEST_BLOCK_HASHES_H_
