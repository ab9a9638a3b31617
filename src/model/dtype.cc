#include "kvpage/dtype.h"

#include <string>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace kvpage {

absl::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "f32";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
    case DType::kFP8: return "fp8";
    case DType::kQ8_0: return "q8_0";
  }
  return "unknown";
}

absl::StatusOr<DType> ParseDType(absl::string_view text) {
  const std::string t = absl::AsciiStrToLower(text);
  if (t == "f32" || t == "fp32" || t == "float32" || t == "float") return DType::kF32;
  if (t == "f16" || t == "fp16" || t == "float16" || t == "half") return DType::kF16;
  if (t == "bf16" || t == "bfloat16") return DType::kBF16;
  if (t == "fp8" || t == "fp8_e4m3" || t == "fp8_e5m2" || t == "float8_e4m3fn") return DType::kFP8;
  if (t == "q8_0") return DType::kQ8_0;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown dtype '", text, "' (expected f32, f16, bf16, fp8 or q8_0)"));
}

int64_t BytesPerValue(DType dtype) {
  switch (dtype) {
    case DType::kF32: return 4;
    case DType::kF16:
    case DType::kBF16: return 2;
    case DType::kFP8: return 1;
    case DType::kQ8_0: return 0;
  }
  return 0;
}

absl::StatusOr<int64_t> RowBytes(DType dtype, int64_t num_values) {
  if (num_values < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("row length must be >= 0, got ", num_values));
  }
  if (dtype == DType::kQ8_0) {
    // ggml's block_q8_0: a f16 scale and 32 int8 quants.
    constexpr int64_t kBlockValues = 32;
    constexpr int64_t kBlockBytes = 34;
    if (num_values % kBlockValues != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "q8_0 needs rows that are a multiple of 32 values, got ", num_values));
    }
    return num_values / kBlockValues * kBlockBytes;
  }
  return num_values * BytesPerValue(dtype);
}

}  // namespace kvpage
