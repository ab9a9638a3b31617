// vLLM 0.29's reservation for one max-length request (vllm.md §1.3–1.8).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "kvpage/catalog.h"
#include "kvpage/model_spec.h"
#include "kvpage/planner.h"
#include "testing/plan_checks.h"

namespace kvpage {
namespace {

using testing::kGiB;
using testing::kKiB;
using testing::kMiB;
using testing::PlanBundled;

PlanOptions Vllm() { return testing::WithPolicy(Policy::kVllm); }

// Llama 4 Scout's layer shape in 8 layers (8 KV heads × 128, bf16: 64 KiB per layer per
// 16-token block), chunks of 8,192 tokens; `no_rope` marks the global (NoPE) layers.
ModelSpec Llama4Shape(const std::string& no_rope) {
  auto spec = ParseModelSpec(absl::StrCat(R"({"model_type": "llama4_text",
      "num_hidden_layers": 8, "hidden_size": 5120, "num_attention_heads": 40,
      "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 8192,
      "intermediate_size_mlp": 16384, "vocab_size": 202048, "max_position_embeddings": 10485760,
      "num_local_experts": 16, "num_experts_per_tok": 1, "attention_chunk_size": 8192,
      "no_rope_layers": )", no_rope, "}"), "llama4-shape", "test");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *std::move(spec) : ModelSpec{};
}

// vLLM 0.33 turns its hybrid manager off for a model with an attention_chunk_size: chunked
// layers beside global ones are full attention, all 8 layers in one group (block id 8 × 64
// KiB). Only an all-chunked model keeps ChunkedLocalAttentionSpec's admission bound.
TEST(VllmPolicyTest, Llama4ChunkedLayersArePromotedBesideGlobalOnes) {
  auto hybrid = MakePlan(Llama4Shape("[1, 1, 1, 0, 1, 1, 1, 0]"), Vllm(), {32768});
  ASSERT_TRUE(hybrid.ok()) << hybrid.status();
  ASSERT_EQ(hybrid->rows[0].groups.size(), 1u);
  EXPECT_EQ(hybrid->rows[0].groups[0].kind, LayerKind::kFullAttention);
  EXPECT_EQ(hybrid->rows[0].reserved_bytes, 2048 * 512 * kKiB);  // cdiv(32768, 16) blocks
  auto chunked = MakePlan(Llama4Shape("[1, 1, 1, 1, 1, 1, 1, 1]"), Vllm(), {32768});
  ASSERT_TRUE(chunked.ok()) << chunked.status();
  ASSERT_EQ(chunked->rows[0].groups.size(), 1u);
  EXPECT_EQ(chunked->rows[0].groups[0].kind, LayerKind::kChunkedLocal);
  // cdiv(min(8192 + 2 × 8192, 32768), 16) = 1,536 blocks.
  EXPECT_EQ(chunked->rows[0].reserved_bytes, 1536 * 512 * kKiB);
}

TEST(VllmPolicyTest, Gemma3PadsItsSlidingGroupsAndChargesTwoBatchesInFlight) {
  Plan plan = PlanBundled("gemma-3-4b-it", Vllm(), {32768});
  const PlanRow& row = plan.rows[0];
  // 29 sliding + 5 full layers → group size 5: 6 sliding groups (one padding layer) + 1 full.
  ASSERT_EQ(row.groups.size(), 7u);
  int padding = 0, sliding_groups = 0;
  for (const GroupReservation& g : row.groups) {
    EXPECT_EQ(g.num_layers + g.padding_layers, 5);
    EXPECT_EQ(g.block_size, 16);
    padding += g.padding_layers;
    if (g.kind == LayerKind::kSlidingWindow) {
      ++sliding_groups;
      EXPECT_EQ(g.blocks, 1089);  // cdiv(min(1023 + 16384, 32768), 16) + 1
    } else {
      EXPECT_EQ(g.blocks, 2048);
    }
    EXPECT_EQ(g.reserved_bytes, g.blocks * 320 * kKiB);  // one block id = 5 × 64 KiB
  }
  EXPECT_EQ(padding, 1);
  EXPECT_EQ(sliding_groups, 6);
  // (2048 + 6 × 1089) × 320 KiB = 2,681.875 MiB (the measured post: 2,682).
  EXPECT_EQ(row.reserved_bytes, 8582 * 320 * kKiB);
  EXPECT_EQ(row.reserved_bytes * 8, 21455 * kMiB);
}

TEST(VllmPolicyTest, SlidingAllowanceFollowsBatchedTokensAndScheduling) {
  PlanOptions serve = Vllm();
  serve.max_num_batched_tokens = 2048;  // `vllm serve` on an A100
  // SWA cdiv(1023 + 4096, 16) + 1 = 321 → 2048 + 6 × 321 = 3,974 blocks.
  EXPECT_EQ(PlanBundled("gemma-3-4b-it", serve, {32768}).rows[0].reserved_bytes,
            3974 * 320 * kKiB);
  PlanOptions sync = Vllm();
  sync.async_scheduling = false;
  // SWA cdiv(1023 + 8192, 16) + 1 = 577 → 5,510 blocks.
  EXPECT_EQ(PlanBundled("gemma-3-4b-it", sync, {32768}).rows[0].reserved_bytes,
            5510 * 320 * kKiB);

  // gpt-oss-20b: 12 + 12 layers, block id = 12 × 32 KiB; SWA cdiv(127 + 16384, 16) + 1 = 1,033.
  EXPECT_EQ(PlanBundled("gpt-oss-20b", Vllm(), {32768}).rows[0].reserved_bytes,
            (2048 + 1033) * 384 * kKiB);
  EXPECT_EQ(PlanBundled("gpt-oss-20b", serve, {32768}).rows[0].reserved_bytes,
            2313 * 384 * kKiB);
  EXPECT_EQ(PlanBundled("gpt-oss-20b", sync, {32768}).rows[0].reserved_bytes,
            (2048 + 521) * 384 * kKiB);
}

TEST(VllmPolicyTest, HybridModelUses528TokenBlocksAndPaddedStatePages) {
  Plan plan = PlanBundled("qwen3.5-9b", Vllm(), {4096, 32768, 131072});
  const PlanRow& row = plan.rows[1];
  // 8 full + 24 GDN → group size 8: 1 full group + 3 GDN groups; block id = 8 × 2.0625 MiB.
  ASSERT_EQ(row.groups.size(), 4u);
  EXPECT_EQ(row.groups[0].kind, LayerKind::kLinearAttention);
  EXPECT_EQ(row.groups[0].blocks, 2);
  EXPECT_EQ(row.groups[3].kind, LayerKind::kFullAttention);
  EXPECT_EQ(row.groups[3].block_size, 528);
  EXPECT_EQ(row.groups[3].blocks, 63);  // cdiv(32768, 528)
  // Fixed part: 3 groups × 2 blocks × 16.5 MiB = 99 MiB.
  EXPECT_EQ(row.state_bytes, 99 * kMiB);
  // (63 + 6) × 16.5 MiB / 32768 = 36,432 bytes per token (post: 36,444 incl. capacity rounding).
  EXPECT_DOUBLE_EQ(row.bytes_per_token, 36432.0);

  PlanOptions no_cache = Vllm();
  no_cache.enable_prefix_caching = false;
  Plan off = PlanBundled("qwen3.5-9b", no_cache, {4096, 32768, 131072});
  EXPECT_EQ(off.rows[1].state_bytes, 99 * kMiB / 2);  // 49.5 MiB
  EXPECT_DOUBLE_EQ(off.rows[0].bytes_per_token, 46464.0);
  EXPECT_DOUBLE_EQ(off.rows[1].bytes_per_token, 34848.0);
  EXPECT_DOUBLE_EQ(off.rows[2].bytes_per_token, 33264.0);
}

// qwen3.5-0.8b: 2 KV heads × 256 → 2,048 B per token and layer; state 1,085,440 B, so the
// block is 16 × cdiv(1,085,440, 32,768) = 544 tokens (not Qwen3.5-9B's 528).
TEST(VllmPolicyTest, Qwen35SmallGets544TokenBlocks) {
  Plan plan = PlanBundled("qwen3.5-0.8b", Vllm(), {32768});
  const PlanRow& row = plan.rows[0];
  ASSERT_EQ(row.groups.size(), 4u);  // 6 full + 18 GDN → 1 full + 3 GDN groups of 6
  EXPECT_EQ(row.groups[3].block_size, 544);
  EXPECT_EQ(row.groups[3].blocks, 61);  // cdiv(32768, 544)
  // Block id = 6 × 544 × 2048 B = 6,684,672 B; (61 + 3 × 2) blocks.
  EXPECT_EQ(row.reserved_bytes, 67 * int64_t{6684672});
}

// Nemotron-H-8B's shape (published values; no verbatim config.json is bundled). vLLM's
// MambaSpec page for one Mamba-2 layer is conv 3 × 10,240 bf16 + SSM 128 × 64 × 128 f32 =
// 61,440 + 4,194,304 = 4,255,744 B. An attention layer stores 2 × 8 × 128 × 2 = 4,096 B per
// token, so _align_hybrid_block_size gives 16 × cdiv(4,255,744, 16 × 4,096) = 1,040-token
// blocks and a 4,259,840-byte page, to which the Mamba pages are padded.
TEST(VllmPolicyTest, NemotronHGets1040TokenBlocks) {
  constexpr char kNemotronH8B[] = R"({"model_type": "nemotron_h",
      "hybrid_override_pattern": "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-",
      "num_hidden_layers": 52, "hidden_size": 4096, "intermediate_size": 21504,
      "num_attention_heads": 32, "num_key_value_heads": 8, "mamba_num_heads": 128,
      "mamba_head_dim": 64, "ssm_state_size": 128, "n_groups": 8, "conv_kernel": 4,
      "tie_word_embeddings": false, "vocab_size": 131072, "max_position_embeddings": 8192,
      "torch_dtype": "bfloat16"})";
  auto model = ParseModelSpec(kNemotronH8B, "nemotron-h-8b", "test");
  ASSERT_TRUE(model.ok()) << model.status();
  auto plan = MakePlan(*model, Vllm(), {8192}, std::nullopt);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const PlanRow& row = plan->rows[0];
  testing::ExpectRowInvariants(row);
  // 4 attention + 24 Mamba layers → group size 4: 1 attention group + 6 Mamba groups.
  ASSERT_EQ(row.groups.size(), 7u);
  int64_t state_blocks = 0;
  for (const GroupReservation& g : row.groups) {
    EXPECT_EQ(g.num_layers, 4);
    if (g.kind == LayerKind::kFullAttention) {
      EXPECT_EQ(g.block_size, 1040);
      EXPECT_EQ(g.blocks, 8);  // cdiv(8192, 1040)
    } else {
      state_blocks += g.blocks;
    }
  }
  EXPECT_EQ(state_blocks, 12);  // 2 per Mamba group with prefix caching
  // (8 + 12) blocks × 4 layers × 4,259,840 B.
  EXPECT_EQ(row.reserved_bytes, 20 * 4 * int64_t{4259840});
}

// Both releases reserve the same on the Triton GDN path (capacity_planning.md §3.2.1).
TEST(VllmPolicyTest, Releases029And033ReserveTheSame) {
  PlanOptions v29 = Vllm(), v33 = Vllm();
  v29.vllm_version = VllmVersion::kV0_29;
  v33.vllm_version = VllmVersion::kV0_33;
  for (const char* model : {"gemma-3-4b-it", "qwen3.5-9b", "qwen3.5-0.8b", "gpt-oss-20b",
                            "deepseek-v2-lite", "llama-3.1-8b"}) {
    SCOPED_TRACE(model);
    Plan a = PlanBundled(model, v29, {4096, 32768}, 40 * kGiB);
    Plan b = PlanBundled(model, v33, {4096, 32768}, 40 * kGiB);
    ASSERT_EQ(a.rows.size(), b.rows.size());
    for (size_t i = 0; i < a.rows.size(); ++i) {
      EXPECT_EQ(a.rows[i].reserved_bytes, b.rows[i].reserved_bytes);
      EXPECT_EQ(a.rows[i].max_concurrency, b.rows[i].max_concurrency);
    }
  }
  PlanOptions bad = Vllm();
  bad.vllm_version = static_cast<VllmVersion>(9);
  EXPECT_TRUE(absl::IsInvalidArgument(bad.Validate()));
}

TEST(VllmPolicyTest, UniformModelsCostWhatTheyStore) {
  Plan mla = PlanBundled("deepseek-v2-lite", Vllm(), {32768});
  EXPECT_DOUBLE_EQ(mla.rows[0].bytes_per_token, 31104.0);
  ASSERT_EQ(mla.rows[0].groups.size(), 1u);
  EXPECT_EQ(mla.rows[0].groups[0].kind, LayerKind::kMla);
  EXPECT_EQ(mla.rows[0].groups[0].num_layers, 27);
  Plan qwen = PlanBundled("qwen3-8b", Vllm(), {32768});
  EXPECT_DOUBLE_EQ(qwen.rows[0].bytes_per_token, 147456.0);
  // A context that is not a block multiple rounds up to whole blocks: cdiv(1000, 16) = 63.
  EXPECT_EQ(PlanBundled("qwen3-8b", Vllm(), {1000}).rows[0].reserved_bytes,
            int64_t{63} * 16 * 147456);
}

// DeepSeek-V3.2: vLLM registers each layer's indexer cache as a layer of its own
// (DeepseekV32IndexerCache, an MLAAttentionSpec of 132 uint8 a token), which joins the 61 MLA
// layers in one group of per-layer pages (UniformTypeKVCacheSpecs), and forces 64-token blocks
// (FlashMLASparse). bf16: a block id is 64 × (576 × 2 + 132) × 61 = 5,012,736 bytes.
TEST(VllmPolicyTest, DeepSeekV32KeepsTheIndexerInTheMlaGroup) {
  Plan plan = PlanBundled("deepseek-v3.2", Vllm(), {1000, 32768}, 64 * kGiB);
  ASSERT_EQ(plan.rows[1].groups.size(), 1u);
  const GroupReservation& g = plan.rows[1].groups[0];
  EXPECT_EQ(g.kind, LayerKind::kMla);
  EXPECT_EQ(g.num_layers, 61);
  EXPECT_EQ(g.block_size, 64);  // asked for 16
  EXPECT_EQ(g.blocks, 512);     // cdiv(32768, 64)
  EXPECT_EQ(plan.rows[1].reserved_bytes, int64_t{512} * 5'012'736);
  EXPECT_DOUBLE_EQ(plan.rows[1].bytes_per_token, 61.0 * 1284);
  // 1,000 tokens take cdiv(1000, 64) = 16 blocks.
  EXPECT_EQ(plan.rows[0].reserved_bytes, int64_t{16} * 5'012'736);
  // 64 GiB / 5,012,736 = 13,708 block ids; 13,708 / 512 = 26 requests of 32K.
  EXPECT_EQ(plan.rows[1].max_concurrency, 26);
  // fp8 becomes vLLM's fp8_ds_mla latent of 656 bytes; the indexer stays 132:
  // 64 × (656 + 132) × 61 = 3,076,352 bytes a block id.
  PlanOptions fp8 = Vllm();
  fp8.kv_cache_dtype = DType::kFP8;
  EXPECT_EQ(PlanBundled("deepseek-v3.2", fp8, {32768}).rows[0].reserved_bytes,
            int64_t{512} * 3'076'352);
}

TEST(VllmPolicyTest, MaxConcurrencyFloorsBlocksThenRequests) {
  // Qwen3-8B: block id = 36 × 64 KiB = 2.25 MiB; 64 GiB → 29,127 blocks; 2,048 per request.
  Plan plan = PlanBundled("qwen3-8b", Vllm(), {32768}, 64 * kGiB);
  EXPECT_EQ(plan.rows[0].max_concurrency, 14);
  // Gemma 3 at 32K: 16 GiB / 320 KiB = 52,428 blocks; 8,582 per request → 6.
  EXPECT_EQ(PlanBundled("gemma-3-4b-it", Vllm(), {32768}, 16 * kGiB).rows[0].max_concurrency, 6);
}

TEST(VllmPolicyTest, Fp8HalvesPagesAndQ8_0IsRejected) {
  PlanOptions fp8 = Vllm();
  fp8.kv_cache_dtype = DType::kFP8;
  EXPECT_EQ(PlanBundled("gemma-3-4b-it", fp8, {32768}).rows[0].reserved_bytes,
            8582 * 160 * kKiB);
  PlanOptions q8 = Vllm();
  q8.kv_cache_dtype = DType::kQ8_0;
  auto model = LoadModel("qwen3-8b");
  ASSERT_TRUE(model.ok());
  auto plan = MakePlan(*model, q8, std::vector<int64_t>{4096});
  EXPECT_TRUE(absl::IsInvalidArgument(plan.status()));
  EXPECT_NE(plan.status().message().find("q8_0"), absl::string_view::npos);
}

TEST(VllmPolicyTest, LargerBlockSizeRoundsFullAttentionUp) {
  PlanOptions bs32 = Vllm();
  bs32.block_size = 32;
  // cdiv(1000, 32) = 32 blocks of 32 tokens = 1,024 tokens.
  EXPECT_EQ(PlanBundled("qwen3-8b", bs32, {1000}).rows[0].reserved_bytes, int64_t{1024} * 147456);
}

// vLLM's start-up checks (vllm/config/model.py, vllm/v1/core/kv_cache_planning.py, 0.33).
TEST(VllmPolicyTest, SaysWhenVllmWouldNotStartAboveTheModelsLength) {
  // Qwen3-8B: max_position_embeddings 40960, no RoPE scaling.
  const Plan plan = PlanBundled("qwen3-8b", Vllm(), {40960, 131072});
  EXPECT_EQ(plan.rows[0].refusal, "");
  EXPECT_EQ(plan.rows[1].refusal,
            "max_model_len 131072 is greater than the derived max_model_len 40960 "
            "(max_position_embeddings=40960 in config.json)");
  ASSERT_EQ(plan.rows[1].fixes.size(), 3u);
  EXPECT_EQ(plan.rows[1].fixes[0], "--max-model-len 40960");
  EXPECT_THAT(plan.rows[1].fixes[2], ::testing::StartsWith("VLLM_ALLOW_LONG_MAX_MODEL_LEN=1"));
  // The other policies do not check it.
  EXPECT_EQ(PlanBundled("qwen3-8b", testing::WithPolicy(Policy::kKvpage), {131072}).rows[0].refusal,
            "");
  // VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 lets the length through; without a budget nothing else is
  // checked, with 2 GiB the memory refuses it instead.
  PlanOptions allow = Vllm();
  allow.allow_long_max_model_len = true;
  EXPECT_EQ(PlanBundled("qwen3-8b", allow, {131072}).rows[0].refusal, "");
  EXPECT_THAT(PlanBundled("qwen3-8b", allow, {131072}, 2 * kGiB).rows[0].refusal,
              ::testing::StartsWith("one request of max_model_len 131072 needs 18.0 GiB"));
}

TEST(VllmPolicyTest, SaysWhenOneRequestDoesNotFitAndTheLongestThatDoes) {
  // Qwen3-8B, 2 GiB: one block id = 16 tokens × 36 layers × 4 KiB = 2.25 MiB. vLLM checks
  // against the budget less its null block, 2,048 − 2.25 = 2,045.75 MiB = 909.2 blocks, so
  // 909 blocks = 14,544 tokens fit. 14,560 tokens need 910 blocks = 2,047.5 MiB: refused,
  // although the capacity log (max_concurrency) counts 910 blocks and 1 request.
  const Plan plan = PlanBundled("qwen3-8b", Vllm(), {14544, 14560, 32768}, 2 * kGiB);
  EXPECT_EQ(plan.rows[0].refusal, "");
  EXPECT_TRUE(plan.rows[0].fixes.empty());
  EXPECT_EQ(plan.rows[1].max_concurrency, 1);
  EXPECT_EQ(plan.rows[1].refusal,
            "one request of max_model_len 14560 needs 2.0 GiB of KV cache, more than the 2.0 "
            "GiB available");
  // fp8 halves the block (1.125 MiB): 910 of them = 1,023.75 MiB fit in 2,046.875 MiB.
  // tp 2 halves the KV heads: the same. Utilization is not offered: no GPU given.
  EXPECT_THAT(plan.rows[1].fixes,
              ::testing::ElementsAre("--max-model-len 14544", "--kv-cache-dtype fp8", "--tp 2"));
  // 32K: 2,048 blocks = 4,608 MiB = 4.5 GiB. fp8: 2,304 MiB, still too much; tp 2: 2,304 MiB
  // too; tp 4: 1,152 MiB fits.
  EXPECT_EQ(plan.rows[2].refusal,
            "one request of max_model_len 32768 needs 4.5 GiB of KV cache, more than the 2.0 "
            "GiB available");
  EXPECT_THAT(plan.rows[2].fixes, ::testing::ElementsAre("--max-model-len 14544", "--tp 4"));
}

TEST(VllmPolicyTest, NamesTheUtilizationThatFitsOnAKnownGpu) {
  // Qwen3-8B on an L4 (24,152,899,584 B; weights 16,381,470,720 B) at 0.9 with `vllm serve`'s
  // defaults there (2,048 tokens, 256 requests): runtime memory 1,899,466,589 B
  // (vllm_runtime_memory_test), budget = 21,737,609,625 − 16,381,470,720 − 1,899,466,589 =
  // 3,456,672,316 B; less one 2,359,296 B block = 1,464.1 blocks = 23,424 tokens. 32K needs
  // 2,048 blocks = 4,831,838,208 B: a utilization of 0.96 gives 23,186,783,600 B in all,
  // enough for weights, runtime, the null block and the request (23,115,134,813 B).
  PlanOptions l4 = Vllm();
  l4.gpu_memory_bytes = 24152899584;
  l4.gpu_memory_utilization = 0.9;
  l4.max_num_batched_tokens = 2048;
  l4.max_num_seqs = 256;
  const Plan plan = PlanBundled("qwen3-8b", l4, {32768}, 3456672316);
  EXPECT_EQ(plan.rows[0].refusal,
            "one request of max_model_len 32768 needs 4.5 GiB of KV cache, more than the 3.22 "
            "GiB available");
  // tp 2: each GPU holds 8,190,735,360 B of weights, 2.1 GiB of non-torch buffers and half
  // the KV (2,415,919,104 B): it fits.
  EXPECT_THAT(plan.rows[0].fixes,
              ::testing::ElementsAre("--max-model-len 23424", "--kv-cache-dtype fp8",
                                     "--gpu-memory-utilization 0.96", "--tp 2"));
}

TEST(VllmPolicyTest, BudgetUnderOneBlockHasNoMemoryForTheCache) {
  const Plan plan = PlanBundled("qwen3-8b", Vllm(), {4096}, 2359296);
  EXPECT_EQ(plan.rows[0].refusal,
            "no memory is available for the cache blocks: the KV budget of 2359296 bytes does "
            "not exceed one block (2359296 bytes)");
  EXPECT_THAT(plan.rows[0].fixes, ::testing::ElementsAre("a GPU with more memory"));
  PlanOptions bad = Vllm();
  bad.gpu_memory_utilization = 1.5;
  auto model = LoadModel("qwen3-8b");
  ASSERT_TRUE(model.ok());
  EXPECT_THAT(MakePlan(*model, bad, std::vector<int64_t>{4096}).status().message(),
              ::testing::HasSubstr("gpu_memory_utilization must be in (0, 1], got 1.5"));
}

TEST(VllmPolicyTest, DerivedLengthScalesRopeOnlyWhereVllmDoes) {
  auto derived = [](const char* name) {
    auto m = LoadModel(name);
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? VllmDerivedMaxModelLen(*m) : -1;
  };
  EXPECT_EQ(derived("llama-3.1-8b"), 131072);     // llama3 scaling is counted already
  EXPECT_EQ(derived("gemma-3-4b-it"), 131072);    // linear × 8, but Gemma 3 is exempt
  EXPECT_EQ(derived("deepseek-v2-lite"), 163840);  // YaRN
  ModelSpec linear = *LoadModel("mistral-7b-v0.3");
  linear.rope_type = "linear";
  linear.rope_factor = 2.0;
  EXPECT_EQ(VllmDerivedMaxModelLen(linear), 65536);
}

}  // namespace
}  // namespace kvpage
