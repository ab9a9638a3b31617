// The vllm policy's estimate of vLLM's runtime memory (kvpage/vllm_runtime_memory.h), term by
// term by hand from config.json. Published vLLM 0.19 figures on an H100 (llm-d-planner,
// accuracy/results/v0.19.0; docs/capacity_planning.md §1.1) are quoted beside each model.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "kvpage/catalog.h"
#include "kvpage/planner.h"
#include "kvpage/tensor_parallel.h"
#include "kvpage/vllm_runtime_memory.h"

namespace kvpage {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

PlanOptions Vllm() {
  PlanOptions o;
  o.policy = Policy::kVllm;
  return o;
}

VllmRuntimeMemory Estimate(const char* name, const PlanOptions& options) {
  auto model = LoadModel(name);
  EXPECT_TRUE(model.ok()) << model.status();
  auto shard = ShardForTensorParallel(*model, options.tp);
  EXPECT_TRUE(shard.ok()) << shard.status();
  auto m = EstimateVllmRuntimeMemory(*shard, options);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? *m : VllmRuntimeMemory{};
}

// CUDA graphs: ceil(0.34 GiB + 18 MiB × layers); non-torch 0.25 GiB on one GPU.
TEST(VllmRuntimeMemoryTest, Llama31_8bAtVllmServeDefaults) {
  // 8,192 tokens over min(8192, 1024) = 1,024 requests. Sampler: (2 + 12) B × 1,024 × 128,256
  // = 1,838,678,016 B, plus 2.5 × 2 B × 8,192 × 4,096 = 167,772,160 B of hidden states:
  // 2,006,450,176 B (1.87 GiB; published 1.89). Forward: 4 × 2 B × 8,192 × 14,336 =
  // 939,524,096 B, less. Graphs: 365,072,220.16 + 32 × 18,874,368 → 969,051,997 B (0.90 GiB;
  // published 0.84 estimated, 0.91 captured). Non-torch 268,435,456 B (published 0.25 GiB).
  const VllmRuntimeMemory m = Estimate("llama-3.1-8b", Vllm());
  EXPECT_EQ(m.activation_bytes, 2006450176);
  EXPECT_EQ(m.cuda_graph_bytes, 969051997);
  EXPECT_EQ(m.non_torch_bytes, 268435456);
  EXPECT_EQ(m.total(), 3243937629);
}

TEST(VllmRuntimeMemoryTest, FewRequestsLeaveTheForwardPassThePeak) {
  // --max-num-seqs 16: the sampler holds 14 × 16 × 128,256 + 167,772,160 = 196,501,504 B, under
  // the forward pass's 939,524,096 B.
  PlanOptions o = Vllm();
  o.max_num_seqs = 16;
  EXPECT_EQ(Estimate("llama-3.1-8b", o).activation_bytes, 939524096);
  // 2,048 tokens and 256 requests (vLLM's `vllm serve` default under 70 GiB and on an A100),
  // Qwen3-8B: 14 × 256 × 151,936 + 2.5 × 2 × 2,048 × 4,096 = 544,538,624 + 41,943,040.
  o.max_num_batched_tokens = 2048;
  o.max_num_seqs = 256;
  EXPECT_EQ(Estimate("qwen3-8b", o).activation_bytes, 586481664);
}

TEST(VllmRuntimeMemoryTest, MoeAddsTheFusedExpertWorkspace) {
  // DeepSeek-V2-Lite (6 of 64 experts of width 1,408, hidden 2,048, vocab 102,400, 27 layers):
  // sampler 14 × 1,024 × 102,400 + 2.5 × 2 × 8,192 × 2,048 = 1,551,892,480 B, plus the MoE
  // caches 8,192 × 6 × (3 × 1,408 + 2,048) × 2 B = 616,562,688 B: 2,168,455,168 B (2.02 GiB;
  // published 1.93). The forward pass over max(10,944, 6 × 1,408) columns is smaller.
  const VllmRuntimeMemory m = Estimate("deepseek-v2-lite", Vllm());
  EXPECT_EQ(m.activation_bytes, 2168455168);
  EXPECT_EQ(m.cuda_graph_bytes, 874680157);  // 365,072,220.16 + 27 × 18,874,368
}

TEST(VllmRuntimeMemoryTest, TensorParallelAddsNonTorchBuffersAndEagerDropsGraphs) {
  // Llama 3.1 70B at tp 2: the sampler sees the whole vocabulary: 14 × 1,024 × 128,256 +
  // 2.5 × 2 × 8,192 × 8,192 = 2,174,222,336 B (published for 3.3 70B: 1.96 GiB); the MLP is
  // split (4 × 2 × 8,192 × 28,672 / 2 = 939,524,096 B). Non-torch 2.1 GiB per GPU (published
  // 2.10); graphs 365,072,220.16 + 80 × 18,874,368 → 1,875,021,661 B (published 1.79).
  PlanOptions o = Vllm();
  o.tp = 2;
  const VllmRuntimeMemory m = Estimate("llama-3.1-70b", o);
  EXPECT_EQ(m.activation_bytes, 2174222336);
  EXPECT_EQ(m.cuda_graph_bytes, 1875021661);
  EXPECT_EQ(m.non_torch_bytes, 2254857830);
  o.enforce_eager = true;
  EXPECT_EQ(Estimate("llama-3.1-70b", o).cuda_graph_bytes, 0);
}

TEST(VllmRuntimeMemoryTest, BudgetSubtractsTheEstimateOrSaysItDoesNotFit) {
  auto model = LoadModel("llama-3.1-8b");
  ASSERT_TRUE(model.ok()) << model.status();
  // H100: floor(85,520,809,984 × 0.9) − 16,060,522,496 B of weights = 60,908,206,489 B, less
  // 3,243,937,629 B = 57,664,268,860 B (53.70 GiB).
  auto budget = VllmKvBudgetFromGpu(*model, 85520809984, 0.9, Vllm());
  ASSERT_TRUE(budget.ok()) << budget.status();
  EXPECT_EQ(*budget, 57664268860);
  // 19 GiB × 0.9 = 18,360,985,190 B: 2,300,462,694 B beside the weights, under the runtime's.
  auto small = VllmKvBudgetFromGpu(*model, 19 * kGiB, 0.9, Vllm());
  EXPECT_THAT(small.status().message(),
              ::testing::HasSubstr("vLLM's runtime memory for llama-3.1-8b (3243937629 bytes: "
                                   "activations, CUDA graphs, non-torch) leaves no KV cache in "
                                   "the 2300462694 bytes beside the weights"));
  PlanOptions bad = Vllm();
  bad.max_num_seqs = 0;
  EXPECT_THAT(EstimateVllmRuntimeMemory(*model, bad).status().message(),
              ::testing::HasSubstr("max_num_seqs must be positive, got 0"));
}

}  // namespace
}  // namespace kvpage
