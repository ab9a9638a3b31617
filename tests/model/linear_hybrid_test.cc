// Tests of the linear-attention hybrids read by src/model/linear_hybrid.h: AI21 Jamba
// (Mamba-1), MiniMax-M1 (lightning attention) and Kimi Linear (KDA + MLA). Which layers hold
// a state, its shape and bytes as vLLM 0.33's MambaStateShapeCalculator gives them
// (vllm/model_executor/layers/mamba/mamba_utils.py), the parameter counts, and the errors that
// name a malformed field. Inputs are the bundled configs (sim/data/models/README.md).
#include <cstdint>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/status/statusor.h"
#include "kvpage/catalog.h"
#include "kvpage/model_spec.h"
#include "kvpage/tensor_parallel.h"
#include "nlohmann/json.hpp"

namespace kvpage {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using json = nlohmann::json;

constexpr char kSource[] = "test://config.json";

ModelSpec Bundled(const char* name) {
  auto spec = LoadModel(name);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec : ModelSpec{};
}

std::vector<int32_t> LayersOfKind(const ModelSpec& spec, LayerKind kind) {
  std::vector<int32_t> out;
  for (int32_t i = 0; i < spec.num_layers(); ++i) {
    if (spec.layers[i].kind == kind) out.push_back(i);
  }
  return out;
}

const LinearStateShape& State(const ModelSpec& spec) {
  for (const LayerGroup& g : spec.groups) {
    if (g.spec.kind == LayerKind::kLinearAttention) return g.spec.linear;
  }
  static const LinearStateShape kNone;
  ADD_FAILURE() << "no linear-attention group";
  return kNone;
}

void ExpectInvalid(const json& cfg, const std::vector<std::string>& parts) {
  absl::StatusOr<ModelSpec> spec = ParseModelSpec(cfg.dump(), "test-model", kSource);
  ASSERT_FALSE(spec.ok()) << "parsed: " << cfg.dump();
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << spec.status();
  for (const std::string& part : parts) EXPECT_THAT(spec.status().message(), HasSubstr(part));
}

// AI21-Jamba-1.5-Mini: attn_layer_period 8, attn_layer_offset 4 → attention at 4, 12, 20, 28
// (i % 8 == 4), Mamba-1 in the other 28 layers.
TEST(LinearHybridTest, JambaPlacesAttentionEveryEighthLayer) {
  const ModelSpec spec = Bundled("jamba-1.5-mini");
  ASSERT_EQ(spec.num_layers(), 32);
  EXPECT_THAT(LayersOfKind(spec, LayerKind::kFullAttention), ElementsAre(4, 12, 20, 28));
  EXPECT_EQ(spec.NumLayersOfKind(LayerKind::kLinearAttention), 28);
  ASSERT_EQ(spec.groups.size(), 2u);
  // head_dim = hidden_size / heads = 4096 / 32 = 128 (vLLM jamba.py:209), 8 KV heads.
  EXPECT_EQ(spec.layers[4].attention, (AttentionShape{8, 128, 128}));
}

// vLLM's mamba1_state_shape (mamba_utils.py:171-183) with intermediate_size = mamba_expand ·
// hidden_size = 2 · 4096 = 8192 (jamba.py:478-482): conv (4 − 1) × 8192 = 24,576 values,
// SSM 8192 × 16 = 131,072 values, both bf16 (mamba1_state_dtype with "auto", :64-110):
// (24,576 + 131,072) × 2 = 311,296 bytes per layer.
TEST(LinearHybridTest, JambaStateIsVllmsMamba1Shape) {
  const ModelSpec spec = Bundled("jamba-1.5-mini");
  const LinearStateShape& s = State(spec);
  EXPECT_EQ(s, (LinearStateShape{4, 0, 16, 8192, 1, DType::kBF16, DType::kBF16}));
  EXPECT_EQ(s.ConvValues(), 24'576);
  EXPECT_EQ(s.RecurrentValues(), 131'072);
  EXPECT_EQ(s.NativeBytes(), 311'296);
}

// Jamba's state splits by d_inner across GPUs (mamba1_state_shape divides intermediate_size
// by the TP size): 8192 / 4 = 2048 channels, a quarter of each tensor.
TEST(LinearHybridTest, JambaStateShardsTheInnerWidth) {
  auto shard = ShardForTensorParallel(Bundled("jamba-1.5-mini"), 4);
  ASSERT_TRUE(shard.ok()) << shard.status();
  const LinearStateShape& s = State(*shard);
  EXPECT_EQ(s.num_v_heads, 2048);
  EXPECT_EQ(s.ConvValues(), 3 * 2048);
  EXPECT_EQ(s.RecurrentValues(), 2048 * 16);
}

// Per layer: norms 2·4096; Mamba-1 mixer: in_proj 4096·16384 + conv 8192·4 + bias 8192 +
// x_proj 8192·(256 + 32) + dt_proj 256·8192 + 8192 + A_log 8192·16 + D 8192 + out_proj
// 8192·4096 + dt/B/C norms 256 + 32 = 105,308,448; attention 2·4096·4096 + 2·4096·1024 =
// 41,943,040; MoE on odd layers: 16 experts · 3·4096·14336 + router 4096·16; dense MLP
// 3·4096·14336 on even layers. Embeddings untied 2·65536·4096. Total 51,570,323,328 (AI21:
// "52B total, 12B active"); routed 16 layers · 16 · 176,160,768 = 45,097,156,608; active
// = total − 14/16 of routed = 12,110,311,296.
TEST(LinearHybridTest, JambaParameterCount) {
  const ModelSpec spec = Bundled("jamba-1.5-mini");
  EXPECT_EQ(spec.num_params, 51'570'323'328);
  EXPECT_EQ(spec.routed_expert_params, 45'097'156'608);
  EXPECT_EQ(spec.num_embedding_params, 536'870'912);
  EXPECT_EQ(spec.NumActiveParams(), 12'110'311'296);
  EXPECT_EQ(spec.num_experts, 16);
  EXPECT_EQ(spec.experts_per_token, 2);
  EXPECT_EQ(spec.weight_bytes, 2 * 51'570'323'328);
}

// MiniMax-M1: attn_type_list has 1 (softmax) at every eighth layer: 7, 15, ..., 79.
TEST(LinearHybridTest, MiniMaxReadsAttnTypeList) {
  const ModelSpec spec = Bundled("minimax-m1");
  ASSERT_EQ(spec.num_layers(), 80);
  EXPECT_THAT(LayersOfKind(spec, LayerKind::kFullAttention),
              ElementsAre(7, 15, 23, 31, 39, 47, 55, 63, 71, 79));
  EXPECT_EQ(spec.NumLayersOfKind(LayerKind::kLinearAttention), 70);
  EXPECT_EQ(spec.layers[7].attention, (AttentionShape{8, 128, 128}));
}

// vLLM's linear_attention_state_shape(num_attention_heads 64, tp, head_dim 128)
// (mamba_utils.py:154-161, called from linear/base.py:63-66): one 64 × 128 × 128 state in
// the model dtype (linear_attention_state_dtype, :55-61) and no conv state: 1,048,576 bf16
// values = 2,097,152 bytes per layer.
TEST(LinearHybridTest, MiniMaxStateIsOneMatrixPerHead) {
  const LinearStateShape s = State(Bundled("minimax-m1"));
  EXPECT_EQ(s, (LinearStateShape{1, 64, 128, 64, 128, DType::kBF16, DType::kBF16}));
  EXPECT_EQ(s.ConvValues(), 0);
  EXPECT_EQ(s.RecurrentValues(), 1'048'576);
  EXPECT_EQ(s.NativeBytes(), 2'097'152);
}

// Per layer: norms 2·6144 and 32 experts · 3·6144·9216 + router 6144·32; lightning layers
// qkv 3 + gate 1 + out 1 projections of 6144·8192 plus the 8192 norm = 251,666,432 + 8,192;
// softmax layers 2·6144·8192 + 2·6144·1024. Embeddings untied 2·200064·6144 = 2,458,386,432.
// Total 456,089,655,296 (MiniMax: "456 billion"); active = total − 30/32 of the routed
// experts = 48,403,306,496, of which 45,944,920,064 are not embeddings ("45.9 billion").
TEST(LinearHybridTest, MiniMaxParameterCount) {
  const ModelSpec spec = Bundled("minimax-m1");
  EXPECT_EQ(spec.num_params, 456'089'655'296);
  EXPECT_EQ(spec.num_embedding_params, 2'458'386'432);
  EXPECT_EQ(spec.NumActiveParams(), 48'403'306'496);
}

// Kimi Linear: kda_layers are 1-based (vLLM's is_kda_layer tests layer_idx + 1,
// transformers_utils/configs/kimi_linear.py:157-161); the rest are MLA.
TEST(LinearHybridTest, KimiReadsKdaLayersOneBased) {
  const ModelSpec spec = Bundled("kimi-linear-48b-a3b-instruct");
  ASSERT_EQ(spec.num_layers(), 27);
  EXPECT_THAT(LayersOfKind(spec, LayerKind::kMla), ElementsAre(3, 7, 11, 15, 19, 23, 26));
  EXPECT_EQ(spec.NumLayersOfKind(LayerKind::kLinearAttention), 20);
  // The MLA latent: kv_lora_rank 512 + qk_rope_head_dim 64 = 576 values per token.
  EXPECT_EQ(spec.layers[3].attention, (AttentionShape{1, 576, 0}));
  // No max_position_embeddings in the file: vLLM's KimiLinearConfig default, 4096.
  EXPECT_EQ(spec.max_position_embeddings, 4096);
  EXPECT_EQ(spec.model_max_length, 1'048'576);
}

// vLLM's kda_state_shape(tp, num_heads 32, head_dim 128, conv_kernel_size 4)
// (mamba_utils.py:296-319): conv 3 × (32·128 + 2·32·128) = 36,864 bf16 values and a
// 32 × 128 × 128 = 524,288-value recurrent state in f32 (kda_state_dtype "auto", :133-149):
// 73,728 + 2,097,152 = 2,170,880 bytes per layer.
TEST(LinearHybridTest, KimiStateIsVllmsKdaShape) {
  const LinearStateShape s = State(Bundled("kimi-linear-48b-a3b-instruct"));
  EXPECT_EQ(s, (LinearStateShape{4, 32, 128, 32, 128, DType::kBF16, DType::kF32}));
  EXPECT_EQ(s.ConvValues(), 36'864);
  EXPECT_EQ(s.RecurrentValues(), 524'288);
  EXPECT_EQ(s.NativeBytes(), 2'170'880);
}

// The checkpoint's tensors count 49,122,681,728 parameters (the model report the bundled
// config was read from, sim/data/models/README.md): KDA layers 3·2304·4096 q/k/v, 3·4096·4
// convs, f and g gates 2·(2304·128 + 128·4096), b_proj 2304·32, A_log 32, dt_bias 4096,
// o_norm 128, o_proj 4096·2304; MLA q 2304·6144, kv_a 2304·576 + 512, kv_b 512·8192, o
// 4096·2304; layer 0 a dense 3·2304·9216 MLP, layers 1–26 256 experts of 3·2304·1024, a
// router, its bias and one shared expert; untied embeddings 2·163840·2304.
TEST(LinearHybridTest, KimiParameterCountMatchesTheCheckpoint) {
  const ModelSpec spec = Bundled("kimi-linear-48b-a3b-instruct");
  EXPECT_EQ(spec.num_params, 49'122'681'728);
  EXPECT_EQ(spec.routed_expert_params, 26 * 256 * int64_t{3 * 2304 * 1024});
  EXPECT_EQ(spec.num_experts, 256);
  EXPECT_EQ(spec.experts_per_token, 8);
}

json TinyJamba() {
  return {{"model_type", "jamba"},        {"num_hidden_layers", 4},  {"hidden_size", 64},
          {"num_attention_heads", 8},     {"num_key_value_heads", 1}, {"vocab_size", 1000},
          {"max_position_embeddings", 2048}, {"intermediate_size", 128},
          {"attn_layer_period", 4},       {"attn_layer_offset", 3},  {"mamba_d_state", 4},
          {"mamba_d_conv", 4},            {"mamba_expand", 1}};
}

TEST(LinearHybridTest, MalformedLayoutFieldsAreNamed) {
  json jamba = TinyJamba();
  jamba["attn_layer_offset"] = 4;
  ExpectInvalid(jamba, {"field 'attn_layer_offset'", "(4) must be below attn_layer_period (4)"});
  jamba = TinyJamba();
  jamba.erase("attn_layer_period");
  ExpectInvalid(jamba, {"field 'attn_layer_period' is missing", "model_type 'jamba'"});
  jamba = TinyJamba();
  jamba["mamba_d_state"] = 0;
  ExpectInvalid(jamba, {"field 'mamba_d_state'", "must be positive"});

  json minimax = TinyJamba();
  minimax.erase("attn_layer_period");
  minimax["model_type"] = "minimax_m1";
  minimax["attn_type_list"] = {0, 0, 2, 1};
  ExpectInvalid(minimax, {"field 'attn_type_list[2]'", "must be 0 (linear) or 1 (softmax)"});
  minimax["attn_type_list"] = {0, 1};
  ExpectInvalid(minimax, {"field 'attn_type_list'", "has 2 entries", "4"});

  json kimi = TinyJamba();
  kimi.erase("attn_layer_period");
  kimi["model_type"] = "kimi_linear";
  kimi["linear_attn_config"] = {{"kda_layers", {1, 2}}};
  ExpectInvalid(kimi, {"field 'linear_attn_config.num_heads' is missing"});
  kimi["linear_attn_config"] = {{"kda_layers", {1, 5}}, {"num_heads", 2}, {"head_dim", 8},
                                {"short_conv_kernel_size", 4}};
  ExpectInvalid(kimi, {"field 'linear_attn_config.kda_layers[1]'", "[1, 4]", "got 5"});
  kimi["linear_attn_config"]["kda_layers"] = {1, 2};
  kimi["linear_attn_config"]["full_attn_layers"] = {2, 3};
  ExpectInvalid(kimi, {"field 'linear_attn_config.full_attn_layers'", "names layer 2"});
  kimi["linear_attn_config"] = 3;
  ExpectInvalid(kimi, {"field 'linear_attn_config' must be an object"});
}

}  // namespace
}  // namespace kvpage
