// Tests of kvpage/model_spec.h: reading layer kinds, shapes and groups from config.json text.
//
// Configs are built as nlohmann::json objects from a few base shapes and tweaked per test, so
// each test shows only the fields it is about.
#include "kvpage/model_spec.h"

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "kvpage/catalog.h"
#include "nlohmann/json.hpp"

namespace kvpage {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using json = nlohmann::json;

constexpr char kSource[] = "test://config.json";

// A 4-layer Llama-style model: GQA (8 query heads, 2 kv heads), no head_dim key (512/8 = 64),
// no dtype key (bf16 by default).
json LlamaConfig() {
  return {{"model_type", "llama"},
          {"num_hidden_layers", 4},
          {"hidden_size", 512},
          {"num_attention_heads", 8},
          {"num_key_value_heads", 2},
          {"intermediate_size", 1024},
          {"vocab_size", 1000},
          {"max_position_embeddings", 2048}};
}

// gpt-oss style: explicit layer_types, full layers 0 and 3, sliding window 128.
json SlidingConfig() {
  json cfg = LlamaConfig();
  cfg["num_hidden_layers"] = 6;
  cfg["head_dim"] = 64;
  cfg["sliding_window"] = 128;
  cfg["layer_types"] = {"full_attention",    "sliding_attention", "sliding_attention",
                        "full_attention",    "sliding_attention", "sliding_attention"};
  return cfg;
}

// Gemma 3 style: the language model nested under text_config, torch_dtype at the top level,
// every 6th layer global. torch_dtype is f16 (not the bf16 default) so a test can tell the
// top-level field was read.
json GemmaConfig() {
  json text = {{"model_type", "gemma3_text"},
               {"num_hidden_layers", 34},
               {"hidden_size", 2560},
               {"num_attention_heads", 8},
               {"num_key_value_heads", 4},
               {"head_dim", 256},
               {"intermediate_size", 10240},
               {"vocab_size", 262208},
               {"max_position_embeddings", 131072},
               {"sliding_window", 1024},
               {"sliding_window_pattern", 6}};
  return {{"model_type", "gemma3"}, {"torch_dtype", "float16"}, {"text_config", text}};
}

// Qwen3.5-9B's linear-attention shape (Gated DeltaNet) in an 8-layer model with every 4th
// layer full attention (Qwen3-Next's full_attention_interval).
json LinearConfig() {
  json cfg = LlamaConfig();
  cfg["model_type"] = "qwen3_next";
  cfg["num_hidden_layers"] = 8;
  cfg["head_dim"] = 256;
  cfg["full_attention_interval"] = 4;
  cfg["linear_conv_kernel_dim"] = 4;
  cfg["linear_num_key_heads"] = 16;
  cfg["linear_key_head_dim"] = 128;
  cfg["linear_num_value_heads"] = 32;
  cfg["linear_value_head_dim"] = 128;
  cfg["dtype"] = "bfloat16";
  cfg["mamba_ssm_dtype"] = "float32";
  return cfg;
}

// DeepSeek-V2 style MLA: kv_lora_rank 512 + qk_rope_head_dim 64.
json MlaConfig() {
  json cfg = LlamaConfig();
  cfg["model_type"] = "deepseek_v2";
  cfg["num_key_value_heads"] = 8;
  cfg["kv_lora_rank"] = 512;
  cfg["qk_rope_head_dim"] = 64;
  cfg["qk_nope_head_dim"] = 128;
  cfg["v_head_dim"] = 128;
  cfg["q_lora_rank"] = nullptr;
  return cfg;
}

absl::StatusOr<ModelSpec> Parse(const json& cfg) {
  return ParseModelSpec(cfg.dump(), "test-model", kSource);
}

// Parses `cfg`, failing the test (and returning an empty spec) when it does not parse.
ModelSpec MustParse(const json& cfg) {
  absl::StatusOr<ModelSpec> spec = Parse(cfg);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *std::move(spec) : ModelSpec{};
}

// Expects InvalidArgument whose message contains kSource and every one of `parts`.
void ExpectInvalid(const std::string& text, const std::vector<std::string>& parts) {
  absl::StatusOr<ModelSpec> spec = ParseModelSpec(text, "test-model", kSource);
  ASSERT_FALSE(spec.ok()) << "parsed: " << text;
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << spec.status();
  EXPECT_THAT(spec.status().message(), HasSubstr(kSource));
  for (const std::string& part : parts) EXPECT_THAT(spec.status().message(), HasSubstr(part));
}
void ExpectInvalid(const json& cfg, const std::vector<std::string>& parts) {
  ExpectInvalid(cfg.dump(), parts);
}

std::vector<int32_t> LayersOfKind(const ModelSpec& spec, LayerKind kind) {
  std::vector<int32_t> out;
  for (int32_t i = 0; i < spec.num_layers(); ++i) {
    if (spec.layers[i].kind == kind) out.push_back(i);
  }
  return out;
}

// ---- Well-formed configs ----------------------------------------------------------------

TEST(ParseModelSpecTest, LlamaStyleIsAllFullAttentionWithDerivedHeadDim) {
  const ModelSpec spec = MustParse(LlamaConfig());
  EXPECT_EQ(spec.name, "test-model");
  EXPECT_EQ(spec.source, kSource);
  EXPECT_EQ(spec.model_type, "llama");
  EXPECT_EQ(spec.dtype, DType::kBF16);
  EXPECT_EQ(spec.hidden_size, 512);
  EXPECT_EQ(spec.vocab_size, 1000);
  EXPECT_EQ(spec.max_position_embeddings, 2048);
  ASSERT_EQ(spec.num_layers(), 4);
  ASSERT_EQ(spec.groups.size(), 1u);
  const LayerGroup& g = spec.groups[0];
  EXPECT_EQ(g.spec.kind, LayerKind::kFullAttention);
  EXPECT_EQ(g.spec.attention, (AttentionShape{2, 64, 64}));
  EXPECT_EQ(g.spec.sliding_window, 0);
  EXPECT_THAT(g.layers, ElementsAre(0, 1, 2, 3));
  EXPECT_EQ(spec.NumLayersOfKind(LayerKind::kFullAttention), 4);
  EXPECT_FALSE(spec.HasKind(LayerKind::kSlidingWindow));
}

TEST(ParseModelSpecTest, ExplicitHeadDimWins) {
  json cfg = LlamaConfig();
  cfg["head_dim"] = 128;  // Qwen3 style: head_dim != hidden_size / num_attention_heads
  const ModelSpec spec = MustParse(cfg);
  ASSERT_EQ(spec.groups.size(), 1u);
  EXPECT_EQ(spec.groups[0].spec.attention, (AttentionShape{2, 128, 128}));
}

TEST(ParseModelSpecTest, MissingKvHeadsMeansMultiHeadAttention) {
  json cfg = LlamaConfig();
  cfg.erase("num_key_value_heads");
  const ModelSpec spec = MustParse(cfg);
  ASSERT_EQ(spec.groups.size(), 1u);
  EXPECT_EQ(spec.groups[0].spec.attention, (AttentionShape{8, 64, 64}));
}

TEST(ParseModelSpecTest, CountsParametersOfTheLlamaShape) {
  // Untied (LlamaConfig's default): embeddings and LM head 2 x 1000 x 512 + final norm 512
  // = 1,024,512.
  // Per layer: norms 2 x 512 + q 512x512 + k,v 2 x 512x128 + o 512x512 + MLP 3 x 512x1024
  //          = 1,024 + 655,360 + 1,572,864 = 2,229,248; x 4 layers = 8,916,992.
  EXPECT_EQ(MustParse(LlamaConfig()).num_params, 9'941'504);
  json tied = LlamaConfig();
  tied["tie_word_embeddings"] = true;  // the LM head reuses the 1000 x 512 embeddings
  EXPECT_EQ(MustParse(tied).num_params, 9'941'504 - 512'000);
  // A family without its own default ties them, as PretrainedConfig does.
  json other = LlamaConfig();
  other["model_type"] = "olmo";
  EXPECT_EQ(MustParse(other).num_params, 9'941'504 - 512'000);
}

TEST(ParseModelSpecTest, ReadsTorchDtype) {
  json cfg = LlamaConfig();
  cfg["torch_dtype"] = "float32";
  EXPECT_EQ(MustParse(cfg).dtype, DType::kF32);
  cfg["torch_dtype"] = "float16";
  EXPECT_EQ(MustParse(cfg).dtype, DType::kF16);
}

TEST(ParseModelSpecTest, LayerTypesGiveSlidingAndFullGroupsOrderedByFirstLayer) {
  const ModelSpec spec = MustParse(SlidingConfig());
  ASSERT_EQ(spec.num_layers(), 6);
  ASSERT_EQ(spec.groups.size(), 2u);
  const LayerGroup& full = spec.groups[0];  // layer 0 is full, so its group comes first
  EXPECT_EQ(full.spec.kind, LayerKind::kFullAttention);
  EXPECT_EQ(full.spec.attention, (AttentionShape{2, 64, 64}));
  EXPECT_EQ(full.spec.sliding_window, 0);
  EXPECT_THAT(full.layers, ElementsAre(0, 3));
  const LayerGroup& sliding = spec.groups[1];
  EXPECT_EQ(sliding.spec.kind, LayerKind::kSlidingWindow);
  EXPECT_EQ(sliding.spec.attention, (AttentionShape{2, 64, 64}));
  EXPECT_EQ(sliding.spec.sliding_window, 128);
  EXPECT_THAT(sliding.layers, ElementsAre(1, 2, 4, 5));
  EXPECT_EQ(spec.layers[4].sliding_window, 128);
  EXPECT_EQ(spec.layers[3].sliding_window, 0);
}

TEST(ParseModelSpecTest, SlidingGroupFirstWhenLayerZeroSlides) {
  json cfg = SlidingConfig();
  cfg["layer_types"] = {"sliding_attention", "full_attention", "sliding_attention",
                        "full_attention",    "sliding_window", "attention"};  // aliases too
  const ModelSpec spec = MustParse(cfg);
  ASSERT_EQ(spec.groups.size(), 2u);
  EXPECT_EQ(spec.groups[0].spec.kind, LayerKind::kSlidingWindow);
  EXPECT_THAT(spec.groups[0].layers, ElementsAre(0, 2, 4));
  EXPECT_EQ(spec.groups[1].spec.kind, LayerKind::kFullAttention);
  EXPECT_THAT(spec.groups[1].layers, ElementsAre(1, 3, 5));
}

TEST(ParseModelSpecTest, GemmaSlidingWindowPatternUnderTextConfig) {
  const ModelSpec spec = MustParse(GemmaConfig());
  EXPECT_EQ(spec.model_type, "gemma3_text");  // text_config's, not the wrapper's
  EXPECT_EQ(spec.dtype, DType::kF16);         // torch_dtype from the top level
  EXPECT_EQ(spec.hidden_size, 2560);
  ASSERT_EQ(spec.num_layers(), 34);
  EXPECT_THAT(LayersOfKind(spec, LayerKind::kFullAttention), ElementsAre(5, 11, 17, 23, 29));
  EXPECT_EQ(spec.NumLayersOfKind(LayerKind::kSlidingWindow), 29);
  ASSERT_EQ(spec.groups.size(), 2u);
  EXPECT_EQ(spec.groups[0].spec.kind, LayerKind::kSlidingWindow);
  EXPECT_EQ(spec.groups[0].spec.sliding_window, 1024);
  EXPECT_EQ(spec.groups[0].spec.attention, (AttentionShape{4, 256, 256}));
  EXPECT_EQ(spec.groups[0].num_layers(), 29);
  EXPECT_EQ(spec.groups[1].spec.kind, LayerKind::kFullAttention);
  EXPECT_EQ(spec.groups[1].spec.attention, (AttentionShape{4, 256, 256}));
  EXPECT_THAT(spec.groups[1].layers, ElementsAre(5, 11, 17, 23, 29));
}

// Llama 4 Scout's shape (text_config nested under a multimodal wrapper), 8 layers: the RoPE
// layers attend within chunks of attention_chunk_size tokens, the NoPE layers globally.
json Llama4Config() {
  json text = {{"model_type", "llama4_text"}, {"num_hidden_layers", 8}, {"hidden_size", 5120},
               {"num_attention_heads", 40}, {"num_key_value_heads", 8}, {"head_dim", 128},
               {"intermediate_size", 8192}, {"intermediate_size_mlp", 16384},
               {"vocab_size", 202048}, {"max_position_embeddings", 10485760},
               {"num_local_experts", 16}, {"num_experts_per_tok", 1},
               {"interleave_moe_layer_step", 1}, {"attention_chunk_size", 8192},
               {"tie_word_embeddings", false}, {"no_rope_layers", {1, 1, 1, 0, 1, 1, 1, 0}}};
  return {{"model_type", "llama4"}, {"torch_dtype", "bfloat16"}, {"text_config", text}};
}

TEST(ParseModelSpecTest, Llama4RopeLayersAreChunkedLocalNopeLayersFull) {
  const ModelSpec spec = MustParse(Llama4Config());
  EXPECT_EQ(spec.model_type, "llama4_text");
  EXPECT_THAT(LayersOfKind(spec, LayerKind::kChunkedLocal), ElementsAre(0, 1, 2, 4, 5, 6));
  EXPECT_THAT(LayersOfKind(spec, LayerKind::kFullAttention), ElementsAre(3, 7));
  ASSERT_EQ(spec.groups.size(), 2u);
  EXPECT_EQ(spec.groups[0].spec.kind, LayerKind::kChunkedLocal);
  EXPECT_EQ(spec.groups[0].spec.attention_chunk_size, 8192);
  EXPECT_EQ(spec.groups[0].spec.attention, (AttentionShape{8, 128, 128}));
  EXPECT_EQ(spec.groups[1].spec.kind, LayerKind::kFullAttention);
  EXPECT_EQ(spec.groups[1].spec.attention_chunk_size, 0);
  EXPECT_EQ(LayerKindName(LayerKind::kChunkedLocal), "chunked_local");
}

// At Scout's 48 layers the count lands on Meta's published "109B total, 17B active" (the
// vision encoder, not counted here, holds under 1B).
TEST(ParseModelSpecTest, Llama4ScoutCountsItsExperts) {
  json cfg = Llama4Config();
  cfg["text_config"]["num_hidden_layers"] = 48;
  cfg["text_config"]["no_rope_layers"] = json::array();
  const ModelSpec spec = MustParse(cfg);
  EXPECT_EQ(spec.NumLayersOfKind(LayerKind::kFullAttention), 12);
  EXPECT_EQ(spec.num_experts, 16);
  EXPECT_EQ(spec.experts_per_token, 1);
  EXPECT_GT(spec.num_params, 107'000'000'000);
  EXPECT_LT(spec.num_params, 109'000'000'000);
  EXPECT_GT(spec.NumActiveParams(), 17'000'000'000);
  EXPECT_LT(spec.NumActiveParams(), 17'500'000'000);
}

// The bundled Llama-4-Scout-17B-16E-Instruct has no no_rope_layers list: every 4th of its 48
// layers is global (NoPE), the other 36 attend within 8,192-token chunks, and it counts as the
// 48-layer test shape above.
TEST(ParseModelSpecTest, BundledLlama4ScoutIsChunkedLocalWithTwelveGlobalLayers) {
  absl::StatusOr<ModelSpec> bundled = LoadModel("llama-4-scout-17b-16e-instruct");
  ASSERT_TRUE(bundled.ok()) << bundled.status();
  EXPECT_EQ(bundled->NumLayersOfKind(LayerKind::kChunkedLocal), 36);
  EXPECT_EQ(bundled->NumLayersOfKind(LayerKind::kFullAttention), 12);
  EXPECT_EQ(bundled->groups[0].spec.attention_chunk_size, 8192);
  json cfg = Llama4Config();
  cfg["text_config"]["num_hidden_layers"] = 48;
  cfg["text_config"]["no_rope_layers"] = json::array();
  EXPECT_EQ(bundled->num_params, MustParse(cfg).num_params);
}

// Architectures whose cache kvpage cannot size are refused by the field that announces them,
// never planned as if every layer were full attention. Shapes: published configs of each.
// (Jamba, MiniMax and Kimi Linear are read now: linear_hybrid_test.cc names their bad fields.)
TEST(ParseModelSpecTest, UnreadLayoutsAreRefusedNamingTheField) {
  json v4 = LlamaConfig();  // DeepSeek-V4: compressed and sliding caches per layer
  v4["compress_ratios"] = {0, 0, 4, 128};
  v4["index_topk"] = 512;
  ExpectInvalid(v4, {"field 'compress_ratios'", "DeepSeek-V4"});
  json glm52 = MlaConfig();  // GLM-5.2: an indexer key cache in only some layers
  glm52["index_head_dim"] = 128;
  glm52["index_n_heads"] = 32;
  glm52["index_topk"] = 2048;
  glm52["index_topk_freq"] = 4;
  ExpectInvalid(glm52, {"field 'index_topk_freq'", "GLM-5.2"});
  json rwkv = LlamaConfig();  // no marker field: the model_type alone
  rwkv["model_type"] = "rwkv7";
  ExpectInvalid(rwkv, {"field 'model_type'", "'rwkv7'", "not supported yet"});
}

// DeepSeek-V3.2 (sim/data/models/deepseek-v3.2.json): 61 MLA layers whose latent is
// kv_lora_rank 512 + qk_rope_head_dim 64 = 576 values, each with the lightning indexer's key of
// index_head_dim 128 values beside it; 64 indexer heads pick index_topk 2,048 tokens.
TEST(ParseModelSpecTest, DeepSeekV32ReadsTheIndexerBesideTheLatent) {
  auto spec = LoadModel("deepseek-v3.2");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->model_type, "deepseek_v32");
  ASSERT_EQ(spec->num_layers(), 61);
  ASSERT_EQ(spec->groups.size(), 1u);
  EXPECT_EQ(spec->groups[0].spec.kind, LayerKind::kMla);
  EXPECT_EQ(spec->groups[0].spec.attention,
            (AttentionShape{.num_kv_heads = 1, .head_dim_k = 576, .head_dim_v = 0,
                            .index_head_dim = 128}));
  EXPECT_EQ(spec->index_n_heads, 64);
  EXPECT_EQ(spec->index_topk, 2048);
  // DeepSeek-V3 has no indexer: the same MLA shape with index_head_dim 0.
  auto v3 = LoadModel("deepseek-v3");
  ASSERT_TRUE(v3.ok()) << v3.status();
  EXPECT_FALSE(v3->groups[0].spec.attention.HasIndexer());
  EXPECT_EQ(v3->index_topk, 0);
}

TEST(ParseModelSpecTest, IndexerFieldsAreAllOrNoneAndOnlyBesideMla) {
  json cfg = MlaConfig();
  cfg["index_head_dim"] = 128;
  cfg["index_n_heads"] = 64;
  cfg["index_topk"] = 2048;
  EXPECT_EQ(MustParse(cfg).layers[0].attention.index_head_dim, 128);
  json missing = cfg;
  missing.erase("index_n_heads");
  ExpectInvalid(missing, {"field 'index_n_heads'"});
  json zero = cfg;
  zero["index_head_dim"] = 0;
  ExpectInvalid(zero, {"field 'index_head_dim'"});
  json text = cfg;
  text["index_topk"] = "2048";
  ExpectInvalid(text, {"field 'index_topk'"});
  json no_mla = LlamaConfig();  // an indexer needs the MLA latent it indexes
  no_mla["index_topk"] = 2048;
  ExpectInvalid(no_mla, {"field 'index_topk'", "kv_lora_rank"});
}

TEST(ParseModelSpecTest, Llama4WithoutNoRopeLayersUsesTheInterval) {
  json cfg = Llama4Config();
  cfg["text_config"]["no_rope_layers"] = json::array();  // empty: derived, as transformers does
  EXPECT_THAT(LayersOfKind(MustParse(cfg), LayerKind::kFullAttention), ElementsAre(3, 7));
  cfg["text_config"]["no_rope_layer_interval"] = 2;
  EXPECT_THAT(LayersOfKind(MustParse(cfg), LayerKind::kFullAttention), ElementsAre(1, 3, 5, 7));
  cfg["text_config"]["attention_chunk_size"] = nullptr;  // no chunking: every layer full
  EXPECT_EQ(MustParse(cfg).NumLayersOfKind(LayerKind::kFullAttention), 8);
}

TEST(ParseModelSpecTest, Llama4BadChunkFieldsAreNamed) {
  json cfg = Llama4Config();
  cfg["text_config"]["attention_chunk_size"] = 0;
  ExpectInvalid(cfg, {"attention_chunk_size"});
  cfg = Llama4Config();
  cfg["text_config"]["no_rope_layers"] = {1, 0};
  ExpectInvalid(cfg, {"no_rope_layers", "has 2 entries", "8"});
  cfg["text_config"]["no_rope_layers"] = {1, 1, 1, 2, 1, 1, 1, 0};
  ExpectInvalid(cfg, {"no_rope_layers[3]", "must be 0 or 1, got 2"});
  cfg["text_config"]["no_rope_layers"] = "all";
  ExpectInvalid(cfg, {"no_rope_layers", "must be an array"});
}

TEST(ParseModelSpecTest, SlidingWindowPatternWithoutWindowIsAllFull) {
  json cfg = GemmaConfig();
  cfg["text_config"].erase("sliding_window");
  const ModelSpec spec = MustParse(cfg);
  ASSERT_EQ(spec.groups.size(), 1u);
  EXPECT_EQ(spec.groups[0].spec.kind, LayerKind::kFullAttention);
  EXPECT_EQ(spec.groups[0].num_layers(), 34);
}

TEST(ParseModelSpecTest, UseSlidingWindowFalseIgnoresTheWindow) {
  json cfg = LlamaConfig();
  cfg["sliding_window"] = 4096;
  cfg["use_sliding_window"] = false;
  cfg["max_window_layers"] = 2;
  const ModelSpec spec = MustParse(cfg);
  ASSERT_EQ(spec.groups.size(), 1u);
  EXPECT_EQ(spec.groups[0].spec.kind, LayerKind::kFullAttention);
  EXPECT_EQ(spec.groups[0].spec.sliding_window, 0);
  EXPECT_THAT(spec.groups[0].layers, ElementsAre(0, 1, 2, 3));
}

TEST(ParseModelSpecTest, NullSlidingWindowIsAllFull) {
  json cfg = LlamaConfig();
  cfg["sliding_window"] = nullptr;  // Mistral-7B-v0.3
  const ModelSpec spec = MustParse(cfg);
  ASSERT_EQ(spec.groups.size(), 1u);
  EXPECT_EQ(spec.groups[0].spec.kind, LayerKind::kFullAttention);
}

TEST(ParseModelSpecTest, SlidingWindowAloneMakesEveryLayerSlide) {
  json cfg = LlamaConfig();
  cfg["sliding_window"] = 4096;  // Mistral-7B-v0.1
  const ModelSpec spec = MustParse(cfg);
  ASSERT_EQ(spec.groups.size(), 1u);
  EXPECT_EQ(spec.groups[0].spec.kind, LayerKind::kSlidingWindow);
  EXPECT_EQ(spec.groups[0].spec.sliding_window, 4096);
  EXPECT_THAT(spec.groups[0].layers, ElementsAre(0, 1, 2, 3));
}

TEST(ParseModelSpecTest, MaxWindowLayersSlidesFromThatLayerOn) {
  json cfg = LlamaConfig();
  cfg["sliding_window"] = 4096;  // Qwen2 style: layers >= max_window_layers slide
  cfg["use_sliding_window"] = true;
  cfg["max_window_layers"] = 2;
  const ModelSpec spec = MustParse(cfg);
  EXPECT_THAT(LayersOfKind(spec, LayerKind::kFullAttention), ElementsAre(0, 1));
  EXPECT_THAT(LayersOfKind(spec, LayerKind::kSlidingWindow), ElementsAre(2, 3));
}

TEST(ParseModelSpecTest, FullAttentionIntervalGivesLinearAndFull) {
  const ModelSpec spec = MustParse(LinearConfig());
  ASSERT_EQ(spec.num_layers(), 8);
  ASSERT_EQ(spec.groups.size(), 2u);
  EXPECT_EQ(spec.groups[0].spec.kind, LayerKind::kLinearAttention);
  EXPECT_THAT(spec.groups[0].layers, ElementsAre(0, 1, 2, 4, 5, 6));
  EXPECT_FALSE(spec.groups[0].spec.IsAttention());
  EXPECT_EQ(spec.groups[1].spec.kind, LayerKind::kFullAttention);
  EXPECT_THAT(spec.groups[1].layers, ElementsAre(3, 7));
  EXPECT_EQ(spec.groups[1].spec.attention, (AttentionShape{2, 256, 256}));
}

TEST(ParseModelSpecTest, LinearStateShapeOfQwen35_9B) {
  const ModelSpec spec = MustParse(LinearConfig());
  ASSERT_FALSE(spec.groups.empty());
  const LinearStateShape& s = spec.groups[0].spec.linear;
  EXPECT_EQ(s.conv_kernel, 4);
  EXPECT_EQ(s.num_k_heads, 16);
  EXPECT_EQ(s.k_head_dim, 128);
  EXPECT_EQ(s.num_v_heads, 32);
  EXPECT_EQ(s.v_head_dim, 128);
  EXPECT_EQ(s.conv_dtype, DType::kBF16);       // the model dtype ("dtype": "bfloat16")
  EXPECT_EQ(s.recurrent_dtype, DType::kF32);   // mamba_ssm_dtype
  // (4 − 1) × (2·16·128 + 32·128) = 3 × 8192.
  EXPECT_EQ(s.ConvValues(), 24'576);
  // 32 × 128 × 128.
  EXPECT_EQ(s.RecurrentValues(), 524'288);
  // 24,576 × 2 B (bf16) + 524,288 × 4 B (f32) = 49,152 + 2,097,152.
  EXPECT_EQ(s.NativeBytes(), 2'146'304);
}

TEST(ParseModelSpecTest, LinearDtypesFollowTheModelWithoutMambaSsmDtype) {
  json cfg = LinearConfig();
  cfg.erase("mamba_ssm_dtype");
  cfg.erase("dtype");
  cfg["torch_dtype"] = "float16";
  const ModelSpec spec = MustParse(cfg);
  ASSERT_FALSE(spec.groups.empty());
  const LinearStateShape& s = spec.groups[0].spec.linear;
  EXPECT_EQ(s.conv_dtype, DType::kF16);
  EXPECT_EQ(s.recurrent_dtype, DType::kF16);
  EXPECT_EQ(s.NativeBytes(), (24'576 + 524'288) * 2);
}

TEST(ParseModelSpecTest, LinearLayersFromLayerTypes) {
  json cfg = LinearConfig();
  cfg.erase("full_attention_interval");
  cfg["layer_types"] = {"linear_attention", "full_attention",   "linear_attention",
                        "linear_attention", "linear_attention", "full_attention",
                        "linear_attention", "linear_attention"};
  const ModelSpec spec = MustParse(cfg);
  EXPECT_THAT(LayersOfKind(spec, LayerKind::kFullAttention), ElementsAre(1, 5));
  EXPECT_EQ(spec.NumLayersOfKind(LayerKind::kLinearAttention), 6);
  ASSERT_EQ(spec.groups.size(), 2u);
  EXPECT_EQ(spec.groups[0].spec.kind, LayerKind::kLinearAttention);
}

TEST(ParseModelSpecTest, MlaIsOneLatentHeadStoredAsKOnly) {
  const ModelSpec spec = MustParse(MlaConfig());
  ASSERT_EQ(spec.num_layers(), 4);
  ASSERT_EQ(spec.groups.size(), 1u);
  const LayerSpec& layer = spec.groups[0].spec;
  EXPECT_EQ(layer.kind, LayerKind::kMla);
  EXPECT_EQ(layer.attention, (AttentionShape{1, 576, 0}));
  EXPECT_EQ(layer.attention.KValuesPerToken(), 576);
  EXPECT_EQ(layer.attention.VValuesPerToken(), 0);
  EXPECT_TRUE(layer.IsAttention());
  EXPECT_EQ(spec.NumLayersOfKind(LayerKind::kFullAttention), 0);
}

TEST(LayerKindNameTest, PlannerJsonNames) {
  EXPECT_EQ(LayerKindName(LayerKind::kFullAttention), "full_attention");
  EXPECT_EQ(LayerKindName(LayerKind::kSlidingWindow), "sliding_window");
  EXPECT_EQ(LayerKindName(LayerKind::kMla), "mla");
  EXPECT_EQ(LayerKindName(LayerKind::kLinearAttention), "linear_attention");
}

TEST(GroupLayersTest, GroupsIdenticalSpecsInFirstLayerOrder) {
  LayerSpec full;
  full.attention = {8, 128, 128};
  LayerSpec sliding = full;
  sliding.kind = LayerKind::kSlidingWindow;
  sliding.sliding_window = 512;
  LayerSpec other_window = sliding;
  other_window.sliding_window = 1024;
  const std::vector<LayerGroup> groups =
      GroupLayers({sliding, full, other_window, sliding, full, other_window});
  ASSERT_EQ(groups.size(), 3u);
  EXPECT_EQ(groups[0].spec, sliding);
  EXPECT_THAT(groups[0].layers, ElementsAre(0, 3));
  EXPECT_EQ(groups[1].spec, full);
  EXPECT_THAT(groups[1].layers, ElementsAre(1, 4));
  EXPECT_EQ(groups[2].spec, other_window);
  EXPECT_THAT(groups[2].layers, ElementsAre(2, 5));
  EXPECT_TRUE(GroupLayers({}).empty());
}

// ---- Malformed configs: InvalidArgument naming the field and the source ----------------

TEST(ParseModelSpecErrorsTest, NotJson) { ExpectInvalid(std::string("{\"num_hidden_layers\": 4,"), {"JSON"}); }

TEST(ParseModelSpecErrorsTest, TopLevelArray) { ExpectInvalid(std::string("[1, 2, 3]"), {"object"}); }

TEST(ParseModelSpecErrorsTest, MissingNumHiddenLayers) {
  json cfg = LlamaConfig();
  cfg.erase("num_hidden_layers");
  ExpectInvalid(cfg, {"num_hidden_layers", "missing"});
}

TEST(ParseModelSpecErrorsTest, NegativeNumKeyValueHeads) {
  json cfg = LlamaConfig();
  cfg["num_key_value_heads"] = -2;
  ExpectInvalid(cfg, {"num_key_value_heads", "-2"});
}

TEST(ParseModelSpecErrorsTest, HiddenSizeIsAString) {
  json cfg = LlamaConfig();
  cfg["hidden_size"] = "512";
  ExpectInvalid(cfg, {"hidden_size", "integer"});
}

TEST(ParseModelSpecErrorsTest, FractionalHiddenSize) {
  json cfg = LlamaConfig();
  cfg["hidden_size"] = 512.5;
  ExpectInvalid(cfg, {"hidden_size", "integer"});
}

TEST(ParseModelSpecErrorsTest, ZeroHeadDim) {
  json cfg = LlamaConfig();
  cfg["head_dim"] = 0;
  ExpectInvalid(cfg, {"head_dim", "positive"});
}

TEST(ParseModelSpecErrorsTest, HeadDimNotDerivable) {
  json cfg = LlamaConfig();
  cfg["num_attention_heads"] = 6;  // 512 % 6 != 0 and no head_dim key
  cfg["num_key_value_heads"] = 2;
  ExpectInvalid(cfg, {"head_dim", "512", "6"});
}

TEST(ParseModelSpecErrorsTest, UnknownLayerKind) {
  json cfg = SlidingConfig();
  cfg["layer_types"][3] = "retention";  // ("mamba" is a Mamba-2 hybrid, mamba_hybrid_test)
  ExpectInvalid(cfg, {"layer_types[3]", "retention"});
}

TEST(ParseModelSpecErrorsTest, LayerTypeNotAString) {
  json cfg = SlidingConfig();
  cfg["layer_types"][2] = 7;
  ExpectInvalid(cfg, {"layer_types[2]", "string"});
}

TEST(ParseModelSpecErrorsTest, LayerTypesOfTheWrongLength) {
  json cfg = SlidingConfig();
  cfg["layer_types"].erase(5);
  ExpectInvalid(cfg, {"layer_types", "5", "6"});
}

TEST(ParseModelSpecErrorsTest, LayerTypesNotAnArray) {
  json cfg = SlidingConfig();
  cfg["layer_types"] = "full_attention";
  ExpectInvalid(cfg, {"layer_types", "array"});
}

TEST(ParseModelSpecErrorsTest, SlidingLayersWithoutSlidingWindow) {
  json cfg = SlidingConfig();
  cfg.erase("sliding_window");
  ExpectInvalid(cfg, {"sliding_window", "missing"});
}

TEST(ParseModelSpecErrorsTest, LinearLayersWithoutLinearKeyHeadDim) {
  json cfg = LinearConfig();
  cfg.erase("linear_key_head_dim");
  ExpectInvalid(cfg, {"linear_key_head_dim", "missing"});
}

TEST(ParseModelSpecErrorsTest, UnknownTorchDtype) {
  json cfg = LlamaConfig();
  cfg["torch_dtype"] = "float64";
  ExpectInvalid(cfg, {"torch_dtype", "float64"});
}

TEST(ParseModelSpecErrorsTest, Q8_0ModelDtype) {
  json cfg = LlamaConfig();
  cfg["torch_dtype"] = "q8_0";
  ExpectInvalid(cfg, {"torch_dtype", "q8_0"});
}

TEST(ParseModelSpecErrorsTest, MoreKvHeadsThanAttentionHeads) {
  json cfg = LlamaConfig();
  cfg["num_key_value_heads"] = 16;
  ExpectInvalid(cfg, {"num_key_value_heads", "16", "8"});
}

TEST(ParseModelSpecErrorsTest, GarbageMambaSsmDtype) {
  json cfg = LinearConfig();
  cfg["mamba_ssm_dtype"] = "float33";
  ExpectInvalid(cfg, {"mamba_ssm_dtype", "float33"});
}

TEST(ParseModelSpecErrorsTest, MlaWithoutRopeHeadDim) {
  json cfg = MlaConfig();
  cfg.erase("qk_rope_head_dim");
  ExpectInvalid(cfg, {"qk_rope_head_dim", "missing"});
}

TEST(ParseModelSpecErrorsTest, UseSlidingWindowNotABool) {
  json cfg = LlamaConfig();
  cfg["use_sliding_window"] = "no";
  ExpectInvalid(cfg, {"use_sliding_window"});
}

// q8_0 is a KV cache format; a recurrent state in it would have no byte size per value.
TEST(ParseModelSpecErrorsTest, Q8_0MambaSsmDtype) {
  json cfg = LinearConfig();
  cfg["mamba_ssm_dtype"] = "q8_0";
  ExpectInvalid(cfg, {"mamba_ssm_dtype", "q8_0"});
}

// Shapes are stored as int32: anything larger is rejected, never truncated.
TEST(ParseModelSpecErrorsTest, HeadDimBeyondInt32) {
  json cfg = LlamaConfig();
  cfg["head_dim"] = (int64_t{1} << 32) + 128;
  ExpectInvalid(cfg, {"head_dim", "implausibly large"});
}

TEST(ParseModelSpecErrorsTest, HiddenSizeBeyondInt32) {
  json cfg = LlamaConfig();
  cfg["hidden_size"] = int64_t{3000000000};
  ExpectInvalid(cfg, {"hidden_size", "3000000000"});
}

// Each field is in range, but together they describe more parameters than int64 arithmetic
// should be trusted with: rejected before any product can overflow.
TEST(ParseModelSpecErrorsTest, ImplausibleParameterCount) {
  json cfg = LlamaConfig();
  cfg["hidden_size"] = int64_t{2000000000};
  cfg["vocab_size"] = int64_t{2000000000};
  cfg["intermediate_size"] = int64_t{2000000000};
  // The message names the shapes, not num_hidden_layers alone (issue 25, item 14).
  ExpectInvalid(cfg, {"implausible", "hidden_size 2000000000", "vocab_size 2000000000"});
}

// A text_config that is not an object used to be ignored, the top-level fields read instead.
TEST(ParseModelSpecErrorsTest, TextConfigNotAnObject) {
  json cfg = LlamaConfig();
  cfg["text_config"] = "a string";
  ExpectInvalid(cfg, {"text_config", "must be an object", "\"a string\""});
}

// 5 KV heads cannot be shared evenly by 32 query heads.
TEST(ParseModelSpecErrorsTest, KvHeadsNotDividingAttentionHeads) {
  json cfg = LlamaConfig();
  cfg["num_attention_heads"] = 32;
  cfg["num_key_value_heads"] = 5;
  cfg["head_dim"] = 128;
  ExpectInvalid(cfg, {"num_key_value_heads", "(5) does not divide num_attention_heads (32)"});
}

// ---- Files ------------------------------------------------------------------------------

// Writes `text` to `path` (creating parent directories).
void WriteFile(const std::filesystem::path& path, const std::string& text) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream out(path);
  out << text;
  ASSERT_TRUE(out.good()) << "cannot write " << path;
}

TEST(LoadModelSpecFromFileTest, DirectoryIsNotFound) {
  const std::string dir = testing::TempDir() + "/kvpage_a_directory";
  std::filesystem::create_directories(dir);
  absl::StatusOr<ModelSpec> spec = LoadModelSpecFromFile(dir);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(spec.status().message().find(dir), std::string::npos);
}

TEST(LoadModelSpecFromFileTest, MissingFileIsNotFound) {
  const std::string path = testing::TempDir() + "/kvpage_no_such_dir/nothing.json";
  absl::StatusOr<ModelSpec> spec = LoadModelSpecFromFile(path);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(spec.status().message(), HasSubstr(path));
}

TEST(LoadModelSpecFromFileTest, NamesTheModelAfterTheFileStem) {
  const std::filesystem::path path =
      std::filesystem::path(testing::TempDir()) / "kvpage_model_spec_test" / "tiny-llama.json";
  WriteFile(path, LlamaConfig().dump());
  absl::StatusOr<ModelSpec> spec = LoadModelSpecFromFile(path.string());
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name, "tiny-llama");
  EXPECT_EQ(spec->source, path.string());
  EXPECT_EQ(spec->num_layers(), 4);
}

TEST(LoadModelSpecFromFileTest, NamesAConfigJsonAfterItsDirectory) {
  const std::filesystem::path path = std::filesystem::path(testing::TempDir()) /
                                     "kvpage_model_spec_test" / "my-model" / "config.json";
  WriteFile(path, GemmaConfig().dump());
  absl::StatusOr<ModelSpec> spec = LoadModelSpecFromFile(path.string());
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name, "my-model");
  EXPECT_EQ(spec->num_layers(), 34);
}

TEST(LoadModelSpecFromFileTest, MalformedFileNamesThePath) {
  const std::filesystem::path path =
      std::filesystem::path(testing::TempDir()) / "kvpage_model_spec_test" / "broken.json";
  WriteFile(path, "{\"num_hidden_layers\": ");
  absl::StatusOr<ModelSpec> spec = LoadModelSpecFromFile(path.string());
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spec.status().message(), HasSubstr(path.string()));
}

// ---- Parameter counts of bundled models -------------------------------------------------

int64_t BundledParams(const std::string& name) {
  absl::StatusOr<ModelSpec> spec = LoadModel(name);
  EXPECT_TRUE(spec.ok()) << name << ": " << spec.status();
  return spec.ok() ? spec->num_params : 0;
}

// |got − want| / want.
double RelativeError(int64_t got, double want) { return std::abs(got - want) / want; }

TEST(ParamCountTest, Llama31_8BMatchesSafetensorsTotal) {
  // Untied: 2 × 128,256 × 4,096 = 1,050,673,152, + final norm 4,096.
  // Per layer: norms 8,192 + q,o 2 × 4,096² + k,v 2 × 4,096 × 1,024 + MLP 3 × 4,096 × 14,336
  //          = 8,192 + 41,943,040 + 176,160,768 = 218,112,000; × 32 = 6,979,584,000.
  // Total 8,030,261,248: the parameter total of meta-llama/Llama-3.1-8B's safetensors.
  EXPECT_EQ(BundledParams("llama-3.1-8b"), 8'030'261'248);
}

TEST(ParamCountTest, Qwen3_8BMatchesSafetensorsTotal) {
  // Untied: 2 × 151,936 × 4,096 = 1,244,659,712, + final norm 4,096.
  // Per layer: norms 8,192 + q,o 2 × 4,096 × 4,096 + k,v 2 × 4,096 × 1,024 + q/k norms 256
  //          + MLP 3 × 4,096 × 12,288 = 192,946,432; × 36 = 6,946,071,552.
  // Total 8,190,735,360: the parameter total of Qwen/Qwen3-8B's safetensors.
  EXPECT_EQ(BundledParams("qwen3-8b"), 8'190'735'360);
}

TEST(ParamCountTest, DeepSeekV3IsAbout671B) {
  // DeepSeek-V3 Technical Report (arXiv:2412.19437): "671B total parameters"; the 685B on
  // the Hugging Face card adds the 14B MTP module, which the count leaves out.
  EXPECT_LT(RelativeError(BundledParams("deepseek-v3"), 671e9), 0.005);
}

// The indexer's weights per layer, as the DeepSeek-V3.2 checkpoint lists them: wq_b
// [64·128, q_lora_rank 1,536] = 12,582,912, wk [128, 7,168] = 917,504, k_norm weight and bias
// 2 × 128 = 256, weights_proj [64, 7,168] = 458,752: 13,959,424; × 61 layers = 851,524,864 more
// than DeepSeek-V3, whose config is otherwise the same.
TEST(ParamCountTest, DeepSeekV32AddsTheIndexerWeights) {
  EXPECT_EQ(BundledParams("deepseek-v3.2") - BundledParams("deepseek-v3"), 851'524'864);
}

TEST(ParamCountTest, GptOss20BIsAbout20_9B) {
  // OpenAI gpt-oss model card (arXiv:2508.10925), table of parameter counts: gpt-oss-20b
  // has 20.9B total parameters.
  EXPECT_LT(RelativeError(BundledParams("gpt-oss-20b"), 20.9e9), 0.01);
}

TEST(ParamCountTest, DeepSeekV2LiteIsAbout15_7B) {
  // DeepSeek-V2 paper (arXiv:2405.04434) and the deepseek-ai/DeepSeek-V2-Lite model card:
  // 15.7B total parameters (2.4B activated).
  EXPECT_LT(RelativeError(BundledParams("deepseek-v2-lite"), 15.7e9), 0.01);
}

TEST(ParseModelSpecTest, ReadsRopeScalingTypeAndFactor) {
  json cfg = LlamaConfig();
  auto plain = ParseModelSpec(cfg.dump(), "m", kSource);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->rope_type, "");
  EXPECT_EQ(plain->rope_factor, 1.0);
  EXPECT_EQ(plain->model_max_length, 0);
  cfg["rope_scaling"] = {{"type", "linear"}, {"factor", 4.0}};
  cfg["model_max_length"] = 4096;
  auto linear = ParseModelSpec(cfg.dump(), "m", kSource);
  ASSERT_TRUE(linear.ok()) << linear.status();
  EXPECT_EQ(linear->rope_type, "linear");
  EXPECT_EQ(linear->rope_factor, 4.0);
  EXPECT_EQ(linear->model_max_length, 4096);
  cfg.erase("rope_scaling");
  cfg["rope_parameters"] = {{"rope_type", "default"}, {"factor", nullptr}};
  auto params = ParseModelSpec(cfg.dump(), "m", kSource);
  ASSERT_TRUE(params.ok()) << params.status();
  EXPECT_EQ(params->rope_type, "default");
  EXPECT_EQ(params->rope_factor, 1.0);
}

TEST(ParseModelSpecTest, RejectsABadRopeFactorNamingTheField) {
  json cfg = LlamaConfig();
  cfg["rope_scaling"] = {{"rope_type", "linear"}, {"factor", "four"}};
  auto spec = ParseModelSpec(cfg.dump(), "m", kSource);
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(spec.status().message(), HasSubstr("rope_scaling"));
  EXPECT_THAT(spec.status().message(), HasSubstr("factor"));
  cfg["rope_scaling"] = {{"rope_type", "linear"}, {"factor", -2}};
  EXPECT_FALSE(ParseModelSpec(cfg.dump(), "m", kSource).ok());
  cfg["rope_scaling"] = "linear";
  EXPECT_THAT(ParseModelSpec(cfg.dump(), "m", kSource).status().message(),
              HasSubstr("is not an object"));
}

}  // namespace
}  // namespace kvpage
