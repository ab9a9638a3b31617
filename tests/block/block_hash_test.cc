// Tests of kvpage/block_hash.h and block/request_block_hashes.h: the documented byte encoding,
// chaining, incremental hashing of a request, and which extra keys (LoRA, cache salt,
// multimodal items) enter which block.
#include "kvpage/block_hash.h"

#include <openssl/evp.h>
#include <xxhash.h>

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "block/request_block_hashes.h"

namespace kvpage {

// Lets gtest print a hash when an expectation fails.
void PrintTo(const BlockHash& hash, std::ostream* os) {
  *os << std::hex << "{lo=0x" << hash.lo << ", hi=0x" << hash.hi << "}" << std::dec;
}

namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

constexpr uint64_t kSeed = 42;
constexpr int32_t kBlockSize = 16;
constexpr HashAlgorithm kAllAlgorithms[] = {HashAlgorithm::kXxh3_128, HashAlgorithm::kSha256};

// `count` distinct token ids starting at `first`.
std::vector<int32_t> Tokens(int64_t count, int32_t first = 1000) {
  std::vector<int32_t> tokens;
  for (int64_t i = 0; i < count; ++i) tokens.push_back(first + static_cast<int32_t>(i));
  return tokens;
}

// The tokens of block `index` of a request.
absl::Span<const int32_t> Block(const std::vector<int32_t>& tokens, int64_t index) {
  return absl::MakeConstSpan(tokens).subspan(static_cast<size_t>(index * kBlockSize),
                                             kBlockSize);
}

// One hash per full block of `tokens`, from a fresh RequestBlockHashes.
std::vector<BlockHash> RequestHashes(const BlockHasher& hasher, const std::vector<int32_t>& tokens,
                                     const BlockHashExtras& extras = {}) {
  RequestBlockHashes hashes(kBlockSize, extras);
  hashes.Update(hasher, tokens);
  return {hashes.hashes().begin(), hashes.hashes().end()};
}

// An independent writer of the encoding documented in src/block/block_hash.cc.
class Encoding {
 public:
  Encoding& Parent(BlockHash parent) { return U64(parent.lo).U64(parent.hi); }
  Encoding& Tokens(absl::Span<const int32_t> tokens) {
    for (int32_t token : tokens) U32(static_cast<uint32_t>(token));
    return *this;
  }
  Encoding& Lora(int64_t lora_id) { return Byte('L').U64(static_cast<uint64_t>(lora_id)); }
  Encoding& Salt(const std::string& salt) { return Byte('S').String(salt); }
  Encoding& Item(const std::string& identifier, int64_t relative_offset) {
    return Byte('M').String(identifier).U64(static_cast<uint64_t>(relative_offset));
  }
  const std::string& bytes() const { return bytes_; }

 private:
  Encoding& Byte(char c) {
    bytes_.push_back(c);
    return *this;
  }
  Encoding& U32(uint32_t v) {
    for (int i = 0; i < 4; ++i) bytes_.push_back(static_cast<char>(v >> (8 * i)));
    return *this;
  }
  Encoding& U64(uint64_t v) {
    for (int i = 0; i < 8; ++i) bytes_.push_back(static_cast<char>(v >> (8 * i)));
    return *this;
  }
  Encoding& String(const std::string& s) {
    U32(static_cast<uint32_t>(s.size()));
    bytes_ += s;
    return *this;
  }
  std::string bytes_;
};

uint64_t LittleEndian64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{p[i]} << (8 * i);
  return v;
}

// H from the encoding comment, computed straight from the libraries.
BlockHash ReferenceHash(HashAlgorithm algorithm, const std::string& bytes) {
  if (algorithm == HashAlgorithm::kXxh3_128) {
    const XXH128_hash_t h = XXH3_128bits(bytes.data(), bytes.size());
    return BlockHash{h.low64, h.high64};
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  EXPECT_EQ(EVP_Digest(bytes.data(), bytes.size(), digest, nullptr, EVP_sha256(), nullptr), 1);
  return BlockHash{LittleEndian64(digest), LittleEndian64(digest + 8)};
}

// The vLLM test scenario: three images over four 16-token blocks.
//   block 0 [0, 16):  aaa [11, 21)
//   block 1 [16, 32): aaa, bbb [30, 48)
//   block 2 [32, 48): bbb
//   block 3 [48, 64): ccc [48, 55)
BlockHashExtras ThreeImages() {
  BlockHashExtras extras;
  extras.mm_items = {{"aaa", 11, 10}, {"bbb", 30, 18}, {"ccc", 48, 7}};
  return extras;
}

// ---- Algorithm names ---------------------------------------------------------------------

TEST(HashAlgorithmTest, CanonicalNames) {
  EXPECT_EQ(HashAlgorithmName(HashAlgorithm::kXxh3_128), "xxh3_128");
  EXPECT_EQ(HashAlgorithmName(HashAlgorithm::kSha256), "sha256");
}

TEST(HashAlgorithmTest, NamesRoundTrip) {
  for (HashAlgorithm algorithm : kAllAlgorithms) {
    absl::StatusOr<HashAlgorithm> parsed = ParseHashAlgorithm(HashAlgorithmName(algorithm));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, algorithm);
  }
}

TEST(HashAlgorithmTest, AcceptsOtherSpellings) {
  EXPECT_EQ(*ParseHashAlgorithm("XXH3_128"), HashAlgorithm::kXxh3_128);
  EXPECT_EQ(*ParseHashAlgorithm("xxhash"), HashAlgorithm::kXxh3_128);
  EXPECT_EQ(*ParseHashAlgorithm("SHA256"), HashAlgorithm::kSha256);
}

TEST(HashAlgorithmTest, RejectsUnknownNameNamingIt) {
  for (const char* text : {"md5", "", "sha256_cbor"}) {
    absl::StatusOr<HashAlgorithm> parsed = ParseHashAlgorithm(text);
    ASSERT_FALSE(parsed.ok()) << text;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(parsed.status().message(), HasSubstr(std::string("'") + text + "'"));
  }
}

// ---- Roots and seeds ---------------------------------------------------------------------

TEST(BlockHasherTest, ReportsItsAlgorithm) {
  EXPECT_EQ(BlockHasher().algorithm(), HashAlgorithm::kXxh3_128);
  EXPECT_EQ(BlockHasher(HashAlgorithm::kSha256, kSeed).algorithm(), HashAlgorithm::kSha256);
}

TEST(BlockHasherTest, SameSeedGivesSameRootAndHashes) {
  for (HashAlgorithm algorithm : kAllAlgorithms) {
    const BlockHasher a(algorithm, kSeed);
    const BlockHasher b(algorithm, kSeed);
    EXPECT_EQ(a.root(), b.root());
    const std::vector<int32_t> tokens = Tokens(64);
    EXPECT_THAT(RequestHashes(a, tokens), ElementsAreArray(RequestHashes(b, tokens)));
  }
}

TEST(BlockHasherTest, DifferentSeedsGiveDifferentRootsAndHashes) {
  for (HashAlgorithm algorithm : kAllAlgorithms) {
    const BlockHasher a(algorithm, 1);
    const BlockHasher b(algorithm, 2);
    EXPECT_NE(a.root(), b.root());
    const std::vector<int32_t> tokens = Tokens(16);
    const std::vector<BlockHash> from_a = RequestHashes(a, tokens);
    const std::vector<BlockHash> from_b = RequestHashes(b, tokens);
    ASSERT_EQ(from_a.size(), 1u);
    ASSERT_EQ(from_b.size(), 1u);
    EXPECT_NE(from_a[0], from_b[0]);
  }
}

TEST(BlockHasherTest, UnseededRootsAreRandom) {
  // Two 64-bit seeds drawn from std::random_device collide with probability 2^-64.
  EXPECT_NE(BlockHasher().root(), BlockHasher().root());
}

TEST(BlockHasherTest, RootIsTheHashOfTheSeedBytes) {
  const std::string seed_bytes("\x2a\0\0\0\0\0\0\0", 8);  // 42, little-endian
  for (HashAlgorithm algorithm : kAllAlgorithms) {
    EXPECT_EQ(BlockHasher(algorithm, kSeed).root(), ReferenceHash(algorithm, seed_bytes))
        << HashAlgorithmName(algorithm);
  }
}

TEST(BlockHasherTest, Sha256DiffersFromXxh3) {
  const BlockHasher xxh3(HashAlgorithm::kXxh3_128, kSeed);
  const BlockHasher sha256(HashAlgorithm::kSha256, kSeed);
  EXPECT_NE(xxh3.root(), sha256.root());
  const std::vector<int32_t> tokens = Tokens(16);
  const BlockHash parent{1, 2};
  EXPECT_NE(xxh3.HashBlock(parent, tokens, {}, 0), sha256.HashBlock(parent, tokens, {}, 0));
}

// ---- The byte encoding -------------------------------------------------------------------

TEST(EncodingTest, PlainBlockIsParentThenTokens) {
  const BlockHash parent{0x0123456789abcdefULL, 0xfedcba9876543210ULL};
  std::vector<int32_t> tokens = Tokens(16);
  tokens[5] = -7;  // negative ids are encoded as two's complement
  for (HashAlgorithm algorithm : kAllAlgorithms) {
    const BlockHasher hasher(algorithm, kSeed);
    EXPECT_EQ(hasher.HashBlock(parent, tokens, {}, 16),
              ReferenceHash(algorithm, Encoding().Parent(parent).Tokens(tokens).bytes()))
        << HashAlgorithmName(algorithm);
  }
}

// HashPlainBlock hashes the same encoding as HashBlock with no extra keys, for the fixed-size
// copy of 16-token blocks, other sizes and the streaming path past 1 KiB.
TEST(EncodingTest, PlainBlockHashIsTheSameEncoding) {
  const BlockHash parent{0x0123456789abcdefULL, 0xfedcba9876543210ULL};
  for (HashAlgorithm algorithm : kAllAlgorithms) {
    const BlockHasher hasher(algorithm, kSeed);
    for (int64_t size : {1, 15, 16, 17, 64, 252, 253, 300}) {
      std::vector<int32_t> tokens = Tokens(size);
      tokens[0] = -7;
      EXPECT_EQ(hasher.HashPlainBlock(parent, tokens),
                ReferenceHash(algorithm, Encoding().Parent(parent).Tokens(tokens).bytes()))
          << HashAlgorithmName(algorithm) << ", " << size << " tokens";
    }
  }
}

TEST(EncodingTest, ExtraKeysFollowInTagOrder) {
  const BlockHash parent{7, 9};
  const std::vector<int32_t> tokens = Tokens(16);
  BlockHashExtras extras;
  extras.lora_id = 3;
  extras.cache_salt = "tenant";
  extras.mm_items = {{"img", 4, 8}, {"clip", 12, 30}};
  const std::string want = Encoding()
                               .Parent(parent)
                               .Tokens(tokens)
                               .Lora(3)
                               .Salt("tenant")
                               .Item("img", 4)
                               .Item("clip", 12)
                               .bytes();
  for (HashAlgorithm algorithm : kAllAlgorithms) {
    const BlockHasher hasher(algorithm, kSeed);
    EXPECT_EQ(hasher.HashBlock(parent, tokens, extras, 0), ReferenceHash(algorithm, want))
        << HashAlgorithmName(algorithm);
  }
}

TEST(EncodingTest, MultimodalOffsetsAreRelativeToTheBlock) {
  // Block 1 of the three-image request: aaa began 5 tokens before it, bbb begins 14 into it.
  const BlockHash parent{11, 22};
  const std::vector<int32_t> tokens = Tokens(64);
  const std::string want =
      Encoding().Parent(parent).Tokens(Block(tokens, 1)).Item("aaa", -5).Item("bbb", 14).bytes();
  for (HashAlgorithm algorithm : kAllAlgorithms) {
    const BlockHasher hasher(algorithm, kSeed);
    EXPECT_EQ(hasher.HashBlock(parent, Block(tokens, 1), ThreeImages(), 16),
              ReferenceHash(algorithm, want))
        << HashAlgorithmName(algorithm);
  }
}

TEST(EncodingTest, LargeBlocksHashTheSameEncoding) {
  // Encodings past 1 KiB take the streaming path; 252 tokens fill exactly 1 KiB.
  const BlockHash parent{5, 6};
  BlockHashExtras extras;
  extras.lora_id = -2;
  extras.mm_items = {{std::string(3000, 'x'), 100, 1}};
  for (HashAlgorithm algorithm : kAllAlgorithms) {
    const BlockHasher hasher(algorithm, kSeed);
    for (int64_t size : {252, 253, 300, 2048}) {
      const std::vector<int32_t> tokens = Tokens(size);
      EXPECT_EQ(hasher.HashBlock(parent, tokens, {}, 0),
                ReferenceHash(algorithm, Encoding().Parent(parent).Tokens(tokens).bytes()))
          << HashAlgorithmName(algorithm) << " plain, " << size << " tokens";
      const std::string with_extras = Encoding()
                                          .Parent(parent)
                                          .Tokens(tokens)
                                          .Lora(-2)
                                          .Item(std::string(3000, 'x'), 100)
                                          .bytes();
      EXPECT_EQ(hasher.HashBlock(parent, tokens, extras, 0),
                ReferenceHash(algorithm, with_extras))
          << HashAlgorithmName(algorithm) << " with extras, " << size << " tokens";
    }
  }
}

TEST(EncodingTest, ExtraKeysCanPushABlockOntoTheStreamingPath) {
  // 250 tokens + parent = 1016 bytes; the 9-byte LoRA key makes 1025.
  const BlockHasher hasher(HashAlgorithm::kXxh3_128, kSeed);
  const std::vector<int32_t> tokens = Tokens(250);
  BlockHashExtras extras;
  extras.lora_id = 1;
  EXPECT_EQ(hasher.HashBlock(hasher.root(), tokens, extras, 0),
            ReferenceHash(HashAlgorithm::kXxh3_128,
                          Encoding().Parent(hasher.root()).Tokens(tokens).Lora(1).bytes()));
}

// ---- Chaining ----------------------------------------------------------------------------

TEST(ChainingTest, EachBlockChainsFromThePreviousHash) {
  const BlockHasher hasher(HashAlgorithm::kXxh3_128, kSeed);
  const std::vector<int32_t> tokens = Tokens(64);
  const std::vector<BlockHash> hashes = RequestHashes(hasher, tokens);
  ASSERT_EQ(hashes.size(), 4u);
  EXPECT_EQ(hashes[0], hasher.HashBlock(hasher.root(), Block(tokens, 0), {}, 0));
  for (int64_t i = 1; i < 4; ++i) {
    EXPECT_EQ(hashes[i], hasher.HashBlock(hashes[i - 1], Block(tokens, i), {}, i * kBlockSize))
        << "block " << i;
  }
}

TEST(ChainingTest, ChangingBlockZeroChangesEveryHash) {
  const BlockHasher hasher(HashAlgorithm::kXxh3_128, kSeed);
  std::vector<int32_t> tokens = Tokens(64);
  const std::vector<BlockHash> before = RequestHashes(hasher, tokens);
  tokens[3] += 1;
  const std::vector<BlockHash> after = RequestHashes(hasher, tokens);
  ASSERT_EQ(before.size(), 4u);
  ASSERT_EQ(after.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_NE(before[i], after[i]) << "block " << i;
}

TEST(ChainingTest, ChangingBlockTwoKeepsEarlierHashes) {
  const BlockHasher hasher(HashAlgorithm::kXxh3_128, kSeed);
  std::vector<int32_t> tokens = Tokens(64);
  const std::vector<BlockHash> before = RequestHashes(hasher, tokens);
  tokens[40] += 1;
  const std::vector<BlockHash> after = RequestHashes(hasher, tokens);
  ASSERT_EQ(before.size(), 4u);
  ASSERT_EQ(after.size(), 4u);
  EXPECT_EQ(before[0], after[0]);
  EXPECT_EQ(before[1], after[1]);
  EXPECT_NE(before[2], after[2]);
  EXPECT_NE(before[3], after[3]);
}

TEST(ChainingTest, SameBlockUnderDifferentParentsDiffers) {
  const BlockHasher hasher(HashAlgorithm::kXxh3_128, kSeed);
  const std::vector<int32_t> tokens = Tokens(16);
  EXPECT_NE(hasher.HashBlock({1, 0}, tokens, {}, 16), hasher.HashBlock({0, 1}, tokens, {}, 16));
}

// ---- RequestBlockHashes ------------------------------------------------------------------

TEST(RequestBlockHashesTest, HashesOnlyFullBlocks) {
  const BlockHasher hasher(HashAlgorithm::kXxh3_128, kSeed);
  const std::vector<int32_t> tokens = Tokens(48);
  RequestBlockHashes hashes(kBlockSize, {});
  EXPECT_EQ(hashes.block_size(), kBlockSize);
  hashes.Update(hasher, absl::MakeConstSpan(tokens).first(15));
  EXPECT_EQ(hashes.hashes().size(), 0u);
  hashes.Update(hasher, absl::MakeConstSpan(tokens).first(35));
  EXPECT_EQ(hashes.hashes().size(), 2u);
  hashes.Update(hasher, tokens);
  EXPECT_EQ(hashes.hashes().size(), 3u);
  EXPECT_THAT(hashes.hashes(), ElementsAreArray(RequestHashes(hasher, tokens)));
}

TEST(RequestBlockHashesTest, IncrementalUpdatesMatchOneUpdate) {
  const BlockHasher hasher(HashAlgorithm::kXxh3_128, kSeed);
  const std::vector<int32_t> tokens = Tokens(100);
  RequestBlockHashes hashes(kBlockSize, ThreeImages());
  for (size_t n = 1; n <= tokens.size(); ++n) hashes.Update(hasher, absl::MakeConstSpan(tokens).first(n));
  ASSERT_EQ(hashes.hashes().size(), 6u);
  EXPECT_THAT(hashes.hashes(), ElementsAreArray(RequestHashes(hasher, tokens, ThreeImages())));
}

TEST(RequestBlockHashesTest, HashedBlocksAreNotReadAgain) {
  const BlockHasher hasher(HashAlgorithm::kXxh3_128, kSeed);
  std::vector<int32_t> tokens = Tokens(48);
  RequestBlockHashes hashes(kBlockSize, {});
  hashes.Update(hasher, absl::MakeConstSpan(tokens).first(32));
  const std::vector<BlockHash> first_two(hashes.hashes().begin(), hashes.hashes().end());
  tokens[0] += 1;  // breaks the append-only contract: must go unnoticed
  hashes.Update(hasher, tokens);
  ASSERT_EQ(hashes.hashes().size(), 3u);
  EXPECT_EQ(hashes.hashes()[0], first_two[0]);
  EXPECT_EQ(hashes.hashes()[1], first_two[1]);
  EXPECT_EQ(hashes.hashes()[2], hasher.HashBlock(first_two[1], Block(tokens, 2), {}, 32));
}

TEST(RequestBlockHashesTest, ShorterSequenceChangesNothing) {
  const BlockHasher hasher(HashAlgorithm::kXxh3_128, kSeed);
  const std::vector<int32_t> tokens = Tokens(64);
  RequestBlockHashes hashes(kBlockSize, {});
  hashes.Update(hasher, tokens);
  hashes.Update(hasher, absl::MakeConstSpan(tokens).first(20));
  EXPECT_THAT(hashes.hashes(), ElementsAreArray(RequestHashes(hasher, tokens)));
}

TEST(RequestBlockHashesTest, TruncateThenUpdateRestoresTheSameHashes) {
  const BlockHasher hasher(HashAlgorithm::kXxh3_128, kSeed);
  const std::vector<int32_t> tokens = Tokens(64);
  const std::vector<BlockHash> full = RequestHashes(hasher, tokens);
  ASSERT_EQ(full.size(), 4u);
  RequestBlockHashes hashes(kBlockSize, {});
  hashes.Update(hasher, tokens);
  hashes.Truncate(40);
  ASSERT_EQ(hashes.hashes().size(), 2u);
  EXPECT_EQ(hashes.hashes()[0], full[0]);
  EXPECT_EQ(hashes.hashes()[1], full[1]);
  hashes.Update(hasher, tokens);
  EXPECT_THAT(hashes.hashes(), ElementsAreArray(full));
}

TEST(RequestBlockHashesTest, TruncateKeepsOnlyWholeBlocks) {
  const BlockHasher hasher(HashAlgorithm::kXxh3_128, kSeed);
  const std::vector<int32_t> tokens = Tokens(64);
  RequestBlockHashes hashes(kBlockSize, {});
  hashes.Update(hasher, tokens);
  hashes.Truncate(1000);
  EXPECT_EQ(hashes.hashes().size(), 4u);
  hashes.Truncate(32);
  EXPECT_EQ(hashes.hashes().size(), 2u);
  hashes.Truncate(31);
  EXPECT_EQ(hashes.hashes().size(), 1u);
  hashes.Truncate(0);
  EXPECT_EQ(hashes.hashes().size(), 0u);
}

TEST(RequestBlockHashesTest, TokensPastTheTruncationMayBeReplaced) {
  const BlockHasher hasher(HashAlgorithm::kXxh3_128, kSeed);
  std::vector<int32_t> tokens = Tokens(64);
  RequestBlockHashes hashes(kBlockSize, {});
  hashes.Update(hasher, tokens);
  hashes.Truncate(40);
  for (size_t i = 40; i < tokens.size(); ++i) tokens[i] = 7;  // rejected draft tokens replaced
  hashes.Update(hasher, tokens);
  EXPECT_THAT(hashes.hashes(), ElementsAreArray(RequestHashes(hasher, tokens)));
}

TEST(RequestBlockHashesTest, KeepsItsExtras) {
  const BlockHasher hasher(HashAlgorithm::kXxh3_128, kSeed);
  const RequestBlockHashes hashes(kBlockSize, ThreeImages());
  ASSERT_EQ(hashes.extras().mm_items.size(), 3u);
  EXPECT_EQ(hashes.extras().mm_items[1].identifier, "bbb");
}

// ---- Cache salt and LoRA -----------------------------------------------------------------

TEST(CacheSaltTest, SaltChangesEveryHashOfTheRequest) {
  const BlockHasher hasher(HashAlgorithm::kXxh3_128, kSeed);
  const std::vector<int32_t> tokens = Tokens(64);
  BlockHashExtras salt_a, salt_b;
  salt_a.cache_salt = "tenant-a";
  salt_b.cache_salt = "tenant-b";
  const std::vector<BlockHash> none = RequestHashes(hasher, tokens);
  const std::vector<BlockHash> a = RequestHashes(hasher, tokens, salt_a);
  const std::vector<BlockHash> b = RequestHashes(hasher, tokens, salt_b);
  ASSERT_EQ(none.size(), 4u);
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(b.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_NE(none[i], a[i]) << "block " << i;
    EXPECT_NE(a[i], b[i]) << "block " << i;
  }
}

TEST(CacheSaltTest, SaltEntersTheFirstBlockOnly) {
  const BlockHasher hasher(HashAlgorithm::kXxh3_128, kSeed);
  const std::vector<int32_t> tokens = Tokens(16);
  BlockHashExtras salted;
  salted.cache_salt = "tenant-a";
  const BlockHash parent{3, 4};
  EXPECT_EQ(hasher.HashBlock(parent, tokens, salted, 16), hasher.HashBlock(parent, tokens, {}, 16));
  EXPECT_NE(hasher.HashBlock(parent, tokens, salted, 0), hasher.HashBlock(parent, tokens, {}, 0));
}

TEST(LoraTest, LoraIdEntersEveryBlock) {
  const BlockHasher hasher(HashAlgorithm::kXxh3_128, kSeed);
  const std::vector<int32_t> tokens = Tokens(16);
  BlockHashExtras lora_1, lora_2;
  lora_1.lora_id = 1;
  lora_2.lora_id = 2;
  const BlockHash parent{3, 4};
  for (int64_t block_start : {0, 16, 160}) {
    const BlockHash base = hasher.HashBlock(parent, tokens, {}, block_start);
    EXPECT_NE(hasher.HashBlock(parent, tokens, lora_1, block_start), base) << block_start;
    EXPECT_NE(hasher.HashBlock(parent, tokens, lora_1, block_start),
              hasher.HashBlock(parent, tokens, lora_2, block_start))
        << block_start;
  }
}

TEST(LoraTest, LoraChangesEveryHashOfTheRequest) {
  const BlockHasher hasher(HashAlgorithm::kXxh3_128, kSeed);
  const std::vector<int32_t> tokens = Tokens(64);
  BlockHashExtras lora;
  lora.lora_id = 5;
  const std::vector<BlockHash> none = RequestHashes(hasher, tokens);
  const std::vector<BlockHash> with_lora = RequestHashes(hasher, tokens, lora);
  ASSERT_EQ(none.size(), 4u);
  ASSERT_EQ(with_lora.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_NE(none[i], with_lora[i]) << "block " << i;
}

// ---- Multimodal items --------------------------------------------------------------------

// For each block of the three-image request: the items that overlap it, with offsets relative
// to the block's start (lengths keep them overlapping a block that starts at 0).
TEST(MultimodalTest, EachBlockHashesExactlyTheItemsItOverlaps) {
  const std::vector<std::vector<MultimodalItem>> expected = {
      {{"aaa", 11, 10}},
      {{"aaa", -5, 10}, {"bbb", 14, 18}},
      {{"bbb", -2, 18}},
      {{"ccc", 0, 7}},
  };
  const BlockHasher hasher(HashAlgorithm::kXxh3_128, kSeed);
  const std::vector<int32_t> tokens = Tokens(64);
  const BlockHash parent{8, 9};
  for (int64_t i = 0; i < 4; ++i) {
    BlockHashExtras hand_built;
    hand_built.mm_items = expected[static_cast<size_t>(i)];
    const BlockHash got = hasher.HashBlock(parent, Block(tokens, i), ThreeImages(), i * 16);
    EXPECT_EQ(got, hasher.HashBlock(parent, Block(tokens, i), hand_built, 0)) << "block " << i;
    EXPECT_NE(got, hasher.HashBlock(parent, Block(tokens, i), {}, i * 16)) << "block " << i;
  }
}

TEST(MultimodalTest, ItemsTouchingABlockBoundaryStayOut) {
  const BlockHasher hasher(HashAlgorithm::kXxh3_128, kSeed);
  const std::vector<int32_t> tokens = Tokens(16);
  const BlockHash parent{8, 9};
  const BlockHash plain = hasher.HashBlock(parent, tokens, {}, 16);  // block [16, 32)
  BlockHashExtras ends_at_start, starts_at_end, empty_item, first_token, last_token;
  ends_at_start.mm_items = {{"x", 11, 5}};
  starts_at_end.mm_items = {{"x", 32, 4}};
  empty_item.mm_items = {{"x", 20, 0}};
  first_token.mm_items = {{"x", 11, 6}};
  last_token.mm_items = {{"x", 31, 4}};
  EXPECT_EQ(hasher.HashBlock(parent, tokens, ends_at_start, 16), plain);
  EXPECT_EQ(hasher.HashBlock(parent, tokens, starts_at_end, 16), plain);
  EXPECT_EQ(hasher.HashBlock(parent, tokens, empty_item, 16), plain);
  EXPECT_NE(hasher.HashBlock(parent, tokens, first_token, 16), plain);
  EXPECT_NE(hasher.HashBlock(parent, tokens, last_token, 16), plain);
}

TEST(MultimodalTest, SameImagesDifferentTailShareLeadingBlocks) {
  const BlockHasher hasher(HashAlgorithm::kXxh3_128, kSeed);
  std::vector<int32_t> question_a = Tokens(64);
  std::vector<int32_t> question_b = question_a;
  for (size_t i = 55; i < 64; ++i) question_b[i] = 99;  // the text after ccc differs
  const std::vector<BlockHash> a = RequestHashes(hasher, question_a, ThreeImages());
  const std::vector<BlockHash> b = RequestHashes(hasher, question_b, ThreeImages());
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(b.size(), 4u);
  EXPECT_EQ(a[0], b[0]);
  EXPECT_EQ(a[1], b[1]);
  EXPECT_EQ(a[2], b[2]);
  EXPECT_NE(a[3], b[3]);
}

TEST(MultimodalTest, DifferentImageSplitsFromItsFirstBlock) {
  // Placeholder tokens are identical; only the identifier tells the images apart.
  const BlockHasher hasher(HashAlgorithm::kXxh3_128, kSeed);
  const std::vector<int32_t> tokens = Tokens(64);
  BlockHashExtras other = ThreeImages();
  other.mm_items[1].identifier = "bbb2";
  const std::vector<BlockHash> a = RequestHashes(hasher, tokens, ThreeImages());
  const std::vector<BlockHash> b = RequestHashes(hasher, tokens, other);
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(b.size(), 4u);
  EXPECT_EQ(a[0], b[0]);
  for (int i = 1; i < 4; ++i) EXPECT_NE(a[i], b[i]) << "block " << i;
}

}  // namespace
}  // namespace kvpage
