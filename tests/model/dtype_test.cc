// Tests of kvpage/dtype.h: dtype spellings and the bytes a row of values costs.
#include "kvpage/dtype.h"

#include <cstdint>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/status/status.h"

namespace kvpage {
namespace {

using ::testing::HasSubstr;

constexpr DType kAllDTypes[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kFP8,
                                DType::kQ8_0};

// Expects `text` to parse as `want`.
void ExpectParses(const std::string& text, DType want) {
  absl::StatusOr<DType> got = ParseDType(text);
  ASSERT_TRUE(got.ok()) << text << ": " << got.status();
  EXPECT_EQ(*got, want) << text << " parsed as " << DTypeName(*got);
}

TEST(ParseDTypeTest, AcceptsF32Spellings) {
  for (const char* text : {"f32", "float32", "fp32", "float"}) ExpectParses(text, DType::kF32);
}

TEST(ParseDTypeTest, AcceptsF16Spellings) {
  for (const char* text : {"f16", "float16", "fp16", "half"}) ExpectParses(text, DType::kF16);
}

TEST(ParseDTypeTest, AcceptsBF16Spellings) {
  for (const char* text : {"bf16", "bfloat16"}) ExpectParses(text, DType::kBF16);
}

TEST(ParseDTypeTest, AcceptsFp8Spellings) {
  for (const char* text : {"fp8", "fp8_e4m3", "fp8_e5m2", "float8_e4m3fn"}) {
    ExpectParses(text, DType::kFP8);
  }
}

TEST(ParseDTypeTest, AcceptsQ8_0) { ExpectParses("q8_0", DType::kQ8_0); }

TEST(ParseDTypeTest, IsCaseInsensitive) {
  ExpectParses("BFloat16", DType::kBF16);
  ExpectParses("F32", DType::kF32);
  ExpectParses("HALF", DType::kF16);
  ExpectParses("FP8_E4M3", DType::kFP8);
  ExpectParses("Q8_0", DType::kQ8_0);
}

TEST(ParseDTypeTest, UnknownNamesAreInvalidArgumentNamingTheText) {
  for (const char* text : {"int4", "float64", "q4_0", "bf 16", "f16 ", ""}) {
    absl::StatusOr<DType> got = ParseDType(text);
    ASSERT_FALSE(got.ok()) << "'" << text << "' parsed as " << DTypeName(*got);
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(got.status().message(), HasSubstr(std::string("'") + text + "'"));
  }
}

TEST(DTypeNameTest, CanonicalNames) {
  EXPECT_EQ(DTypeName(DType::kF32), "f32");
  EXPECT_EQ(DTypeName(DType::kF16), "f16");
  EXPECT_EQ(DTypeName(DType::kBF16), "bf16");
  EXPECT_EQ(DTypeName(DType::kFP8), "fp8");
  EXPECT_EQ(DTypeName(DType::kQ8_0), "q8_0");
}

TEST(DTypeNameTest, RoundTripsThroughParseDType) {
  for (DType dtype : kAllDTypes) ExpectParses(std::string(DTypeName(dtype)), dtype);
}

TEST(BytesPerValueTest, ByteAlignedTypesAndQ8_0) {
  EXPECT_EQ(BytesPerValue(DType::kF32), 4);
  EXPECT_EQ(BytesPerValue(DType::kF16), 2);
  EXPECT_EQ(BytesPerValue(DType::kBF16), 2);
  EXPECT_EQ(BytesPerValue(DType::kFP8), 1);
  EXPECT_EQ(BytesPerValue(DType::kQ8_0), 0);  // no whole number: RowBytes is the only way
}

// Expects RowBytes(dtype, n) to succeed with exactly `want` bytes.
void ExpectRowBytes(DType dtype, int64_t n, int64_t want) {
  absl::StatusOr<int64_t> got = RowBytes(dtype, n);
  ASSERT_TRUE(got.ok()) << DTypeName(dtype) << " x " << n << ": " << got.status();
  EXPECT_EQ(*got, want) << DTypeName(dtype) << " x " << n;
}

TEST(RowBytesTest, ByteAlignedTypes) {
  ExpectRowBytes(DType::kF32, 1024, 4096);
  ExpectRowBytes(DType::kF16, 1024, 2048);
  ExpectRowBytes(DType::kBF16, 1024, 2048);
  ExpectRowBytes(DType::kFP8, 1024, 1024);
  ExpectRowBytes(DType::kF16, 1, 2);
  ExpectRowBytes(DType::kF32, 576, 2304);
}

TEST(RowBytesTest, Q8_0PacksThirtyTwoValuesIntoThirtyFourBytes) {
  ExpectRowBytes(DType::kQ8_0, 32, 34);
  ExpectRowBytes(DType::kQ8_0, 576, 612);    // 18 blocks: a DeepSeek MLA latent row
  ExpectRowBytes(DType::kQ8_0, 1024, 1088);  // 32 blocks: 8 kv heads x 128
}

TEST(RowBytesTest, ZeroValuesCostZeroBytes) {
  for (DType dtype : kAllDTypes) ExpectRowBytes(dtype, 0, 0);
}

TEST(RowBytesTest, Q8_0RowNotAMultipleOf32IsInvalidArgumentNamingTheLength) {
  absl::StatusOr<int64_t> got = RowBytes(DType::kQ8_0, 100);
  ASSERT_FALSE(got.ok()) << "got " << *got;
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(got.status().message(), HasSubstr("100"));
  EXPECT_THAT(got.status().message(), HasSubstr("32"));
}

TEST(RowBytesTest, NegativeLengthIsInvalidArgumentForEveryType) {
  for (DType dtype : kAllDTypes) {
    absl::StatusOr<int64_t> got = RowBytes(dtype, -1);
    ASSERT_FALSE(got.ok()) << DTypeName(dtype) << " got " << *got;
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(got.status().message(), HasSubstr("-1"));
  }
}

}  // namespace
}  // namespace kvpage
