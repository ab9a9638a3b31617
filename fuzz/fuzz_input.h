// What the operation-sequence harnesses share: a reader that turns the fuzzer's bytes into
// choices (zeros once the bytes run out, so every input is a complete run), and three tiny
// models, one per layer kind the block manager has a group manager for.
#ifndef KVPAGE_FUZZ_FUZZ_INPUT_H_
#define KVPAGE_FUZZ_FUZZ_INPUT_H_

#include <cstddef>
#include <cstdint>

#include "fuzz/fuzz_check.h"
#include "kvpage/model_spec.h"

namespace kvpage::fuzz {

class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  bool empty() const { return pos_ >= size_; }
  uint8_t Byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  uint16_t U16() { return static_cast<uint16_t>(Byte() | (Byte() << 8)); }
  // A value in [lo, hi] (inclusive) from one byte; hi − lo < 256.
  int32_t Range(int32_t lo, int32_t hi) { return lo + Byte() % (hi - lo + 1); }
  bool Flag() { return (Byte() & 1) != 0; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// One full-attention layer: 32 bytes per token (1 KV head × 8, bf16).
inline constexpr const char* kFuzzFull = R"({"num_hidden_layers": 1, "hidden_size": 64,
    "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 8, "vocab_size": 512,
    "max_position_embeddings": 4096, "intermediate_size": 128})";

// Layer 0 full attention, layers 1–2 sliding (window 32).
inline constexpr const char* kFuzzSwa = R"({"num_hidden_layers": 3, "hidden_size": 64,
    "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 8, "vocab_size": 512,
    "max_position_embeddings": 4096, "intermediate_size": 128, "sliding_window": 32,
    "layer_types": ["full_attention", "sliding_attention", "sliding_attention"]})";

// Layers 0–2 Gated DeltaNet, layer 3 full attention (Qwen3.5 in miniature).
inline constexpr const char* kFuzzGdn = R"({"num_hidden_layers": 4, "hidden_size": 64,
    "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 8, "vocab_size": 512,
    "max_position_embeddings": 4096, "intermediate_size": 128, "torch_dtype": "bfloat16",
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    "linear_conv_kernel_dim": 4, "linear_num_key_heads": 2, "linear_key_head_dim": 8,
    "linear_num_value_heads": 2, "linear_value_head_dim": 8, "mamba_ssm_dtype": "float32"})";

// Model `which` % 3: full attention, sliding window, linear attention.
inline ModelSpec FuzzModel(int which) {
  const char* json = which % 3 == 0 ? kFuzzFull : which % 3 == 1 ? kFuzzSwa : kFuzzGdn;
  auto spec = ParseModelSpec(json, "fuzz-tiny", "fuzz/fuzz_input.h");
  KVPAGE_FUZZ_CHECK(spec.ok());
  return *spec;
}

// An absl::Status that must hold: aborts with its message otherwise.
#define KVPAGE_FUZZ_CHECK_OK(expr)                                        \
  do {                                                                    \
    const absl::Status fuzz_status_ = (expr);                             \
    if (!fuzz_status_.ok()) {                                             \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr,  \
                   fuzz_status_.ToString().c_str());                      \
      std::abort();                                                       \
    }                                                                     \
  } while (false)

}  // namespace kvpage::fuzz

#endif  // KVPAGE_FUZZ_FUZZ_INPUT_H_
