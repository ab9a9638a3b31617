// Small models and helpers for block-manager tests. The tiny models' vocabulary (2^20) is
// larger than any token id the tests use; tests of the vocab_size check lower it.
#ifndef KVPAGE_TESTS_BLOCK_MANAGER_TEST_UTIL_H_
#define KVPAGE_TESTS_BLOCK_MANAGER_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "kvpage/kv_cache_manager.h"
#include "kvpage/model_spec.h"

namespace kvpage::testing {

// One full-attention layer, 1 KV head × 8, bf16: 32 bytes per token, 512 bytes per 16-token block.
inline constexpr const char* kTinyFull = R"({"num_hidden_layers": 1, "hidden_size": 64,
    "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 8, "vocab_size": 1048576,
    "max_position_embeddings": 4096, "intermediate_size": 128})";

// Layer 0 full attention, layers 1–2 sliding (window 32): the vLLM H1 model shape.
inline constexpr const char* kTinyHybridSwa = R"({"num_hidden_layers": 3, "hidden_size": 64,
    "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 8, "vocab_size": 1048576,
    "max_position_embeddings": 4096, "intermediate_size": 128, "sliding_window": 32,
    "layer_types": ["full_attention", "sliding_attention", "sliding_attention"]})";

// Llama 4 in miniature: layers 0–2 apply RoPE and so attend within chunks of 32 tokens (two
// 16-token blocks), layer 3 is a NoPE layer with full attention.
inline constexpr const char* kTinyChunked = R"({"num_hidden_layers": 4, "hidden_size": 64,
    "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 8, "vocab_size": 1048576,
    "max_position_embeddings": 4096, "intermediate_size": 128, "attention_chunk_size": 32,
    "no_rope_layers": [1, 1, 1, 0]})";

// Layers 0–2 Gated DeltaNet, layer 3 full attention (Qwen3.5 in miniature). State per linear
// layer: conv 3 × (2·2·8 + 2·8) = 144 bf16 values, recurrent 2·8·8 = 128 f32 values.
inline constexpr const char* kTinyGdn = R"({"num_hidden_layers": 4, "hidden_size": 64,
    "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 8, "vocab_size": 1048576,
    "max_position_embeddings": 4096, "intermediate_size": 128, "torch_dtype": "bfloat16",
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    "linear_conv_kernel_dim": 4, "linear_num_key_heads": 2, "linear_key_head_dim": 8,
    "linear_num_value_heads": 2, "linear_value_head_dim": 8, "mamba_ssm_dtype": "float32"})";

// Nemotron-H in miniature: blocks M, -, M, * (Mamba-2, MLP only, Mamba-2, attention). The MLP
// block holds no cache, so the model has 3 cache layers. State per Mamba layer: conv
// 3 × (2·8 + 2·1·8) = 96 bf16 values, SSM 2·8·8 = 128 f32 values: 704 bytes.
inline constexpr const char* kTinyNemotronH = R"({"model_type": "nemotron_h",
    "hybrid_override_pattern": "M-M*", "num_hidden_layers": 4, "hidden_size": 64,
    "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 8, "vocab_size": 1048576,
    "max_position_embeddings": 4096, "intermediate_size": 128, "torch_dtype": "bfloat16",
    "mamba_num_heads": 2, "mamba_head_dim": 8, "ssm_state_size": 8, "n_groups": 1,
    "conv_kernel": 4})";

// DeepSeek-V3.2 in miniature: 2 MLA layers (latent kv_lora_rank 24 + rope 8 = 32 bf16 values,
// 64 bytes a token) each with a lightning-indexer key of 128 values (128 fp8 + one fp32 scale,
// 132 bytes a token): one 16-token block is 2 × 16 × (64 + 132) = 6,272 bytes.
inline constexpr const char* kTinyDsa = R"({"model_type": "deepseek_v32",
    "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 8,
    "num_key_value_heads": 8, "vocab_size": 1048576, "max_position_embeddings": 4096,
    "intermediate_size": 128, "torch_dtype": "bfloat16", "kv_lora_rank": 24,
    "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 8, "q_lora_rank": 16,
    "index_head_dim": 128, "index_n_heads": 2, "index_topk": 32})";
// Jamba in miniature: Mamba-1 in layers 0–2, attention in layer 3 (attn_layer_period 4,
// offset 3). State per Mamba layer (d_inner = mamba_expand · hidden = 64): conv 3 × 64 = 192
// and SSM 64 × 4 = 256 bf16 values: 896 bytes.
inline constexpr const char* kTinyJamba = R"({"model_type": "jamba", "num_hidden_layers": 4,
    "hidden_size": 64, "num_attention_heads": 8, "num_key_value_heads": 1, "vocab_size": 1048576,
    "max_position_embeddings": 4096, "intermediate_size": 128, "torch_dtype": "bfloat16",
    "attn_layer_period": 4, "attn_layer_offset": 3, "mamba_d_state": 4, "mamba_d_conv": 4,
    "mamba_expand": 1})";

// MiniMax-M1 in miniature: lightning attention in layers 0–2, softmax in layer 3. State per
// lightning layer: 8 heads × 8 × 8 = 512 bf16 values (1,024 bytes) and no conv state.
inline constexpr const char* kTinyMiniMax = R"({"model_type": "minimax_m1",
    "num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 8,
    "num_key_value_heads": 1, "head_dim": 8, "vocab_size": 1048576,
    "max_position_embeddings": 4096, "intermediate_size": 128, "torch_dtype": "bfloat16",
    "attn_type_list": [0, 0, 0, 1], "num_local_experts": 2, "num_experts_per_tok": 1})";

// Kimi Linear in miniature: KDA in layers 0–2 (kda_layers are 1-based), MLA in layer 3
// (latent 16 + 8 = 24 values per token). State per KDA layer: conv 3 × (3 · 2 · 8) = 144
// bf16 values and 2 × 8 × 8 = 128 f32 values: 800 bytes.
inline constexpr const char* kTinyKimi = R"({"model_type": "kimi_linear",
    "num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 8,
    "num_key_value_heads": 8, "vocab_size": 1048576, "max_position_embeddings": 4096,
    "intermediate_size": 128, "torch_dtype": "bfloat16", "kv_lora_rank": 16,
    "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 8,
    "linear_attn_config": {"kda_layers": [1, 2, 3], "full_attn_layers": [4], "num_heads": 2,
    "head_dim": 8, "short_conv_kernel_size": 4}})";

inline ModelSpec TinyModel(const char* json) {
  auto spec = ParseModelSpec(json, "tiny", "tiny.json");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

inline std::vector<int32_t> Tokens(int64_t n, int32_t first = 0) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

inline std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

inline std::vector<int32_t> Ids(absl::Span<const BlockId> blocks) {
  std::vector<int32_t> ids;
  for (BlockId b : blocks) ids.push_back(b.value);
  return ids;
}

// The live request with this id, or a handle that names none (every call then says NotFound).
inline RequestHandle H(const KvCacheManager& m, int64_t id) {
  return m.Find(RequestId(id)).value_or(RequestHandle());
}
inline RequestHandle H(const KvCacheManager& m, RequestId id) { return H(m, id.value); }

// Runs CheckInvariants and fails the test with its message.
#define KVPAGE_EXPECT_INVARIANTS(manager)                 \
  do {                                                    \
    absl::Status s_ = (manager).CheckInvariants();        \
    EXPECT_TRUE(s_.ok()) << s_;                           \
  } while (false)

}  // namespace kvpage::testing

#endif  // KVPAGE_TESTS_BLOCK_MANAGER_TEST_UTIL_H_
