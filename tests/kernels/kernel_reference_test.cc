// CPU references of the kernels (kernel_reference.h) and the shared layout helpers
// (kernel_layout.h): exact numbers on hand-checkable cases plus invariants.
#include "kvpage/kernel_reference.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kvpage/kernel_layout.h"

namespace kvpage {
namespace {

using ref::Bf16ToFloat;
using ref::F16ToFloat;
using ref::FloatToBf16;
using ref::FloatToF16;

constexpr double kInf = std::numeric_limits<double>::infinity();

// 16-byte aligned host storage of 16-bit elements.
struct AlignedHalves {
  explicit AlignedHalves(size_t n, uint16_t fill = 0) : storage((n + 7) / 8 + 1) {
    for (size_t i = 0; i < n; ++i) data()[i] = fill;
  }
  uint16_t* data() { return reinterpret_cast<uint16_t*>(storage.data()); }
  struct alignas(16) Chunk {
    uint16_t v[8];
  };
  std::vector<Chunk> storage;
};

TEST(HalfConversionTest, Bf16ExactValuesAndTiesToEven) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBf16(-2.0f), 0xc000);
  EXPECT_EQ(FloatToBf16(1.0f + 0x1p-8f), 0x3f80);      // tie, even mantissa kept
  EXPECT_EQ(FloatToBf16(1.0f + 3 * 0x1p-8f), 0x3f82);  // tie, rounds up to even
  EXPECT_EQ(FloatToBf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
  EXPECT_EQ(Bf16ToFloat(0x3f81), 1.0078125f);
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::nanf("")))));
}

TEST(HalfConversionTest, F16ExactValuesTiesAndRanges) {
  EXPECT_EQ(FloatToF16(1.0f), 0x3c00);
  EXPECT_EQ(FloatToF16(-2.0f), 0xc000);
  EXPECT_EQ(FloatToF16(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToF16(65519.0f), 0x7bff);
  EXPECT_EQ(FloatToF16(65520.0f), 0x7c00);
  EXPECT_EQ(FloatToF16(0x1p-24f), 0x0001);
  EXPECT_EQ(FloatToF16(0x1p-25f), 0x0000);       // tie to even (0)
  EXPECT_EQ(FloatToF16(3 * 0x1p-25f), 0x0002);   // 1.5 ulp ties to 2
  EXPECT_EQ(FloatToF16(1.0f + 0x1p-11f), 0x3c00);
  EXPECT_EQ(FloatToF16(1.0f + 3 * 0x1p-11f), 0x3c02);
  EXPECT_EQ(FloatToF16(0x1p-14f - 0x1p-26f), 0x0400);  // rounds up into the smallest normal
  EXPECT_EQ(F16ToFloat(0x0001), 0x1p-24f);
  EXPECT_EQ(F16ToFloat(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(F16ToFloat(FloatToF16(std::nanf("")))));
}

TEST(HalfConversionTest, EveryNonNanBitPatternRoundTrips) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const uint16_t bits = static_cast<uint16_t>(b);
    if (!std::isnan(F16ToFloat(bits))) {
      ASSERT_EQ(FloatToF16(F16ToFloat(bits)), bits) << b;
    }
    if (!std::isnan(Bf16ToFloat(bits))) {
      ASSERT_EQ(FloatToBf16(Bf16ToFloat(bits)), bits) << b;
    }
  }
}

TEST(HalfConversionTest, E4m3ExactValuesTiesAndSaturation) {
  using ref::E4m3ToFloat;
  using ref::FloatToE4m3;
  EXPECT_EQ(FloatToE4m3(1.0f), 0x38);
  EXPECT_EQ(FloatToE4m3(-2.0f), 0xc0);
  EXPECT_EQ(FloatToE4m3(448.0f), 0x7e);
  EXPECT_EQ(FloatToE4m3(500.0f), 0x7e);  // saturates
  EXPECT_EQ(FloatToE4m3(-std::numeric_limits<float>::infinity()), 0xfe);
  EXPECT_EQ(FloatToE4m3(0x1p-9f), 0x01);
  EXPECT_EQ(FloatToE4m3(0x1p-10f), 0x00);      // tie to even (0)
  EXPECT_EQ(FloatToE4m3(3 * 0x1p-10f), 0x02);  // 1.5 ulp ties to 2
  EXPECT_EQ(FloatToE4m3(1.0625f), 0x38);       // halfway 1 / 1.125: even mantissa
  EXPECT_EQ(FloatToE4m3(1.1875f), 0x3a);       // halfway 1.125 / 1.25: up to even
  EXPECT_EQ(FloatToE4m3(0x1p-6f - 0x1p-11f), 0x08);  // rounds up into the smallest normal
  EXPECT_EQ(FloatToE4m3(std::nanf("")), 0x7f);
  EXPECT_EQ(E4m3ToFloat(0x7e), 448.0f);
  EXPECT_EQ(E4m3ToFloat(0x01), 0x1p-9f);
  EXPECT_TRUE(std::isnan(E4m3ToFloat(0xff)));
  for (uint32_t b = 0; b < 0x100; ++b) {
    const uint8_t bits = static_cast<uint8_t>(b);
    if (!std::isnan(E4m3ToFloat(bits))) {
      ASSERT_EQ(FloatToE4m3(E4m3ToFloat(bits)), bits) << b;
    }
  }
}

TEST(KernelLayoutTest, BlocksFirstStridesAndOffsets) {
  alignas(16) static uint16_t memory[8];
  const KvCacheView c = BlocksFirstKvCache(memory, 10, 16, 8, 128, DType::kBF16);
  EXPECT_EQ(c.head_stride, 128);
  EXPECT_EQ(c.token_stride, 1024);
  EXPECT_EQ(c.kv_stride, 16384);
  EXPECT_EQ(c.block_stride, 32768);
  EXPECT_EQ(KvElementOffset(c.block_stride, c.kv_stride, c.token_stride, c.head_stride, 3, 1,
                            5, 2),
            3 * 32768 + 16384 + 5 * 1024 + 2 * 128);
  EXPECT_EQ(ContiguousBlockBytes(c), 65536);
  EXPECT_TRUE(ValidateKvCacheView(c).ok());
  const KvCacheView mla = MlaKvCache(memory, 4, 64, 576, DType::kBF16);
  EXPECT_EQ(mla.block_stride, 64 * 576);
  EXPECT_EQ(ContiguousBlockBytes(mla), 64 * 576 * 2);
}

TEST(KernelLayoutTest, OffsetsAreInt64) {
  // 70000 blocks of 64 KiB elements is past 2^32 elements.
  EXPECT_EQ(KvElementOffset(32768, 16384, 1024, 128, 70000, 0, 0, 0), int64_t{70000} * 32768);
}

TEST(KernelLayoutTest, ValidationNamesTheBadValue) {
  alignas(16) static uint16_t memory[8];
  KvCacheView c = BlocksFirstKvCache(memory, 10, 16, 8, 12, DType::kBF16);
  absl::Status s = ValidateKvCacheView(c);
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_NE(s.message().find("head_dim 12"), absl::string_view::npos) << s;
  c = BlocksFirstKvCache(memory, 10, 16, 8, 64, DType::kF32);
  s = ValidateKvCacheView(c);
  EXPECT_NE(s.message().find("f32"), absl::string_view::npos) << s;
  c = BlocksFirstKvCache(memory + 1, 10, 16, 8, 64, DType::kF16);
  EXPECT_TRUE(absl::IsInvalidArgument(ValidateKvCacheView(c)));
  c = BlocksFirstKvCache(memory, 10, 16, 8, 64, DType::kF16);
  c.kv_stride = 8;  // V right after the first head row: not one contiguous block
  SlotTensor t;
  EXPECT_TRUE(absl::IsInvalidArgument(KvBlockSlotTensor(c, &t)));
}

TEST(KernelLayoutTest, AttendedAndSplitRanges) {
  EXPECT_EQ(AttendedRange(10, -1).begin, 0);
  EXPECT_EQ(AttendedRange(10, -1).end, 10);
  EXPECT_EQ(AttendedRange(10, 3).begin, 6);  // query at 9 plus 3 tokens before it
  EXPECT_EQ(AttendedRange(3, 5).begin, 0);
  EXPECT_EQ(AttendedRange(0, -1).end, 0);
  const TokenRange r{6, 10};
  EXPECT_EQ(SplitRange(r, 3, 0, 3).begin, 6);
  EXPECT_EQ(SplitRange(r, 3, 0, 3).end, 9);
  EXPECT_EQ(SplitRange(r, 3, 1, 3).begin, 9);
  EXPECT_EQ(SplitRange(r, 3, 1, 3).end, 10);
  EXPECT_EQ(SplitRange(r, 3, 2, 3).begin, 10);
  EXPECT_EQ(SplitRange(r, 3, 2, 3).end, 10);
}

// A plan made for 32 tokens (2 splits of 16), e.g. captured in a CUDA graph, replayed for a
// 100-token sequence: the last split takes tokens 16..99 instead of dropping 32..99.
TEST(KernelLayoutTest, LastSplitRunsToTheEnd) {
  const TokenRange r = AttendedRange(100, -1);
  EXPECT_EQ(SplitRange(r, 16, 0, 2).begin, 0);
  EXPECT_EQ(SplitRange(r, 16, 0, 2).end, 16);
  EXPECT_EQ(SplitRange(r, 16, 1, 2).begin, 16);
  EXPECT_EQ(SplitRange(r, 16, 1, 2).end, 100);
  // With a window: [60, 100), chunks of 16 from 60.
  const TokenRange w = AttendedRange(100, 39);
  EXPECT_EQ(SplitRange(w, 16, 1, 2).begin, 76);
  EXPECT_EQ(SplitRange(w, 16, 1, 2).end, 100);
  // More splits than the range needs: the later ones are empty.
  EXPECT_EQ(SplitRange(TokenRange{0, 20}, 16, 1, 4).end, 20);
  EXPECT_EQ(SplitRange(TokenRange{0, 20}, 16, 2, 4).begin, 20);
  EXPECT_EQ(SplitRange(TokenRange{0, 20}, 16, 3, 4).end, 20);
}

TEST(KernelLayoutTest, SplitsPartitionTheAttendedRange) {
  std::mt19937 rng(7);
  for (int iter = 0; iter < 2000; ++iter) {
    const int32_t len = static_cast<int32_t>(rng() % 3000);
    const int32_t window = static_cast<int32_t>(rng() % 600) - 100;  // some negative: off
    const int32_t chunk = 1 + static_cast<int32_t>(rng() % 700);
    const int32_t splits = 1 + static_cast<int32_t>(rng() % 12);  // often too few for len
    const TokenRange a = AttendedRange(len, window);
    int32_t next = a.begin;
    for (int32_t s = 0; s < splits; ++s) {
      const TokenRange piece = SplitRange(a, chunk, s, splits);
      ASSERT_EQ(piece.begin, std::min(a.end, next)) << s;
      if (s < splits - 1) {
        ASSERT_LE(piece.end - piece.begin, chunk);
      }
      next = std::max(next, piece.end);
    }
    ASSERT_EQ(next, a.end) << len << " " << window << " " << chunk << " " << splits;
  }
}

TEST(PlanDecodeTest, ExactPlans) {
  DecodePlan plan;
  // An H200 (132 SMs) with the GQA-4 kernel's 3 CTAs per SM: one wave is 396 CTAs.
  DecodePlanInputs in{.num_seqs = 1, .num_kv_heads = 8, .head_tiles = 1,
                      .max_attended_tokens = 32768, .block_size = 16, .num_sms = 132,
                      .ctas_per_sm = 3};
  ASSERT_TRUE(PlanDecode(in, &plan).ok());
  EXPECT_EQ(plan.num_splits, 49);  // floor(396 / 8)
  EXPECT_EQ(plan.chunk_tokens, 672);  // ceil(32768 / 49) = 669, rounded up to 16
  in.num_seqs = 64;
  in.max_attended_tokens = 4096;
  ASSERT_TRUE(PlanDecode(in, &plan).ok());
  EXPECT_EQ(plan.num_splits, 1);  // 512 CTAs already fill a wave
  EXPECT_EQ(plan.chunk_tokens, 4096);
  in.num_seqs = 1;
  in.max_attended_tokens = 300;
  ASSERT_TRUE(PlanDecode(in, &plan).ok());
  EXPECT_EQ(plan.num_splits, 2);  // at least 256 tokens per split
  EXPECT_EQ(plan.chunk_tokens, 160);
  EXPECT_FALSE(plan.use_tensor_cores);
  EXPECT_FALSE(plan.force_cuda_cores);
  in.force_cuda_cores = true;  // the path choice travels with the plan
  ASSERT_TRUE(PlanDecode(in, &plan).ok());
  EXPECT_TRUE(plan.force_cuda_cores);
  in.num_seqs = 0;
  absl::Status s = PlanDecode(in, &plan);
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_NE(s.message().find("num_seqs 0"), absl::string_view::npos) << s;
  in.num_seqs = 1;
  in.ctas_per_sm = 0;
  s = PlanDecode(in, &plan);
  EXPECT_NE(s.message().find("ctas_per_sm 0"), absl::string_view::npos) << s;
}

// The split count follows the kernel's occupancy and never starts a partial second wave.
// 8 sequences x 8 KV heads = 64 CTAs of 4,096 tokens on 132 SMs.
TEST(PlanDecodeTest, SplitsFillWholeWavesOfTheKernelsOccupancy) {
  DecodePlan plan;
  DecodePlanInputs in{.num_seqs = 8, .num_kv_heads = 8, .head_tiles = 1,
                      .max_attended_tokens = 4096, .block_size = 16, .num_sms = 132,
                      .ctas_per_sm = 7};  // the GQA-1 kernel: wave 924
  ASSERT_TRUE(PlanDecode(in, &plan).ok());
  EXPECT_EQ(plan.num_splits, 14);  // 14 x 64 = 896 <= 924
  EXPECT_EQ(plan.chunk_tokens, 304);
  in.ctas_per_sm = 3;  // GQA 4: wave 396
  ASSERT_TRUE(PlanDecode(in, &plan).ok());
  EXPECT_EQ(plan.num_splits, 6);  // 384 CTAs; 2 x SMs (264) gave 5
  EXPECT_EQ(plan.chunk_tokens, 688);
  in.ctas_per_sm = 2;  // GQA 8: wave 264
  ASSERT_TRUE(PlanDecode(in, &plan).ok());
  EXPECT_EQ(plan.num_splits, 4);  // 256 CTAs; ceil(264 / 64) = 5 would need 320 > 264
  EXPECT_EQ(plan.chunk_tokens, 1024);
}

TEST(PlanDecodeTest, ChunksCoverTheLongestSequence) {
  for (int32_t tokens : {0, 1, 15, 16, 17, 255, 256, 4097, 131072}) {
    for (int32_t seqs : {1, 3, 64}) {
      DecodePlan plan;
      DecodePlanInputs in{.num_seqs = seqs, .num_kv_heads = 2, .head_tiles = 1,
                          .max_attended_tokens = tokens, .block_size = 64, .num_sms = 132,
                          .ctas_per_sm = 2};
      ASSERT_TRUE(PlanDecode(in, &plan).ok());
      EXPECT_EQ(plan.chunk_tokens % 64, 0);
      EXPECT_GE(int64_t{plan.num_splits} * plan.chunk_tokens, tokens);
      EXPECT_LT(int64_t{plan.num_splits - 1} * plan.chunk_tokens, std::max(tokens, 1));
      EXPECT_LE(plan.num_splits, 64);
      EXPECT_LE(int64_t{plan.num_splits} * seqs * 2, std::max(264, seqs * 2));
    }
  }
}

// CUDA's occupancy arithmetic for sm_90, on the register counts ptxas reports for the decode
// kernels (issue 23's table: 68, 138 and 241 registers; FlashInfer's GQA-4 decode 61).
TEST(PlanDecodeTest, Sm90CtasPerSm) {
  EXPECT_EQ(Sm90CtasPerSm(68, 128, 0), 7);
  EXPECT_EQ(Sm90CtasPerSm(138, 128, 0), 3);
  EXPECT_EQ(Sm90CtasPerSm(241, 128, 0), 2);
  EXPECT_EQ(Sm90CtasPerSm(61, 128, 0), 8);
  EXPECT_EQ(Sm90CtasPerSm(32, 128, 0), 16);       // 16 x 4 warps = 64 warps
  EXPECT_EQ(Sm90CtasPerSm(32, 64, 0), 32);        // the CTA limit
  EXPECT_EQ(Sm90CtasPerSm(64, 128, 48 * 1024), 4);  // 49 KiB each of 228 KiB
  EXPECT_EQ(Sm90CtasPerSm(256, 128, 0), 0);
  EXPECT_EQ(Sm90CtasPerSm(32, 128, 300 * 1024), 0);
}

TEST(WriteKvRefTest, Fp8StoresScaledSaturatedValues) {
  // 2 blocks of 2 tokens, one head of 16: an fp8 K or V half is 32 bytes, a block 64.
  alignas(16) static uint8_t cache[2 * 64];
  std::memset(cache, 0xaa, sizeof(cache));
  const KvCacheView c = BlocksFirstKvCache(cache, 2, 2, 1, 16, DType::kFP8);
  EXPECT_TRUE(ValidateKvCacheView(c).ok());
  std::vector<uint16_t> k(16), v(16);
  for (int i = 0; i < 16; ++i) {
    k[i] = FloatToBf16(static_cast<float>(i));          // / 0.5: 0, 2, 4, ... 30
    v[i] = FloatToBf16(i == 0 ? 1000.0f : -1.0f * i);   // / 2: saturates, then -0.5 i
  }
  const int64_t slots[] = {3};  // block 1, offset 1
  ASSERT_TRUE(ref::WriteKvFp8(k.data(), v.data(), 16, 16, slots, 1, DType::kBF16, 0.5f, 2.0f, c)
                  .ok());
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(ref::E4m3ToFloat(cache[64 + 16 + i]), 2.0f * i) << i;  // K, token 1 of block 1
  }
  EXPECT_EQ(cache[64 + 32 + 16], 0x7e);  // 1000 / 2 saturates to 448
  EXPECT_EQ(ref::E4m3ToFloat(cache[64 + 32 + 16 + 3]), -1.5f);
  EXPECT_EQ(cache[0], 0xaa);
  EXPECT_EQ(cache[64 + 15], 0xaa);  // token 0 of block 1 untouched
  absl::Status s = ref::WriteKvFp8(k.data(), v.data(), 16, 16, slots, 1, DType::kBF16, 0.0f,
                                   1.0f, c);
  EXPECT_NE(s.message().find("scale 0"), absl::string_view::npos) << s;
  s = ref::WriteKv(k.data(), v.data(), 16, 16, slots, 1, c);
  EXPECT_NE(s.message().find("fp8"), absl::string_view::npos) << s;
  // An fp8 view needs head_dim in whole 16-value vectors.
  EXPECT_TRUE(absl::IsInvalidArgument(
      ValidateKvCacheView(BlocksFirstKvCache(cache, 2, 2, 1, 8, DType::kFP8))));
}

// Decode of an fp8 cache written by WriteKvFp8: K reads as stored * k_scale, V as
// stored * v_scale, q and out in fp8_query_dtype.
TEST(Fp8DecodeRefTest, CacheReadsScaledValues) {
  alignas(16) static uint8_t cache[64];  // 1 block of 2 tokens, one head of 16
  std::memset(cache, 0xff, sizeof(cache));  // e4m3 NaN everywhere else
  const KvCacheView c = BlocksFirstKvCache(cache, 1, 2, 1, 16, DType::kFP8);
  std::vector<uint16_t> k(32, FloatToF16(0.0f)), v(32);
  k[16] = FloatToF16(1.0f);  // token 1: k[0] = 1 (stored 1 / 0.5 = 2)
  for (int i = 0; i < 16; ++i) {
    v[i] = FloatToF16(3.0f);        // stored 1.5
    v[16 + i] = FloatToF16(-1.0f);  // stored -0.5
  }
  const int64_t slots[] = {0, 1};
  ASSERT_TRUE(
      ref::WriteKvFp8(k.data(), v.data(), 16, 16, slots, 2, DType::kF16, 0.5f, 2.0f, c).ok());
  EXPECT_EQ(ref::E4m3ToFloat(cache[16]), 2.0f);
  std::vector<uint16_t> q(16, FloatToF16(0.0f));
  q[0] = FloatToF16(1.0f);  // scores 0 and 1 (scale 1)
  const int32_t table[] = {0};
  const int32_t lens[] = {2};
  DecodeParams params{1, 1.0f, -1};
  params.k_scale = 0.5f;
  params.v_scale = 2.0f;
  params.fp8_query_dtype = DType::kF16;
  double out[16], lse[1];
  ASSERT_TRUE(ref::PagedDecode(q.data(), 16, c, {table, 1, lens, 1}, params, out, lse).ok());
  const double e = std::exp(1.0);
  for (double o : out) EXPECT_NEAR(o, (3.0 - e) / (1.0 + e), 1e-12);
  EXPECT_NEAR(lse[0], std::log(1.0 + e), 1e-12);

  params.k_scale = 0.0f;
  absl::Status s = ref::PagedDecode(q.data(), 16, c, {table, 1, lens, 1}, params, out, lse);
  EXPECT_NE(s.message().find("PagedDecode: scale 0 is not a positive"), absl::string_view::npos)
      << s;
  params.k_scale = 0.5f;
  params.fp8_query_dtype = DType::kFP8;
  s = ref::PagedDecode(q.data(), 16, c, {table, 1, lens, 1}, params, out, lse);
  EXPECT_NE(s.message().find("fp8_query_dtype fp8"), absl::string_view::npos) << s;
  // Scales are for fp8 caches only: a bf16 cache with k_scale 0.5 is a caller bug.
  AlignedHalves halves(64, 0);
  const KvCacheView bf16 = BlocksFirstKvCache(halves.data(), 1, 2, 1, 16, DType::kBF16);
  params.fp8_query_dtype = DType::kBF16;
  s = ref::PagedDecode(q.data(), 16, bf16, {table, 1, lens, 1}, params, out, lse);
  EXPECT_NE(s.message().find("k_scale 0.5 / v_scale 2 for a bf16 cache"),
            absl::string_view::npos)
      << s;
}

// Absorbed MLA: K is the whole latent row (16 latent + 16 rope here), V its latent part only.
TEST(MlaDecodeRefTest, LatentRowIsKAndItsLatentPartV) {
  AlignedHalves cache(2 * 32, 0);  // 1 block of 2 tokens, rows of 32
  const KvCacheView c = MlaKvCache(cache.data(), 1, 2, 32, DType::kBF16);
  for (int i = 0; i < 16; ++i) {
    cache.data()[i] = FloatToBf16(1.0f);       // token 0: latent 1, rope 0
    cache.data()[32 + i] = FloatToBf16(2.0f);  // token 1: latent 2, rope[0] 1
  }
  cache.data()[32 + 16] = FloatToBf16(1.0f);
  std::vector<uint16_t> q(64, FloatToBf16(0.0f));  // two heads: rope-only, latent-only
  q[16] = FloatToBf16(1.0f);                       // head 0: scores 0 and 1
  q[32] = FloatToBf16(0.5f);                       // head 1: scores 0.5 and 1
  const int32_t table[] = {0};
  const int32_t lens[] = {2};
  double out[32], lse[2];
  ASSERT_TRUE(
      ref::PagedDecodeMla(q.data(), 64, c, {table, 1, lens, 1}, {2, 1.0f, -1}, 16, out, lse)
          .ok());
  const double e = std::exp(1.0), e2 = std::exp(0.5);
  for (int i = 0; i < 16; ++i) {
    EXPECT_NEAR(out[i], (1.0 + 2.0 * e) / (1.0 + e), 1e-12) << i;
    EXPECT_NEAR(out[16 + i], (e2 + 2.0 * e) / (e2 + e), 1e-12) << i;
  }
  EXPECT_NEAR(lse[0], std::log(1.0 + e), 1e-12);
  absl::Status s =
      ref::PagedDecodeMla(q.data(), 64, c, {table, 1, lens, 1}, {2, 1.0f, -1}, 33, out, lse);
  EXPECT_NE(s.message().find("latent_dim 33 is outside (0, 32]"), absl::string_view::npos) << s;
  const KvCacheView kv = BlocksFirstKvCache(cache.data(), 1, 2, 1, 16, DType::kBF16);
  s = ref::PagedDecodeMla(q.data(), 64, kv, {table, 1, lens, 1}, {2, 1.0f, -1}, 16, out, lse);
  EXPECT_NE(s.message().find("the view has a V half (kv_stride 32)"), absl::string_view::npos)
      << s;
}

TEST(WriteKvRefTest, ScattersRowsBySlotAndSkipsNegative) {
  // 3 blocks of 2 tokens, 2 heads of 8: a K or V half is 32 elements, a block 64.
  AlignedHalves cache(3 * 64, 0xffff);
  const KvCacheView c = BlocksFirstKvCache(cache.data(), 3, 2, 2, 8, DType::kBF16);
  std::vector<uint16_t> k(3 * 16), v(3 * 16);
  for (int i = 0; i < 48; ++i) {
    k[i] = static_cast<uint16_t>(i);
    v[i] = static_cast<uint16_t>(1000 + i);
  }
  const int64_t slots[] = {5, -1, 0};  // token 0 -> block 2 offset 1; token 2 -> block 0 offset 0
  ASSERT_TRUE(ref::WriteKv(k.data(), v.data(), 16, 16, slots, 3, c).ok());
  const uint16_t* m = cache.data();
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(m[2 * 64 + 16 + i], i);             // K, block 2, token 1
    EXPECT_EQ(m[2 * 64 + 32 + 16 + i], 1000 + i);  // V
    EXPECT_EQ(m[0 + i], 32 + i);                  // K, block 0, token 0
    EXPECT_EQ(m[32 + i], 1032 + i);               // V
  }
  int untouched = 0;
  for (int i = 0; i < 3 * 64; ++i) untouched += m[i] == 0xffff;
  EXPECT_EQ(untouched, 3 * 64 - 64);  // exactly two tokens' K and V rows were written
  const int64_t bad[] = {6};
  absl::Status s = ref::WriteKv(k.data(), v.data(), 16, 16, bad, 1, c);
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_NE(s.message().find("slot_mapping[0] = 6"), absl::string_view::npos) << s;
}

// An MLA view has one latent row per token and no V half: a v there would overwrite the row
// (the kernel used to store V then K into it, the reference K then V). Both reject it, and a
// missing v where the view has a V half, through the same ValidateWriteKvArgs.
TEST(WriteKvRefTest, VMustMatchTheView) {
  AlignedHalves cache(2 * 2 * 16, 0xffff);
  const KvCacheView mla = MlaKvCache(cache.data(), 2, 2, 16, DType::kBF16);
  const KvCacheView kv = BlocksFirstKvCache(cache.data(), 2, 1, 1, 16, DType::kBF16);
  std::vector<uint16_t> k(16, 1), v(16, 2);
  const int64_t slots[] = {1};
  absl::Status s = ref::WriteKv(k.data(), v.data(), 16, 16, slots, 1, mla);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("WriteKv: v is given but the view has no V half"),
            absl::string_view::npos)
      << s;
  EXPECT_EQ(cache.data()[16], 0xffff);  // nothing written
  s = ref::WriteKvFp8(k.data(), v.data(), 16, 16, slots, 1, DType::kBF16, 1.0f, 1.0f,
                      MlaKvCache(cache.data(), 2, 2, 16, DType::kFP8));
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  s = ref::WriteKv(k.data(), nullptr, 16, 16, slots, 1, kv);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("v is null but the view has a V half (kv_stride 16)"),
            absl::string_view::npos)
      << s;
  EXPECT_TRUE(ref::WriteKv(k.data(), nullptr, 16, 16, slots, 1, mla).ok());
  EXPECT_EQ(cache.data()[16], 1);
  EXPECT_TRUE(ValidateWriteKvArgs(k.data(), v.data(), slots, 1, kv, "x").ok());
  s = ValidateWriteKvArgs(k.data(), v.data(), slots, -1, kv, "x");
  EXPECT_NE(s.message().find("x: num_tokens -1 < 0"), absl::string_view::npos) << s;
}

// A decode fixture with one KV head of dim 8 and block size 2, filled by hand.
class DecodeRefTest : public ::testing::Test {
 protected:
  DecodeRefTest() : cache_(4 * 32, 0) {
    view_ = BlocksFirstKvCache(cache_.data(), 4, 2, 1, 8, DType::kBF16);
  }
  // Sets K (all elements k) and V (all elements v) of logical token t stored in `block`.
  void SetToken(int32_t block, int32_t offset, float k, float v) {
    for (int i = 0; i < 8; ++i) {
      cache_.data()[block * 32 + offset * 8 + i] = FloatToBf16(k);
      cache_.data()[block * 32 + 16 + offset * 8 + i] = FloatToBf16(v);
    }
  }
  AlignedHalves cache_;
  KvCacheView view_;
};

TEST_F(DecodeRefTest, EqualScoresAverageV) {
  // Tokens 0..2 live in blocks 3 (tokens 0, 1) and 1 (token 2): a permuted table.
  SetToken(3, 0, 0.0f, 1.0f);
  SetToken(3, 1, 0.0f, 2.0f);
  SetToken(1, 0, 0.0f, 6.0f);
  const int32_t table[] = {3, 1};
  const int32_t lens[] = {3};
  std::vector<uint16_t> q(8, FloatToBf16(1.0f));
  double out[8], lse[1];
  const BlockTableView t{table, 2, lens, 1};
  ASSERT_TRUE(ref::PagedDecode(q.data(), 8, view_, t, {1, 1.0f, -1}, out, lse).ok());
  for (double o : out) EXPECT_DOUBLE_EQ(o, 3.0);
  EXPECT_DOUBLE_EQ(lse[0], std::log(3.0));
}

TEST_F(DecodeRefTest, SoftmaxWeightsAndGqa) {
  // q = 0.125 per element, k = 1 vs 0: scores 1 and 0 (scale 1).
  SetToken(0, 0, 0.0f, 1.0f);
  SetToken(0, 1, 1.0f, 2.0f);
  const int32_t table[] = {0};
  const int32_t lens[] = {2};
  std::vector<uint16_t> q(16, FloatToBf16(0.125f));  // two query heads, same KV head
  double out[16], lse[2];
  ASSERT_TRUE(
      ref::PagedDecode(q.data(), 16, view_, {table, 1, lens, 1}, {2, 1.0f, -1}, out, lse).ok());
  const double e = std::exp(1.0);
  for (double o : out) EXPECT_NEAR(o, (1.0 + 2.0 * e) / (1.0 + e), 1e-12);
  EXPECT_NEAR(lse[1], std::log(1.0 + e), 1e-12);
}

TEST_F(DecodeRefTest, WindowNeverReadsSkippedBlocks) {
  SetToken(2, 0, 0.0f, 4.0f);  // token 2
  SetToken(2, 1, 0.0f, 8.0f);  // token 3
  const int32_t table[] = {-1, 2};  // block 0 is out of the window: an invalid id would fail
  const int32_t lens[] = {4};
  std::vector<uint16_t> q(8, FloatToBf16(1.0f));
  double out[8];
  ASSERT_TRUE(
      ref::PagedDecode(q.data(), 8, view_, {table, 2, lens, 1}, {1, 1.0f, 1}, out, nullptr).ok());
  for (double o : out) EXPECT_DOUBLE_EQ(o, 6.0);
  absl::Status s =
      ref::PagedDecode(q.data(), 8, view_, {table, 2, lens, 1}, {1, 1.0f, 2}, out, nullptr);
  EXPECT_TRUE(absl::IsInvalidArgument(s));  // window 2 reaches token 1 in block -1
  EXPECT_NE(s.message().find("position 1 maps to block -1"), absl::string_view::npos) << s;
}

TEST_F(DecodeRefTest, EmptySequenceGivesZeroAndMinusInfinity) {
  const int32_t table[] = {-1};
  const int32_t lens[] = {0};
  std::vector<uint16_t> q(8, FloatToBf16(1.0f));
  double out[8], lse[1];
  ASSERT_TRUE(
      ref::PagedDecode(q.data(), 8, view_, {table, 1, lens, 1}, {1, 1.0f, -1}, out, lse).ok());
  for (double o : out) EXPECT_EQ(o, 0.0);
  EXPECT_EQ(lse[0], -kInf);
}

// A chunk of three queries at positions 1..3 after a cached token 0, in blocks 3 and 1:
// causal within the chunk (query at position p averages V of tokens 0..p), window applied.
TEST_F(DecodeRefTest, PrefillChunkIsCausalOverTheCachedPrefix) {
  SetToken(3, 0, 0.0f, 1.0f);
  SetToken(3, 1, 0.0f, 2.0f);
  SetToken(1, 0, 0.0f, 6.0f);
  SetToken(1, 1, 0.0f, 7.0f);
  const int32_t table[] = {3, 1};
  const int32_t lens[] = {4};
  const int32_t starts[] = {0, 3};
  std::vector<uint16_t> q(3 * 8, FloatToBf16(1.0f));
  double out[3 * 8], lse[3];
  ASSERT_TRUE(ref::PagedPrefill(q.data(), 8, starts, view_, {table, 2, lens, 1}, {1, 1.0f, -1},
                                out, lse)
                  .ok());
  EXPECT_DOUBLE_EQ(out[0], 1.5);             // tokens 0, 1
  EXPECT_DOUBLE_EQ(out[8], 3.0);             // tokens 0..2
  EXPECT_DOUBLE_EQ(out[16], 4.0);            // tokens 0..3
  EXPECT_DOUBLE_EQ(lse[2], std::log(4.0));
  ASSERT_TRUE(ref::PagedPrefill(q.data(), 8, starts, view_, {table, 2, lens, 1}, {1, 1.0f, 1},
                                out, nullptr)
                  .ok());
  EXPECT_DOUBLE_EQ(out[16], 6.5);            // window: tokens 2, 3
  const int32_t long_chunk[] = {0, 5};
  absl::Status s = ref::PagedPrefill(q.data(), 8, long_chunk, view_, {table, 2, lens, 1},
                                     {1, 1.0f, -1}, out, nullptr);
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_NE(s.message().find("sequence 0 has queries [0, 5) but 4 tokens"),
            absl::string_view::npos) << s;
}

TEST(MergeRefTest, WeightsByExpLse) {
  // Two splits with lse 0 and log 3: weights 1/4 and 3/4; a third empty split.
  const float o[] = {1, 1, 3, 3, 100, 100};
  const float lse[] = {0.0f, std::log(3.0f), -std::numeric_limits<float>::infinity()};
  double out[2], lse_out[1];
  ref::MergeAttnStates(o, lse, 1, 1, 3, 2, out, lse_out);
  EXPECT_NEAR(out[0], 2.5, 1e-7);
  EXPECT_NEAR(out[1], 2.5, 1e-7);
  EXPECT_NEAR(lse_out[0], std::log(4.0), 1e-7);
  const float empty_lse[] = {-std::numeric_limits<float>::infinity(),
                             -std::numeric_limits<float>::infinity(),
                             -std::numeric_limits<float>::infinity()};
  ref::MergeAttnStates(o, empty_lse, 1, 1, 3, 2, out, lse_out);
  EXPECT_EQ(out[0], 0.0);
  EXPECT_EQ(lse_out[0], -kInf);
}

// Invariant: attention over [0, L) equals the merge of attention over [0, c) and [c, L).
TEST(MergeRefTest, MergingSplitsEqualsWholeRange) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  const int32_t bs = 16, blocks = 8, heads = 2, d = 64, hq = 8, len = 100;
  AlignedHalves cache(static_cast<size_t>(blocks) * 2 * bs * heads * d);
  const size_t cache_elements = static_cast<size_t>(blocks) * 2 * bs * heads * d;
  for (size_t i = 0; i < cache_elements; ++i) cache.data()[i] = FloatToBf16(normal(rng));
  const KvCacheView c = BlocksFirstKvCache(cache.data(), blocks, bs, heads, d, DType::kBF16);
  std::vector<uint16_t> q(hq * d);
  for (auto& x : q) x = FloatToBf16(normal(rng));
  const int32_t table[] = {5, 2, 7, 0, 3, 1, 6, 4};
  const DecodeParams params{hq, 0.125f, -1};
  std::vector<double> whole(hq * d), whole_lse(hq);
  const int32_t full_len[] = {len};
  ASSERT_TRUE(ref::PagedDecode(q.data(), hq * d, c, {table, 8, full_len, 1}, params,
                               whole.data(), whole_lse.data())
                  .ok());
  for (int32_t cut : {1, 37, 64, 99}) {
    std::vector<double> o(2 * hq * d), lse(2 * hq);
    const int32_t prefix_len[] = {cut};
    ASSERT_TRUE(ref::PagedDecode(q.data(), hq * d, c, {table, 8, prefix_len, 1}, params,
                                 o.data(), lse.data())
                    .ok());
    DecodeParams suffix = params;
    suffix.window_left = len - 1 - cut;  // attends [cut, len)
    ASSERT_TRUE(ref::PagedDecode(q.data(), hq * d, c, {table, 8, full_len, 1}, suffix,
                                 o.data() + hq * d, lse.data() + hq)
                    .ok());
    // Rearrange into [1][hq][2 splits][d] for the merge.
    std::vector<float> po(2 * hq * d), plse(2 * hq);
    for (int h = 0; h < hq; ++h) {
      for (int s = 0; s < 2; ++s) {
        plse[h * 2 + s] = static_cast<float>(lse[s * hq + h]);
        for (int i = 0; i < d; ++i) {
          po[(h * 2 + s) * d + i] = static_cast<float>(o[(s * hq + h) * d + i]);
        }
      }
    }
    std::vector<double> merged(hq * d), merged_lse(hq);
    ref::MergeAttnStates(po.data(), plse.data(), 1, hq, 2, d, merged.data(), merged_lse.data());
    for (int i = 0; i < hq * d; ++i) ASSERT_NEAR(merged[i], whole[i], 1e-5) << cut << " " << i;
    for (int h = 0; h < hq; ++h) ASSERT_NEAR(merged_lse[h], whole_lse[h], 1e-5);
  }
}

TEST(CopySlotsRefTest, CopiesEveryTensorAndSkips) {
  alignas(16) static uint8_t a[4 * 32];
  alignas(16) static uint8_t b[4 * 48];
  for (int i = 0; i < 4 * 32; ++i) a[i] = static_cast<uint8_t>(i);
  for (int i = 0; i < 4 * 48; ++i) b[i] = static_cast<uint8_t>(200 - i);
  const SlotTensor tensors[] = {{a, 32, 32, 4}, {b, 48, 16, 4}};  // b copies 16 of 48 bytes
  const int32_t src[] = {0, -1, 1, 3};
  const int32_t dst[] = {2, 1, 1, -1};
  ASSERT_TRUE(ref::CopySlots(tensors, src, dst, 4).ok());
  for (int i = 0; i < 32; ++i) {
    EXPECT_EQ(a[64 + i], i);       // slot 2 <- slot 0
    EXPECT_EQ(a[32 + i], 32 + i);  // slot 1 untouched
  }
  for (int i = 0; i < 48; ++i) {
    const uint8_t expected = static_cast<uint8_t>(i < 16 ? 200 - i : 200 - (96 + i));
    EXPECT_EQ(b[96 + i], expected) << i;
  }
  ASSERT_TRUE(ref::ZeroSlots(tensors, dst, 4).ok());  // zeroes slots 2 and 1
  EXPECT_EQ(a[32], 0);
  EXPECT_EQ(a[95], 0);
  EXPECT_EQ(a[96], 96);
  EXPECT_EQ(b[48 + 15], 0);
  EXPECT_EQ(b[48 + 16], static_cast<uint8_t>(200 - 64));
}

TEST(CopySlotsRefTest, RejectsHazardsAndBadIds) {
  alignas(16) static uint8_t a[4 * 32];
  const SlotTensor tensors[] = {{a, 32, 32, 4}};
  const int32_t chain_src[] = {1, 2};
  const int32_t chain_dst[] = {2, 3};
  absl::Status s = ref::CopySlots(tensors, chain_src, chain_dst, 2);
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_NE(s.message().find("slot 2 is both"), absl::string_view::npos) << s;
  const int32_t dup_src[] = {0, 1};
  const int32_t dup_dst[] = {2, 2};
  s = ref::CopySlots(tensors, dup_src, dup_dst, 2);
  EXPECT_NE(s.message().find("repeats destination 2"), absl::string_view::npos) << s;
  const int32_t far[] = {4};
  const int32_t zero[] = {0};
  s = ref::CopySlots(tensors, zero, far, 1);
  EXPECT_NE(s.message().find("dst[0] = 4"), absl::string_view::npos) << s;
  const SlotTensor odd[] = {{a, 32, 24, 4}};
  s = ref::ZeroSlots(odd, zero, 1);
  EXPECT_NE(s.message().find("copy_bytes 24"), absl::string_view::npos) << s;
}

TEST(CopySlotsRefTest, KvBlockDescriptorCopiesKAndV) {
  AlignedHalves cache(3 * 64);
  for (int i = 0; i < 3 * 64; ++i) cache.data()[i] = static_cast<uint16_t>(i);
  const KvCacheView c = BlocksFirstKvCache(cache.data(), 3, 2, 2, 8, DType::kF16);
  SlotTensor t;
  ASSERT_TRUE(KvBlockSlotTensor(c, &t).ok());
  EXPECT_EQ(t.copy_bytes, 128);
  EXPECT_EQ(t.slot_stride_bytes, 128);
  const int32_t src[] = {2};
  const int32_t dst[] = {0};
  ASSERT_TRUE(ref::CopySlots({&t, 1}, src, dst, 1).ok());
  for (int i = 0; i < 64; ++i) EXPECT_EQ(cache.data()[i], 128 + i);
}

}  // namespace
}  // namespace kvpage
