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

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "internal/status_macros.h"

// XXH3 is compiled into this file rather than called in libxxhash: the streaming state sits
// on the stack, and its layout is only guaranteed to match functions of the same version.
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

// Encodings up to this size are built on the stack and hashed in one call; larger ones (blocks
// beyond ~250 tokens, or long identifiers) are streamed.
constexpr size_t kInlineBytes = 1024;

constexpr unsigned char kLoraTag = 'L';
constexpr unsigned char kSaltTag = 'S';
constexpr unsigned char kMultimodalTag = 'M';

template <typename UInt>
void StoreLittleEndian(UInt value, unsigned char* out) {
  if constexpr (std::endian::native == std::endian::little) {
    std::memcpy(out, &value, sizeof(value));
  } else {
    for (size_t i = 0; i < sizeof(value); ++i) {
      out[i] = static_cast<unsigned char>(value >> (8 * i));
    }
  }
}

uint64_t LoadLittleEndian64(const unsigned char* in) {
  uint64_t value = 0;
  for (size_t i = 0; i < 8; ++i) value |= uint64_t{in[i]} << (8 * i);
  return value;
}

// Streaming and one-shot XXH3-128. Both give the same value for the same bytes.
class Xxh3Stream {
 public:
  static BlockHash OneShot(const void* data, size_t size) {
    return FromXxh(XXH3_128bits(data, size));
  }
  void Start() { XXH3_128bits_reset(&state_); }
  void Update(const void* data, size_t size) { XXH3_128bits_update(&state_, data, size); }
  BlockHash Finish() { return FromXxh(XXH3_128bits_digest(&state_)); }

 private:
  static BlockHash FromXxh(XXH128_hash_t h) { return BlockHash{h.low64, h.high64}; }
  XXH3_state_t state_;  // uninitialised until Start(); only the rare large block uses it
};

// SHA-256 through OpenSSL's EVP interface, truncated to 128 bits. OpenSSL 3 looks the digest
// up in its provider table and allocates a context on every EVP_Digest call, which costs more
// than hashing a block; so the digest is fetched once per process and each thread reuses one
// context.
class Sha256Stream {
 public:
  static BlockHash OneShot(const void* data, size_t size) {
    Sha256Stream stream;
    stream.Start();
    stream.Update(data, size);
    return stream.Finish();
  }
  void Start() {
    ctx_ = ThreadContext();
    const int ok = EVP_DigestInit_ex(ctx_, Digest(), nullptr);
    KVPAGE_DCHECK(ok == 1);
    static_cast<void>(ok);
  }
  void Update(const void* data, size_t size) { EVP_DigestUpdate(ctx_, data, size); }
  BlockHash Finish() {
    unsigned char digest[EVP_MAX_MD_SIZE];
    EVP_DigestFinal_ex(ctx_, digest, nullptr);
    return BlockHash{LoadLittleEndian64(digest), LoadLittleEndian64(digest + 8)};
  }

 private:
  static const EVP_MD* Digest() {
    static const EVP_MD* const md = EVP_MD_fetch(nullptr, "SHA256", nullptr);  // never freed
    KVPAGE_DCHECK(md != nullptr);
    return md;
  }
  static EVP_MD_CTX* ThreadContext() {
    struct CtxFree {
      void operator()(EVP_MD_CTX* ctx) const { EVP_MD_CTX_free(ctx); }
    };
    thread_local const std::unique_ptr<EVP_MD_CTX, CtxFree> ctx(EVP_MD_CTX_new());
    KVPAGE_DCHECK(ctx != nullptr);
    return ctx.get();
  }

  EVP_MD_CTX* ctx_ = nullptr;  // this thread's context; Start() resets it
};

// The encoding goes to a writer: anything with Append(data, size).

// Writes into a buffer the caller has checked is large enough.
class BufferWriter {
 public:
  explicit BufferWriter(unsigned char* out) : begin_(out), out_(out) {}
  void Append(const void* data, size_t size) {
    std::memcpy(out_, data, size);
    out_ += size;
  }
  size_t size() const { return static_cast<size_t>(out_ - begin_); }

 private:
  unsigned char* begin_;
  unsigned char* out_;
};

// Feeds a hash's incremental interface.
template <typename Stream>
class StreamWriter {
 public:
  explicit StreamWriter(Stream* stream) : stream_(stream) {}
  void Append(const void* data, size_t size) { stream_->Update(data, size); }

 private:
  Stream* stream_;
};

template <typename Writer>
void AppendByte(Writer& writer, unsigned char byte) {
  writer.Append(&byte, 1);
}

template <typename Writer, typename UInt>
void AppendInt(Writer& writer, UInt value) {
  unsigned char bytes[sizeof(UInt)];
  StoreLittleEndian(value, bytes);
  writer.Append(bytes, sizeof(bytes));
}

// A byte string behind its uint32 length.
template <typename Writer>
void AppendString(Writer& writer, absl::string_view s) {
  KVPAGE_DCHECK(s.size() <= std::numeric_limits<uint32_t>::max());
  AppendInt(writer, static_cast<uint32_t>(s.size()));
  writer.Append(s.data(), s.size());
}

template <typename Writer>
void AppendTokens(Writer& writer, absl::Span<const int32_t> tokens) {
  if constexpr (std::endian::native == std::endian::little) {
    writer.Append(tokens.data(), tokens.size() * sizeof(int32_t));
  } else {
    for (int32_t token : tokens) AppendInt(writer, static_cast<uint32_t>(token));
  }
}

bool Overlaps(const MultimodalItem& item, int64_t block_start, int64_t block_end) {
  return item.length > 0 && item.offset < block_end && item.offset + item.length > block_start;
}

// Calls `visit` for every item overlapping [block_start, block_end). Items are sorted by
// offset, so the scan stops at the first one that starts at or past the block's end.
template <typename Visit>
void ForEachOverlappingItem(absl::Span<const MultimodalItem> items, int64_t block_start,
                            int64_t block_end, Visit visit) {
  for (const MultimodalItem& item : items) {
    if (item.offset >= block_end) break;
    if (Overlaps(item, block_start, block_end)) visit(item);
  }
}

bool HasSalt(const BlockHashExtras& extras, int64_t block_start) {
  return block_start == 0 && !extras.cache_salt.empty();
}

template <typename Writer>
void EncodeParentAndTokens(Writer& writer, BlockHash parent, absl::Span<const int32_t> tokens) {
  AppendInt(writer, parent.lo);
  AppendInt(writer, parent.hi);
  AppendTokens(writer, tokens);
}

// The tagged keys that follow the tokens, for the block [block_start, block_end).
template <typename Writer>
void EncodeExtraKeys(Writer& writer, const BlockHashExtras& extras, int64_t block_start,
                     int64_t block_end) {
  if (extras.lora_id != 0) {
    AppendByte(writer, kLoraTag);
    AppendInt(writer, static_cast<uint64_t>(extras.lora_id));
  }
  if (HasSalt(extras, block_start)) {
    AppendByte(writer, kSaltTag);
    AppendString(writer, extras.cache_salt);
  }
  ForEachOverlappingItem(extras.mm_items, block_start, block_end,
                         [&](const MultimodalItem& item) {
                           AppendByte(writer, kMultimodalTag);
                           AppendString(writer, item.identifier);
                           AppendInt(writer, static_cast<uint64_t>(item.offset - block_start));
                         });
}

// Bytes EncodeExtraKeys writes; 0 exactly when no key applies to the block.
size_t ExtraKeysSize(const BlockHashExtras& extras, int64_t block_start, int64_t block_end) {
  constexpr size_t kTag = 1, kLength = sizeof(uint32_t), kInt64 = sizeof(int64_t);
  size_t size = 0;
  if (extras.lora_id != 0) size += kTag + kInt64;
  if (HasSalt(extras, block_start)) size += kTag + kLength + extras.cache_salt.size();
  ForEachOverlappingItem(extras.mm_items, block_start, block_end,
                         [&](const MultimodalItem& item) {
                           size += kTag + kLength + item.identifier.size() + kInt64;
                         });
  return size;
}

// Kept out of line: the streaming state is large and only blocks past kInlineBytes need it.
template <typename Stream>
[[gnu::noinline]] BlockHash HashBlockStreamed(BlockHash parent, absl::Span<const int32_t> tokens,
                                              const BlockHashExtras& extras, int64_t block_start,
                                              int64_t block_end) {
  Stream stream;
  stream.Start();
  StreamWriter<Stream> writer(&stream);
  EncodeParentAndTokens(writer, parent, tokens);
  EncodeExtraKeys(writer, extras, block_start, block_end);
  return stream.Finish();
}

template <typename Stream>
BlockHash HashBlockWith(BlockHash parent, absl::Span<const int32_t> tokens,
                        const BlockHashExtras& extras, int64_t block_start) {
  const int64_t block_end = block_start + static_cast<int64_t>(tokens.size());
  const size_t extra_size = ExtraKeysSize(extras, block_start, block_end);
  const size_t size = 2 * sizeof(uint64_t) + tokens.size() * sizeof(int32_t) + extra_size;
  if (size > kInlineBytes) {
    return HashBlockStreamed<Stream>(parent, tokens, extras, block_start, block_end);
  }
  unsigned char buffer[kInlineBytes];
  BufferWriter writer(buffer);
  EncodeParentAndTokens(writer, parent, tokens);
  if (extra_size > 0) EncodeExtraKeys(writer, extras, block_start, block_end);
  KVPAGE_DCHECK(writer.size() == size);
  return Stream::OneShot(buffer, size);
}

// HashBlockWith with no extra keys: the encoding is the parent and the tokens. Written out
// rather than through BufferWriter and EncodeParentAndTokens: with them (a copy of a size
// known only at run time) BM_HashTokens/xxh3/16 took 43.0 µs instead of 25.4
// (scripts/ab_bench.sh, review of the sixth session of 2026-11-30).
template <typename Stream>
BlockHash HashPlainBlockWith(BlockHash parent, absl::Span<const int32_t> tokens) {
  constexpr size_t kParentBytes = 2 * sizeof(uint64_t);
  constexpr size_t kBlockOf16 = 16 * sizeof(int32_t);
  const size_t token_bytes = tokens.size() * sizeof(int32_t);
  if (std::endian::native != std::endian::little || kParentBytes + token_bytes > kInlineBytes) {
    return HashBlockWith<Stream>(parent, tokens, BlockHashExtras{}, 0);
  }
  unsigned char buffer[kInlineBytes];
  StoreLittleEndian(parent.lo, buffer);
  StoreLittleEndian(parent.hi, buffer + sizeof(uint64_t));
  // Blocks of 16 tokens (the default) copy a size known here, without a call.
  if (token_bytes == kBlockOf16) {
    std::memcpy(buffer + kParentBytes, tokens.data(), kBlockOf16);
  } else {
    std::memcpy(buffer + kParentBytes, tokens.data(), token_bytes);
  }
  return Stream::OneShot(buffer, kParentBytes + token_bytes);
}

BlockHash RootHash(HashAlgorithm algorithm, uint64_t seed) {
  unsigned char bytes[sizeof(seed)];
  StoreLittleEndian(seed, bytes);
  switch (algorithm) {
    case HashAlgorithm::kXxh3_128: return Xxh3Stream::OneShot(bytes, sizeof(bytes));
    case HashAlgorithm::kSha256: return Sha256Stream::OneShot(bytes, sizeof(bytes));
  }
  return BlockHash{};
}

uint64_t RandomSeed() {
  std::random_device device;
  // random_device yields 32 bits per call.
  const uint64_t high = device();
  return (high << 32) | device();
}

[[maybe_unused]] bool SortedByOffset(const std::vector<MultimodalItem>& items) {
  return std::is_sorted(items.begin(), items.end(),
                        [](const MultimodalItem& a, const MultimodalItem& b) {
                          return a.offset < b.offset;
                        });
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

BlockHash BlockHasher::HashBlock(BlockHash parent, absl::Span<const int32_t> tokens,
                                 const BlockHashExtras& extras, int64_t block_start) const {
  KVPAGE_DCHECK(block_start >= 0);
  switch (algorithm_) {
    case HashAlgorithm::kXxh3_128:
      return HashBlockWith<Xxh3Stream>(parent, tokens, extras, block_start);
    case HashAlgorithm::kSha256:
      return HashBlockWith<Sha256Stream>(parent, tokens, extras, block_start);
  }
  return BlockHash{};
}

BlockHash BlockHasher::HashPlainBlock(BlockHash parent, absl::Span<const int32_t> tokens) const {
  switch (algorithm_) {
    case HashAlgorithm::kXxh3_128: return HashPlainBlockWith<Xxh3Stream>(parent, tokens);
    case HashAlgorithm::kSha256: return HashPlainBlockWith<Sha256Stream>(parent, tokens);
  }
  return BlockHash{};
}

RequestBlockHashes::RequestBlockHashes(int32_t block_size, BlockHashExtras extras)
    : block_size_(block_size),
      has_extras_(extras.lora_id != 0 || !extras.cache_salt.empty() || !extras.mm_items.empty()),
      extras_(std::move(extras)) {
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Winvalid-offsetof"  // GCC lays out this class as written
  static_assert(offsetof(RequestBlockHashes, hashes_) + sizeof(hashes_) <= kHotBytes);
#pragma GCC diagnostic pop
  KVPAGE_DCHECK(block_size_ > 0);
  KVPAGE_DCHECK(SortedByOffset(extras_.mm_items));
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
