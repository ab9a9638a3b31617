#include "kvpage/block_hash.h"

#include <openssl/evp.h>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "block/request_block_hashes.h"
#include "internal/status_macros.h"

// XXH3 is compiled into this file, so hashing a block inlines it.
#define XXH_INLINE_ALL
#include <xxhash.h>

// The canonical byte encoding of one block, the input of H (all integers little-endian):
//
//   parent.lo (8 bytes) | parent.hi (8 bytes)
//   tokens, 4 bytes each (int32)
//   then the extra keys that apply to this block, each behind a one-byte tag, in this order:
//     'L' | lora_id (int64)                                 if lora_id != 0
//     'S' | salt length (uint32) | salt bytes               if block_start == 0 and salt is set
//     'M' | id length (uint32) | id bytes | offset − block_start (int64)
//                                                           per overlapping item, by offset
//
// The token count is not encoded. Within one cache every block has the same size, and with
// a fixed-size token field the tagged extras parse one way only, so distinct blocks have
// distinct encodings. Blocks of different sizes are never compared.
//
// H is XXH3-128 with seed 0 (hi = high64, lo = low64) or SHA-256 (lo and hi are bytes 0–7 and
// 8–15 of the digest, each read little-endian). The root is H applied to the 8 little-endian
// bytes of the seed; an unseeded hasher draws the seed from std::random_device.

namespace kvpage {
namespace {

constexpr unsigned char kLoraTag = 'L';
constexpr unsigned char kSaltTag = 'S';
constexpr unsigned char kMultimodalTag = 'M';

uint64_t LoadLittleEndian64(const unsigned char* in) {
  uint64_t value = 0;
  for (size_t i = 0; i < 8; ++i) value |= uint64_t{in[i]} << (8 * i);
  return value;
}

BlockHash Xxh3(const void* data, size_t size) {
  const XXH128_hash_t h = XXH3_128bits(data, size);
  return BlockHash{h.low64, h.high64};
}

// SHA-256 through OpenSSL's EVP interface, truncated to 128 bits. OpenSSL 3 looks the digest
// up in its provider table and allocates a context on every EVP_Digest call, which costs more
// than hashing a block; so the digest is fetched once per process and each thread reuses one
// context. Out of line, so that its thread-local context does not weigh on the XXH3 path.
[[gnu::noinline]] BlockHash Sha256(const void* data, size_t size) {
  static const EVP_MD* const md = EVP_MD_fetch(nullptr, "SHA256", nullptr);  // never freed
  thread_local const std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(
      EVP_MD_CTX_new(), &EVP_MD_CTX_free);
  KVPAGE_DCHECK(md != nullptr && ctx != nullptr);
  unsigned char digest[EVP_MAX_MD_SIZE];
  [[maybe_unused]] const bool ok = EVP_DigestInit_ex(ctx.get(), md, nullptr) == 1 &&
                                   EVP_DigestUpdate(ctx.get(), data, size) == 1 &&
                                   EVP_DigestFinal_ex(ctx.get(), digest, nullptr) == 1;
  KVPAGE_DCHECK(ok);
  return BlockHash{LoadLittleEndian64(digest), LoadLittleEndian64(digest + 8)};
}

BlockHash Hash(HashAlgorithm algorithm, const void* data, size_t size) {
  return algorithm == HashAlgorithm::kSha256 ? Sha256(data, size) : Xxh3(data, size);
}

// A block's encoding, on the stack up to 1 KiB (blocks of up to ~250 tokens).
class Encoder {
 public:
  void Bytes(const void* data, size_t size) {
    const size_t at = bytes_.size();
    bytes_.resize(at + size);
    std::memcpy(bytes_.data() + at, data, size);
  }
  template <typename UInt>
  void Int(UInt value) {
    unsigned char b[sizeof(UInt)];
    for (size_t i = 0; i < sizeof(UInt); ++i) b[i] = static_cast<unsigned char>(value >> (8 * i));
    Bytes(b, sizeof(b));
  }
  void Tag(unsigned char tag) { bytes_.push_back(tag); }
  // A byte string behind its uint32 length.
  void String(absl::string_view s) {
    KVPAGE_DCHECK(s.size() <= std::numeric_limits<uint32_t>::max());
    Int(static_cast<uint32_t>(s.size()));
    Bytes(s.data(), s.size());
  }
  void Tokens(absl::Span<const int32_t> tokens) {
    if constexpr (std::endian::native == std::endian::little) {
      Bytes(tokens.data(), tokens.size() * sizeof(int32_t));
    } else {
      for (int32_t token : tokens) Int(static_cast<uint32_t>(token));
    }
  }
  BlockHash Hash(HashAlgorithm algorithm) const {
    return kvpage::Hash(algorithm, bytes_.data(), bytes_.size());
  }

 private:
  absl::InlinedVector<unsigned char, 1024> bytes_;
};

BlockHash RootHash(HashAlgorithm algorithm, uint64_t seed) {
  Encoder e;
  e.Int(seed);
  return e.Hash(algorithm);
}

uint64_t RandomSeed() {
  std::random_device device;
  // random_device yields 32 bits per call.
  const uint64_t high = device();
  return (high << 32) | device();
}

}  // namespace

absl::string_view HashAlgorithmName(HashAlgorithm algorithm) {
  switch (algorithm) {
    case HashAlgorithm::kXxh3_128: return "xxh3_128";
    case HashAlgorithm::kSha256: return "sha256";
  }
  return "unknown";
}

absl::StatusOr<HashAlgorithm> ParseHashAlgorithm(absl::string_view text) {
  const std::string t = absl::AsciiStrToLower(text);
  if (t == "xxh3_128" || t == "xxhash") return HashAlgorithm::kXxh3_128;
  if (t == "sha256") return HashAlgorithm::kSha256;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown hash algorithm '", text, "' (expected xxh3_128 or sha256)"));
}

BlockHasher::BlockHasher(HashAlgorithm algorithm, std::optional<uint64_t> seed)
    : algorithm_(algorithm), root_(RootHash(algorithm, seed ? *seed : RandomSeed())) {}

// The encoding of the block [block_start, block_start + tokens.size()) (top of this file).
BlockHash BlockHasher::HashBlock(BlockHash parent, absl::Span<const int32_t> tokens,
                                 const BlockHashExtras& extras, int64_t block_start) const {
  KVPAGE_DCHECK(block_start >= 0);
  const int64_t block_end = block_start + static_cast<int64_t>(tokens.size());
  Encoder e;
  e.Int(parent.lo);
  e.Int(parent.hi);
  e.Tokens(tokens);
  if (extras.lora_id != 0) {
    e.Tag(kLoraTag);
    e.Int(static_cast<uint64_t>(extras.lora_id));
  }
  if (block_start == 0 && !extras.cache_salt.empty()) {
    e.Tag(kSaltTag);
    e.String(extras.cache_salt);
  }
  // Items are sorted by offset: the scan stops at the first that starts past the block.
  for (const MultimodalItem& item : extras.mm_items) {
    if (item.offset >= block_end) break;
    if (item.length <= 0 || item.offset + item.length <= block_start) continue;
    e.Tag(kMultimodalTag);
    e.String(item.identifier);
    e.Int(static_cast<uint64_t>(item.offset - block_start));
  }
  return e.Hash(algorithm_);
}

// HashBlock with no extra keys, a decode step's completed block: the parent and the tokens
// copied into a fixed buffer, without the encoder's bookkeeping. A block of 16 tokens (the
// default) is 80 bytes known at compile time, which XXH3 inlines: BM_HashTokens/xxh3/16 takes
// 23.6 µs so, 41.1 µs with the size known only at run time (scripts/ab_bench.sh, 4 rounds).
BlockHash BlockHasher::HashPlainBlock(BlockHash parent, absl::Span<const int32_t> tokens) const {
  constexpr size_t kParentBytes = 2 * sizeof(uint64_t);
  constexpr size_t kBlockOf16 = 16 * sizeof(int32_t);
  constexpr size_t kBufferBytes = 1024;
  const size_t token_bytes = tokens.size() * sizeof(int32_t);
  if (std::endian::native != std::endian::little || kParentBytes + token_bytes > kBufferBytes) {
    return HashBlock(parent, tokens, BlockHashExtras{}, 0);
  }
  unsigned char buffer[kBufferBytes];
  std::memcpy(buffer, &parent.lo, sizeof(uint64_t));
  std::memcpy(buffer + sizeof(uint64_t), &parent.hi, sizeof(uint64_t));
  if (token_bytes == kBlockOf16 && algorithm_ == HashAlgorithm::kXxh3_128) {
    std::memcpy(buffer + kParentBytes, tokens.data(), kBlockOf16);
    return Xxh3(buffer, kParentBytes + kBlockOf16);
  }
  std::memcpy(buffer + kParentBytes, tokens.data(), token_bytes);
  return Hash(algorithm_, buffer, kParentBytes + token_bytes);
}

// RequestBlockHashes (block/request_block_hashes.h) is defined here, beside HashPlainBlock,
// which its Update calls once per decode block.
RequestBlockHashes::RequestBlockHashes(int32_t block_size, BlockHashExtras extras)
    : block_size_(block_size),
      has_extras_(extras.lora_id != 0 || !extras.cache_salt.empty() || !extras.mm_items.empty()),
      extras_(std::move(extras)) {
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Winvalid-offsetof"  // GCC lays out this class as written
  static_assert(offsetof(RequestBlockHashes, hashes_) + sizeof(hashes_) <= kHotBytes);
#pragma GCC diagnostic pop
  KVPAGE_DCHECK(block_size_ > 0);
  KVPAGE_DCHECK(std::ranges::is_sorted(extras_.mm_items, {}, &MultimodalItem::offset));
}

void RequestBlockHashes::Update(const BlockHasher& hasher, absl::Span<const int32_t> tokens) {
  const size_t block_size = static_cast<size_t>(block_size_);
  // A decode step's completed block: one more block, no extra keys. No divide.
  if (!has_extras_ && tokens.size() == (hashes_.size() + 1) * block_size) {
    const BlockHash parent = hashes_.empty() ? hasher.root() : hashes_.back();
    hashes_.push_back(hasher.HashPlainBlock(parent, tokens.last(block_size)));
    return;
  }
  const size_t num_full_blocks = tokens.size() / block_size;
  if (num_full_blocks <= hashes_.size()) return;
  BlockHash parent = hashes_.empty() ? hasher.root() : hashes_.back();
  for (size_t i = hashes_.size(); i < num_full_blocks; ++i) {
    const size_t start = i * block_size;
    const absl::Span<const int32_t> block = tokens.subspan(start, block_size);
    // Without extra keys, extras_ (past the hot bytes) is not read.
    parent = has_extras_ ? hasher.HashBlock(parent, block, extras_, static_cast<int64_t>(start))
                         : hasher.HashPlainBlock(parent, block);
    hashes_.push_back(parent);
  }
}

void RequestBlockHashes::Truncate(int64_t num_tokens) {
  KVPAGE_DCHECK(num_tokens >= 0);
  const size_t keep = static_cast<size_t>(num_tokens / block_size_);
  if (keep < hashes_.size()) hashes_.resize(keep);
}

}  // namespace kvpage
