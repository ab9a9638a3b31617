// Block hashes for prefix caching: which full blocks of two requests may share KV pages.
//
// Two blocks may share KV only if everything that shaped their K/V vectors is equal: every
// token before them (attention looks back to the start of the request), their own tokens,
// and the context the tokens alone do not capture — the LoRA adapter, a per-tenant cache
// salt, and the content of multimodal items whose placeholder tokens fall inside the block.
// A block's hash therefore chains: it covers the previous block's hash, its own tokens and its
// own extra keys, so equal hashes at block i imply (up to collisions of a 128-bit hash) equal
// prefixes through block i. This follows vLLM v1's `hash_block_tokens` and
// `generate_block_hash_extra_keys`; the byte encoding is kvpage's own and is written down in
// src/block/block_hash.cc.
//
// Thread-safety: a BlockHasher is immutable after construction, so its const methods may be
// called from any number of threads.
#ifndef KVPAGE_BLOCK_HASH_H_
#define KVPAGE_BLOCK_HASH_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kvpage/types.h"

namespace kvpage {

enum class HashAlgorithm : uint8_t {
  kXxh3_128,  // XXH3 128-bit: fast, not cryptographic.
  kSha256,    // SHA-256 truncated to 128 bits: slower, resists crafted collisions.
};

// Canonical name: "xxh3_128", "sha256".
absl::string_view HashAlgorithmName(HashAlgorithm algorithm);

// Accepts the canonical names in any case, and "xxhash" (vLLM's spelling of XXH3-128).
// Returns InvalidArgument naming `text` for anything else.
absl::StatusOr<HashAlgorithm> ParseHashAlgorithm(absl::string_view text);

// A multimodal item (image, audio clip) whose placeholder tokens occupy
// [offset, offset + length) in the request's token sequence. Equal identifiers mean equal
// content (the caller hashes the pixels or samples; kvpage never sees them).
struct MultimodalItem {
  std::string identifier;
  int64_t offset = 0;
  int64_t length = 0;
};

// What else, besides the tokens, decides whether two blocks may share KV.
struct BlockHashExtras {
  // 0 = no adapter. Enters every block's hash.
  int64_t lora_id = 0;
  // Empty = none. Enters the hash of the block that starts at position 0 only; since every
  // later hash chains from it, a salt still separates all blocks of the request.
  std::string cache_salt;
  // Sorted by offset. An item enters the hash of every block it overlaps, keyed by its offset
  // relative to that block's start, so the same image at the same place within a block hashes
  // the same wherever the block sits.
  std::vector<MultimodalItem> mm_items;

  // InvalidArgument naming the item for a multimodal item with an empty identifier, or whose
  // placeholder tokens [offset, offset + length) are empty or not within a prompt of
  // `num_prompt_tokens` tokens, or items not sorted by offset or overlapping.
  absl::Status Validate(int64_t num_prompt_tokens) const;
};

// Computes chained block hashes:
//   hash(block 0) = H(root,             tokens of block 0, extra keys of block 0)
//   hash(block i) = H(hash(block i − 1), tokens of block i, extra keys of block i)
// The root stands in for "no parent" and is the only state; a hasher is a small value type.
class BlockHasher {
 public:
  // `seed` fixes the root hash, so hashes are reproducible across processes and runs. Without
  // a seed the root comes from std::random_device, so another tenant of a shared cache cannot
  // predict hashes and craft a colliding prefix.
  explicit BlockHasher(HashAlgorithm algorithm = HashAlgorithm::kXxh3_128,
                       std::optional<uint64_t> seed = std::nullopt);

  HashAlgorithm algorithm() const { return algorithm_; }
  // The parent to pass for the first block of a request.
  BlockHash root() const { return root_; }

  // Hash of the block whose first token sits at position `block_start` of the request, whose
  // predecessor hashed to `parent` (root() for the first block). `extras` describes the whole
  // request; only the parts that apply to this block are hashed.
  // REQUIRES: block_start >= 0; extras.mm_items sorted by offset.
  BlockHash HashBlock(BlockHash parent, absl::Span<const int32_t> tokens,
                      const BlockHashExtras& extras, int64_t block_start) const;
  // HashBlock for a request with no extra keys (any block_start gives the same hash), with
  // less work around the hash itself: a request's decode blocks take this path.
  BlockHash HashPlainBlock(BlockHash parent, absl::Span<const int32_t> tokens) const;

 private:
  HashAlgorithm algorithm_;
  BlockHash root_;
};

}  // namespace kvpage

#endif  // KVPAGE_BLOCK_HASH_H_
