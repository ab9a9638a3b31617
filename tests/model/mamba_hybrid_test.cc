// Tests of Mamba-2 hybrid configs (Nemotron-H, Granite 4.0-H): which layers hold a cache, the
// per-request state each Mamba layer holds, and the parameter count.
//
// Nemotron-H-8B and Granite 4.0-H below are published values as several public sources quote
// them (test inputs, not bundled models); NVIDIA-Nemotron-3-Nano-30B-A3B is the bundled config.
#include <cstdint>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvpage/catalog.h"
#include "kvpage/model_spec.h"
#include "nlohmann/json.hpp"

namespace kvpage {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using json = nlohmann::json;

constexpr char kSource[] = "test://config.json";

// Nemotron-H-8B-Base-8K: 52 blocks, 24 'M', 4 '*' (layers 7, 18, 29, 40), 24 '-'.
json NemotronH8B() {
  return {{"model_type", "nemotron_h"},
          {"hybrid_override_pattern", "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"},
          {"num_hidden_layers", 52},
          {"hidden_size", 4096},
          {"intermediate_size", 21504},
          {"num_attention_heads", 32},
          {"num_key_value_heads", 8},
          {"attention_head_dim", 128},
          {"mamba_num_heads", 128},
          {"mamba_head_dim", 64},
          {"ssm_state_size", 128},
          {"n_groups", 8},
          {"conv_kernel", 4},
          {"expand", 2},
          {"use_conv_bias", true},
          {"tie_word_embeddings", false},
          {"vocab_size", 131072},
          {"max_position_embeddings", 8192},
          {"torch_dtype", "bfloat16"}};
}

// Granite-4.0-H-Tiny: 40 layers, attention at 5, 15, 25, 35; MoE (64 experts, 6 per token)
// plus a shared MLP in every layer.
json GraniteTiny() {
  std::vector<std::string> types(40, "mamba");
  for (int i : {5, 15, 25, 35}) types[i] = "attention";
  return {{"model_type", "granitemoehybrid"},
          {"layer_types", types},
          {"num_hidden_layers", 40},
          {"hidden_size", 1536},
          {"num_attention_heads", 12},
          {"num_key_value_heads", 4},
          {"intermediate_size", 512},
          {"shared_intermediate_size", 1024},
          {"num_local_experts", 64},
          {"num_experts_per_tok", 6},
          {"mamba_n_heads", 48},
          {"mamba_d_head", 64},
          {"mamba_d_state", 128},
          {"mamba_n_groups", 1},
          {"mamba_d_conv", 4},
          {"mamba_expand", 2},
          {"tie_word_embeddings", true},
          {"vocab_size", 100352},
          {"max_position_embeddings", 131072},
          {"torch_dtype", "bfloat16"}};
}

ModelSpec Parse(const json& cfg) {
  auto spec = ParseModelSpec(cfg.dump(), "test", kSource);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec : ModelSpec{};
}

void ExpectInvalid(const json& cfg, const std::vector<std::string>& parts) {
  auto spec = ParseModelSpec(cfg.dump(), "test", kSource);
  ASSERT_TRUE(absl::IsInvalidArgument(spec.status())) << spec.status();
  for (const std::string& p : parts) EXPECT_THAT(spec.status().message(), HasSubstr(p));
}

int64_t StateBytesPerRequest(const ModelSpec& spec) {
  int64_t bytes = 0;
  for (const LayerSpec& l : spec.layers) {
    if (l.kind == LayerKind::kLinearAttention) bytes += l.linear.NativeBytes();
  }
  return bytes;
}

TEST(MambaHybridTest, NemotronHKeepsMambaAndAttentionLayersOnly) {
  const ModelSpec spec = Parse(NemotronH8B());
  // The 24 MLP-only blocks hold no cache: 24 Mamba + 4 attention layers remain.
  EXPECT_EQ(spec.num_layers(), 28);
  EXPECT_EQ(spec.NumLayersOfKind(LayerKind::kLinearAttention), 24);
  EXPECT_EQ(spec.NumLayersOfKind(LayerKind::kFullAttention), 4);
  ASSERT_EQ(spec.groups.size(), 2u);
  // Cache layer 4 is decoder block 7, the first '*'.
  EXPECT_EQ(spec.layers[4].kind, LayerKind::kFullAttention);
  EXPECT_THAT(spec.groups[1].layers, ElementsAre(4, 10, 16, 22));
  EXPECT_EQ(spec.groups[1].spec.attention, (AttentionShape{8, 128, 128}));
}

TEST(MambaHybridTest, NemotronHStateMatchesVllmMamba2Shapes) {
  const ModelSpec spec = Parse(NemotronH8B());
  const LinearStateShape& s = spec.groups[0].spec.linear;
  EXPECT_EQ(s, (LinearStateShape{4, 8, 128, 128, 64, DType::kBF16, DType::kF32}));
  // conv (kernel−1) × (heads·head_dim + 2·groups·state) = 3 × (8192 + 2048) = 30,720 bf16.
  EXPECT_EQ(s.ConvValues(), 30720);
  // SSM heads × head_dim × state = 128 × 64 × 128 = 1,048,576, f32: vLLM's default
  // mamba_ssm_cache_dtype for Nemotron-H when the config names none.
  EXPECT_EQ(s.RecurrentValues(), 1048576);
  // 61,440 + 4,194,304 = 4,255,744 bytes per layer; × 24 layers per request.
  EXPECT_EQ(s.NativeBytes(), 4255744);
  EXPECT_EQ(StateBytesPerRequest(spec), 102137856);
}

TEST(MambaHybridTest, NemotronHSsmCacheDtypeFromTheConfig) {
  json cfg = NemotronH8B();
  cfg["mamba_ssm_cache_dtype"] = "bfloat16";
  const ModelSpec spec = Parse(cfg);
  // 61,440 + 1,048,576 × 2 = 2,158,592 bytes per layer.
  EXPECT_EQ(spec.groups[0].spec.linear.NativeBytes(), 2158592);
}

TEST(MambaHybridTest, NemotronHParameterCount) {
  const ModelSpec spec = Parse(NemotronH8B());
  // Embeddings + LM head 2 × 131,072 × 4,096 = 1,073,741,824; final norm 4,096; one norm per
  // block 52 × 4,096; 24 Mamba mixers of 109,635,968 (in_proj 4096 × 18,560, conv 10,240 × 5,
  // A/D/dt_bias 384, norm 8,192, out_proj 8,192 × 4,096); 4 attention layers of 41,943,040;
  // 24 ReLU² MLPs of 2 × 4,096 × 21,504 = 176,160,768. Total 8,100,852,736 ("8B").
  EXPECT_EQ(spec.num_params, 8100852736);
  EXPECT_EQ(spec.num_embedding_params, 1073741824);
  EXPECT_EQ(spec.weight_bytes, 2 * 8100852736);
  EXPECT_EQ(spec.num_experts, 0);
}

TEST(MambaHybridTest, GraniteLayerTypesAndState) {
  const ModelSpec spec = Parse(GraniteTiny());
  EXPECT_EQ(spec.num_layers(), 40);
  EXPECT_EQ(spec.NumLayersOfKind(LayerKind::kLinearAttention), 36);
  ASSERT_EQ(spec.groups.size(), 2u);
  EXPECT_THAT(spec.groups[1].layers, ElementsAre(5, 15, 25, 35));
  // head_dim = 1536 / 12 = 128.
  EXPECT_EQ(spec.groups[1].spec.attention, (AttentionShape{4, 128, 128}));
  const LinearStateShape& s = spec.groups[0].spec.linear;
  // Granite keeps the SSM state in the model dtype (vLLM's mamba2_state_dtype, "auto").
  EXPECT_EQ(s, (LinearStateShape{4, 1, 128, 48, 64, DType::kBF16, DType::kBF16}));
  // conv 3 × (48·64 + 2·1·128) = 9,984 values; SSM 48 × 64 × 128 = 393,216 values; both bf16:
  // 806,400 bytes per layer, × 36 = 29,030,400 per request.
  EXPECT_EQ(s.NativeBytes(), 806400);
  EXPECT_EQ(StateBytesPerRequest(spec), 29030400);
}

TEST(MambaHybridTest, GraniteParameterCountWithExperts) {
  const ModelSpec spec = Parse(GraniteTiny());
  // Tied embeddings 100,352 × 1,536 = 154,140,672; final norm 1,536; 2 norms × 40 layers;
  // 36 mixers of 14,642,576; 4 attention layers of 6,291,456; per layer a shared SwiGLU
  // 3 × 1536 × 1024 and 64 experts of 3 × 1536 × 512 plus a 1536 × 64 router. Total
  // 6,939,037,248 ("7B"); routed 40 × 150,994,944 = 6,039,797,760; active 1,465,470,528 ("1B").
  EXPECT_EQ(spec.num_params, 6939037248);
  EXPECT_EQ(spec.routed_expert_params, 6039797760);
  EXPECT_EQ(spec.num_experts, 64);
  EXPECT_EQ(spec.experts_per_token, 6);
  EXPECT_EQ(spec.NumActiveParams(), 1465470528);
}

TEST(MambaHybridTest, GraniteWithoutMambaLayersIsPlainAttention) {
  // Granite 4.0 Micro: a granitemoehybrid config whose layer_types are all attention.
  json cfg = GraniteTiny();
  cfg["layer_types"] = std::vector<std::string>(40, "attention");
  cfg.erase("num_local_experts");
  const ModelSpec spec = Parse(cfg);
  EXPECT_EQ(spec.NumLayersOfKind(LayerKind::kFullAttention), 40);
  EXPECT_EQ(spec.groups.size(), 1u);
}

TEST(MambaHybridErrorsTest, PatternOfTheWrongLength) {
  json cfg = NemotronH8B();
  cfg["num_hidden_layers"] = 50;
  ExpectInvalid(cfg, {"hybrid_override_pattern", "52 letters", "50"});
}

TEST(MambaHybridErrorsTest, UnknownBlockLetter) {
  json cfg = NemotronH8B();
  cfg["hybrid_override_pattern"] = "MXM*";
  cfg["num_hidden_layers"] = 4;
  ExpectInvalid(cfg, {"hybrid_override_pattern", "'X' at layer 1", "'E' MoE"});
}

TEST(MambaHybridErrorsTest, MoeBlockWithoutExperts) {
  json cfg = NemotronH8B();
  cfg["hybrid_override_pattern"] = "MEM*";
  cfg["num_hidden_layers"] = 4;
  ExpectInvalid(cfg, {"n_routed_experts"});
}

// Falcon-H1-0.5B (tiiuae/Falcon-H1-0.5B-Base, as quoted by Megatron-Bridge's conversion test):
// 36 layers, each running attention and a Mamba-2 mixer side by side.
json FalconH1() {
  return {{"model_type", "falcon_h1"}, {"num_hidden_layers", 36}, {"hidden_size", 1024},
          {"intermediate_size", 2048}, {"num_attention_heads", 8}, {"num_key_value_heads", 2},
          {"head_dim", 64}, {"vocab_size", 32784}, {"max_position_embeddings", 16384},
          {"mamba_d_ssm", 1536}, {"mamba_n_heads", 24}, {"mamba_d_head", 64},
          {"mamba_n_groups", 1}, {"mamba_d_state", 128}, {"mamba_d_conv", 4},
          {"mamba_expand", 2}, {"mamba_conv_bias", true}, {"mamba_rms_norm", false},
          {"tie_word_embeddings", false}, {"torch_dtype", "bfloat16"}};
}

TEST(MambaHybridTest, FalconH1LayersHoldAttentionAndMambaState) {
  const ModelSpec spec = Parse(FalconH1());
  EXPECT_EQ(spec.num_layers(), 72);
  EXPECT_EQ(spec.NumLayersOfKind(LayerKind::kLinearAttention), 36);
  EXPECT_EQ(spec.NumLayersOfKind(LayerKind::kFullAttention), 36);
  // Mamba state in the model dtype (bf16): conv 3 × (1,536 + 2·1·128) = 5,376 values, SSM
  // 24 × 64 × 128 = 196,608 values: 403,968 bytes per layer.
  const LinearStateShape& s = spec.groups[0].spec.linear;
  EXPECT_EQ(s, (LinearStateShape{4, 1, 128, 24, 64, DType::kBF16, DType::kBF16}));
  EXPECT_EQ(s.NativeBytes(), 403968);
  EXPECT_EQ(StateBytesPerRequest(spec), 36 * 403968);
}

TEST(MambaHybridTest, FalconH1ParameterCount) {
  // Embeddings + LM head 2 × 32,784 × 1,024 = 67,141,632; final norm 1,024.
  // Per layer: two norms 2,048; Mamba in_proj 1,024 × (2·1,536 + 256 + 24) = 3,432,448, conv
  // 1,792 × 5 = 8,960, A, D, dt_bias 72, no gated norm (mamba_rms_norm false), out_proj
  // 1,536 × 1,024 = 1,572,864; attention q, o 2 × 1,024 × 512 + k, v 2 × 1,024 × 128 =
  // 1,310,720; SwiGLU 3 × 1,024 × 2,048 = 6,291,456: 12,618,568 × 36 = 454,268,448.
  // Total 521,411,104: TII publishes 0.52B.
  EXPECT_EQ(Parse(FalconH1()).num_params, 521411104);
  json cfg = FalconH1();
  cfg["mamba_rms_norm"] = true;  // + the gated norm's 1,536 weights per layer
  EXPECT_EQ(Parse(cfg).num_params, 521411104 + 36 * 1536);
  cfg["mamba_d_head"] = "auto";  // mamba_d_ssm / mamba_n_heads = 64
  EXPECT_EQ(Parse(cfg).num_params, 521411104 + 36 * 1536);
}

TEST(MambaHybridErrorsTest, FalconH1WidthMustMatchTheHeads) {
  json cfg = FalconH1();
  cfg["mamba_d_ssm"] = 2048;
  ExpectInvalid(cfg, {"mamba_d_ssm", "(2048) differs from mamba_n_heads × mamba_d_head = 1536"});
  cfg["mamba_d_head"] = "auto";
  cfg["mamba_d_ssm"] = 1000;
  ExpectInvalid(cfg, {"mamba_d_head", "is auto but mamba_d_ssm 1000"});
}

// The bundled NVIDIA-Nemotron-3-Nano-30B-A3B: 52 blocks, 23 'M', 23 'E' (MoE), 6 '*'.
TEST(MambaHybridTest, NemotronNanoMoeLayersAndState) {
  absl::StatusOr<ModelSpec> spec = LoadModel("nemotron-3-nano-30b-a3b");
  ASSERT_TRUE(spec.ok()) << spec.status();
  // The MoE blocks hold no cache: 23 Mamba + 6 attention layers remain.
  EXPECT_EQ(spec->num_layers(), 29);
  EXPECT_EQ(spec->NumLayersOfKind(LayerKind::kLinearAttention), 23);
  EXPECT_EQ(spec->NumLayersOfKind(LayerKind::kFullAttention), 6);
  ASSERT_EQ(spec->groups.size(), 2u);
  EXPECT_EQ(spec->groups[1].spec.attention, (AttentionShape{2, 128, 128}));
  // conv 3 × (64·64 + 2·8·128) = 18,432 bf16 = 36,864 bytes; SSM 64 × 64 × 128 = 524,288
  // f32 (mamba_ssm_cache_dtype) = 2,097,152 bytes; 2,134,016 × 23 layers.
  EXPECT_EQ(spec->groups[0].spec.linear.NativeBytes(), 2134016);
  EXPECT_EQ(StateBytesPerRequest(*spec), 49082368);
}

TEST(MambaHybridTest, NemotronNanoParameterCount) {
  absl::StatusOr<ModelSpec> spec = LoadModel("nemotron-3-nano-30b-a3b");
  ASSERT_TRUE(spec.ok()) << spec.status();
  // hidden h = 2,688. Embeddings + LM head 2 × 131,072 × h = 704,643,072; final norm h; one
  // norm per block 52h = 139,776.
  // Mamba mixer: in_proj h × (2·4,096 + 2,048 + 64) = 27,697,152; conv 6,144 × 5 = 30,720;
  //   A, D, dt_bias 192; gated norm 4,096; out_proj 4,096 × h = 11,010,048: 38,742,208 × 23.
  // Attention: q and o 2 × h × 4,096 = 22,020,096; k and v 2 × h × 256 = 1,376,256:
  //   23,396,352 × 6.
  // MoE: routed 128 × 2 × h × 1,856 = 1,277,165,568; router h × 128 + 128 bias = 344,192;
  //   one shared expert 2 × h × 3,712 = 19,955,712: 1,297,465,472 × 23.
  // Total 31,577,940,288 (NVIDIA publishes 31.6B), of which 29,374,808,064 routed.
  EXPECT_EQ(spec->num_params, 31577940288);
  EXPECT_EQ(spec->routed_expert_params, 29374808064);
  EXPECT_EQ(spec->num_experts, 128);
  EXPECT_EQ(spec->experts_per_token, 6);
  EXPECT_EQ(spec->weight_bytes, 2 * int64_t{31577940288});
}

TEST(MambaHybridErrorsTest, PatternOfMlpBlocksOnly) {
  json cfg = NemotronH8B();
  cfg["hybrid_override_pattern"] = "--";
  cfg["num_hidden_layers"] = 2;
  ExpectInvalid(cfg, {"hybrid_override_pattern", "no Mamba or attention"});
}

TEST(MambaHybridErrorsTest, MissingMambaHeadDim) {
  json cfg = NemotronH8B();
  cfg.erase("mamba_head_dim");
  ExpectInvalid(cfg, {"mamba_head_dim", "missing"});
}

TEST(MambaHybridErrorsTest, UnknownSsmCacheDtype) {
  json cfg = NemotronH8B();
  cfg["mamba_ssm_cache_dtype"] = "float7";
  ExpectInvalid(cfg, {"mamba_ssm_cache_dtype", "float7"});
}

TEST(MambaHybridErrorsTest, GraniteExpandDisagreesWithHeads) {
  json cfg = GraniteTiny();
  cfg["mamba_expand"] = 3;
  ExpectInvalid(cfg, {"mamba_expand", "4608", "3072"});
}

TEST(MambaHybridErrorsTest, GraniteUnknownLayerType) {
  json cfg = GraniteTiny();
  cfg["layer_types"][3] = "mlp";
  ExpectInvalid(cfg, {"layer_types[3]", "mlp"});
}

TEST(MambaHybridErrorsTest, ImplausibleShapesAreRejected) {
  json cfg = NemotronH8B();
  cfg["mamba_num_heads"] = 2000000000;
  cfg["mamba_head_dim"] = 2000000000;
  ExpectInvalid(cfg, {"implausible"});
}

}  // namespace
}  // namespace kvpage
