// The three planner policies on the linear-attention hybrids of src/model/linear_hybrid.h:
// Jamba 1.5 Mini, MiniMax-M1 and Kimi Linear 48B (bundled configs). Every figure is worked
// out by hand from the config in the comment above it. One request, no budget, 4K tokens unless
// a test says otherwise.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "kvpage/model_spec.h"
#include "kvpage/plan_format.h"
#include "kvpage/planner.h"
#include "testing/plan_checks.h"

namespace kvpage {
namespace {

using ::testing::HasSubstr;
using testing::kMiB;
using testing::PlanBundled;

PlanOptions With(Policy policy) { return testing::WithPolicy(policy); }

// kvpage: what the layers store. Jamba: 4 attention layers × 4096 tokens × (2 · 8 heads · 128
// · 2 B = 4,096 B) = 67,108,864 B, plus 28 Mamba states of 311,296 B = 8,716,288 B.
// MiniMax-M1: 10 × 4096 × 4,096 = 167,772,160 B plus 70 states of 2,097,152 B.
// Kimi Linear: 7 MLA layers × 4096 × 576 · 2 B = 33,030,144 B plus 20 KDA states of
// 2,170,880 B = 43,417,600 B.
TEST(LinearHybridPlanTest, KvpageReservesTokensPlusOneStatePerLayer) {
  Plan jamba = PlanBundled("jamba-1.5-mini", With(Policy::kKvpage), {4096});
  EXPECT_EQ(jamba.rows[0].reserved_bytes, 67'108'864 + 8'716'288);
  EXPECT_EQ(jamba.rows[0].state_bytes, 8'716'288);
  Plan minimax = PlanBundled("minimax-m1", With(Policy::kKvpage), {4096});
  EXPECT_EQ(minimax.rows[0].reserved_bytes, 167'772'160 + 70 * int64_t{2'097'152});
  EXPECT_EQ(minimax.rows[0].reserved_bytes, 300 * kMiB);
  Plan kimi = PlanBundled("kimi-linear-48b-a3b-instruct", With(Policy::kKvpage), {4096});
  EXPECT_EQ(kimi.rows[0].reserved_bytes, 33'030'144 + 43'417'600);
  EXPECT_EQ(kimi.rows[0].state_bytes, 43'417'600);
}

// vLLM 0.33, Jamba: _align_hybrid_block_size (vllm/platforms/interface.py:1096-1102) grows the
// attention block to 16 · cdiv(311,296, 16 · 4,096) = 80 tokens, a 327,680-byte page the
// Mamba pages are padded to. 4 attention + 28 Mamba layers: groups of 4, one attention group
// and 7 Mamba groups. cdiv(4096, 80) = 52 attention blocks and 2 state blocks per Mamba group
// with prefix caching: (52 + 14) blocks × 4 layers × 327,680 B = 86,507,520 B (82.5 MiB).
TEST(LinearHybridPlanTest, VllmJambaGets80TokenBlocks) {
  Plan plan = PlanBundled("jamba-1.5-mini", With(Policy::kVllm), {4096});
  const PlanRow& row = plan.rows[0];
  ASSERT_EQ(row.groups.size(), 8u);
  int64_t state_blocks = 0;
  for (const GroupReservation& g : row.groups) {
    EXPECT_EQ(g.num_layers, 4);
    if (g.kind == LayerKind::kFullAttention) {
      EXPECT_EQ(g.block_size, 80);
      EXPECT_EQ(g.blocks, 52);
    } else {
      state_blocks += g.blocks;
    }
  }
  EXPECT_EQ(state_blocks, 14);
  EXPECT_EQ(row.reserved_bytes, 66 * 4 * int64_t{327'680});
  EXPECT_TRUE(row.refusal.empty());
}

// vLLM 0.33, Kimi Linear: MLA beside a Mamba state makes the block a multiple of 128 tokens
// (interface.py:1081-1087): 128 · cdiv(2,170,880, 128 · 1,152) = 1,920 tokens, a
// 2,211,840-byte page. 7 MLA + 20 KDA layers: groups of 7, one MLA group and 3 KDA groups
// (21 slots, one padding). cdiv(4096, 1920) = 3 MLA blocks + 2 · 3 state blocks:
// 9 × 7 × 2,211,840 B = 139,345,920 B.
TEST(LinearHybridPlanTest, VllmKimiGets1920TokenBlocks) {
  Plan plan = PlanBundled("kimi-linear-48b-a3b-instruct", With(Policy::kVllm), {4096});
  const PlanRow& row = plan.rows[0];
  ASSERT_EQ(row.groups.size(), 4u);
  for (const GroupReservation& g : row.groups) {
    if (g.kind == LayerKind::kMla) {
      EXPECT_EQ(g.block_size, 1920);
      EXPECT_EQ(g.blocks, 3);
    }
  }
  EXPECT_EQ(row.reserved_bytes, 9 * 7 * int64_t{2'211'840});
}

// vLLM 0.33 no longer serves MiniMax-M1 (registry.py:863: supported until v0.23.0): the vllm
// policy says so for every length and reserves nothing.
TEST(LinearHybridPlanTest, VllmRefusesMiniMaxM1) {
  Plan plan = PlanBundled("minimax-m1", With(Policy::kVllm), {4096, 131072}, 100 * kMiB);
  for (const PlanRow& row : plan.rows) {
    EXPECT_THAT(row.refusal, HasSubstr("MiniMaxM1ForCausalLM was supported in vLLM until "
                                       "v0.23.0, and is not supported anymore"));
    EXPECT_EQ(row.reserved_bytes, 0);
    EXPECT_EQ(row.max_concurrency, 0);
  }
}

// llama.cpp: f16 K/V per cell (n_ctx 4096, one sequence) and, per recurrent layer, f32 rows of
// n_embd_r + n_embd_s values (llama-hparams.cpp). Jamba (Mamba-1, n_group 0): n_embd_r =
// 3 · 8192 = 24,576, n_embd_s = 16 · 8192 = 131,072 → 28 × 155,648 × 4 B = 17,432,576 B,
// plus 4 × 4096 × 4,096 B = 67,108,864 B. Kimi (its KDA branch): n_embd_r = 3 · 3 · 4096 =
// 36,864, n_embd_s = 128 · 128 · 32 = 524,288 → 20 × 561,152 × 4 B = 44,892,160 B, plus the
// MLA latent as K only: 7 × 4096 × 576 · 2 B = 33,030,144 B.
TEST(LinearHybridPlanTest, LlamaCppSizesJambaAndKimiStates) {
  Plan jamba = PlanBundled("jamba-1.5-mini", With(Policy::kLlamaCpp), {4096});
  EXPECT_EQ(jamba.rows[0].state_bytes, 17'432'576);
  EXPECT_EQ(jamba.rows[0].reserved_bytes, 17'432'576 + 67'108'864);
  Plan kimi = PlanBundled("kimi-linear-48b-a3b-instruct", With(Policy::kLlamaCpp), {4096});
  EXPECT_EQ(kimi.rows[0].state_bytes, 44'892'160);
  EXPECT_EQ(kimi.rows[0].reserved_bytes, 44'892'160 + 33'030'144);
}

// llama.cpp serves MiniMax-M1 as LLM_ARCH_MINIMAX_01 (PR #27018) in hybrid memory. The 10
// softmax layers (7, 15, ..., 79) hold f16 K/V cells: 2 · 8 heads · 128 · 2 B = 4,096 B per
// cell and layer, 10 × 4096 × 4,096 B = 167,772,160 B at 4K. Each of the 70 lightning layers
// keeps one f32 row per sequence of n_embd_s = 128 · 128 · 64 = 1,048,576 values (n_embd_r =
// 0): 70 × 4,194,304 B = 293,601,280 B = 280 MiB at every length (kvpage: 140 MiB in bf16).
// 4K: 461,373,440 B = 440 MiB; 32K: 1,280 + 280 = 1,560 MiB; 128K: 5,120 + 280 = 5,400 MiB.
TEST(LinearHybridPlanTest, LlamaCppSizesMiniMaxLightningState) {
  Plan plan = PlanBundled("minimax-m1", With(Policy::kLlamaCpp), {4096, 32768, 131072});
  for (const PlanRow& row : plan.rows) {
    EXPECT_TRUE(row.refusal.empty()) << row.refusal;
    EXPECT_EQ(row.state_bytes, 293'601'280);
  }
  EXPECT_EQ(plan.rows[0].reserved_bytes, 167'772'160 + 293'601'280);
  EXPECT_EQ(plan.rows[0].reserved_bytes, 440 * kMiB);
  EXPECT_EQ(plan.rows[1].reserved_bytes, 1560 * kMiB);
  EXPECT_EQ(plan.rows[2].reserved_bytes, 5400 * kMiB);
}

// --parallel 4 at 32K: 4 streams of pad256(32768 / 4) = 8,192 cells keep the K/V at
// 1,280 MiB; the state is one row per sequence, 4 × 280 MiB. Total 2,400 MiB.
// A 1 GiB budget at 4K: k requests cost k × 440 MiB (-c 4096·k --parallel k), so 2 fit.
TEST(LinearHybridPlanTest, LlamaCppMiniMaxStateGrowsWithSequences) {
  PlanOptions four = With(Policy::kLlamaCpp);
  four.parallel = 4;
  Plan plan = PlanBundled("minimax-m1", four, {32768});
  EXPECT_EQ(plan.rows[0].state_bytes, 4 * int64_t{293'601'280});
  EXPECT_EQ(plan.rows[0].reserved_bytes, 2400 * kMiB);
  Plan budgeted = PlanBundled("minimax-m1", With(Policy::kLlamaCpp), {4096}, 1024 * kMiB);
  EXPECT_EQ(budgeted.rows[0].max_concurrency, 2);
}

// llama.cpp's loader puts MiniMax softmax attention in every 8th layer (minimax-01.cpp), not
// where attn_type_list says: a config with softmax in layer 3 would not load, and says so.
TEST(LinearHybridPlanTest, LlamaCppRefusesOtherMiniMaxLayouts) {
  auto spec = ParseModelSpec(R"({"model_type": "minimax_m1", "num_hidden_layers": 8,
      "hidden_size": 64, "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 8,
      "vocab_size": 1024, "max_position_embeddings": 4096, "intermediate_size": 128,
      "torch_dtype": "bfloat16", "attn_type_list": [0, 0, 0, 1, 0, 0, 0, 1],
      "num_local_experts": 2, "num_experts_per_tok": 1})",
                             "tiny", "tiny.json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto plan = MakePlan(*spec, With(Policy::kLlamaCpp), {4096}, 100 * kMiB);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const PlanRow& row = plan->rows[0];
  EXPECT_THAT(row.refusal, HasSubstr("attn_type_list makes layer 3 softmax"));
  EXPECT_EQ(row.reserved_bytes, 0);
  EXPECT_EQ(row.max_concurrency, 0);
  testing::ExpectRowInvariants(row);
  EXPECT_THAT(PlanToTable(*plan), HasSubstr("llama.cpp would not start at 4K"));
}

}  // namespace
}  // namespace kvpage
