// Element types of KV cache pages and recurrent state, and what they cost in bytes.
//
// A KV cache row is the K (or V) vector of one token in one layer: num_kv_heads × head_dim
// values. Most types cost a whole number of bytes per value; q8_0 (llama.cpp) packs 32 values
// with one f16 scale into 34 bytes, so a row's size is only defined when its length is a
// multiple of 32. `RowBytes` is therefore the one place that converts values to bytes.
#ifndef KVPAGE_DTYPE_H_
#define KVPAGE_DTYPE_H_

#include <cstdint>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace kvpage {

enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kFP8,   // e4m3 / e5m2: one byte per value.
  kQ8_0,  // llama.cpp block_q8_0: 32 int8 values + one f16 scale = 34 bytes.
};

// Canonical short name: "f32", "f16", "bf16", "fp8", "q8_0".
absl::string_view DTypeName(DType dtype);

// Accepts the canonical names and the spellings used by Hugging Face configs and vLLM
// ("float32", "float16", "half", "bfloat16", "fp8_e4m3", "fp8_e5m2", …). Returns
// InvalidArgument naming `text` for anything else.
absl::StatusOr<DType> ParseDType(absl::string_view text);

// Bytes taken by `num_values` consecutive values of one row.
// Returns InvalidArgument if num_values < 0, or for q8_0 if num_values % 32 != 0.
absl::StatusOr<int64_t> RowBytes(DType dtype, int64_t num_values);

// Bytes per value for the byte-aligned types (f32 4, f16/bf16 2, fp8 1); q8_0 has no whole
// number and returns 0 — use RowBytes for it.
int64_t BytesPerValue(DType dtype);

}  // namespace kvpage

#endif  // KVPAGE_DTYPE_H_
