// The vllm policy's estimate of vLLM's runtime memory (kvpage/vllm_runtime_memory.h), term by
// term by hand from config.json. Published vLLM 0.19 figures on an H100 (llm-d-planner,
// accuracy/results/v0.19.0; docs/capacity_planning.md §1.1) are quoted beside each model.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

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

// The 20 published vLLM 0.19 start-up profiles the constants were fitted to (H100, `vllm serve`
// defaults: 8,192 tokens, 1,024 requests; llm-d-planner accuracy/results/v0.19.0/
// results_raw.csv, commit d3121e0), each model reduced to the fields the estimate reads (its
// config.json). Prints published against estimated GiB; the bounds are those
// docs/capacity_planning.md §1.1 quotes.
struct PublishedProfile {
  const char* model;
  int64_t vocab, hidden, mlp;    // vocab_size, hidden_size, intermediate_size
  int32_t topk = 0;              // experts a token runs (0: dense)
  int64_t expert_width = 0;      // moe_intermediate_size, else the expert's intermediate_size
  int32_t tp = 1, layers = 32;
  DType dtype = DType::kBF16;
  double activation, graphs;     // published GiB: peak activation, captured CUDA-graph pool
  // Where the doc's table lists the KV cache: published weights and KV cache GiB, and the
  // utilization (0.19 did not subtract graphs: KV = 79.19 GiB × utilization − weights −
  // activation − non-torch).
  double weights = 0, kv = 0, utilization = 0.95;
};

TEST(VllmRuntimeMemoryTest, PublishedProfiles) {
  const PublishedProfile profiles[] = {
      {"Llama-3.1-8B-Instruct", 128256, 4096, 14336, 0, 0, 1, 32, DType::kBF16, 1.89, 0.91,
       14.99, 58.11},
      {"Llama-3.1-8B-Instruct", 128256, 4096, 14336, 0, 0, 2, 32, DType::kBF16, 1.89, 0.76,
       7.51, 63.76},
      {"Llama-3.1-8B-Instruct", 128256, 4096, 14336, 0, 0, 4, 32, DType::kBF16, 1.89, 0.67},
      {"Llama-3.1-8B-Instruct fp32", 128256, 4096, 14336, 0, 0, 1, 32, DType::kF32, 2.21, 0.79},
      {"Qwen2.5-7B-Instruct", 152064, 3584, 18944, 0, 0, 1, 28, DType::kBF16, 2.21, 0.87},
      {"Qwen2.5-7B-Instruct", 152064, 3584, 18944, 0, 0, 4, 28, DType::kBF16, 2.21, 0.64},
      {"Qwen3-8B", 151936, 4096, 12288, 0, 0, 1, 36, DType::kBF16, 2.21, 0.96, 15.27, 57.50},
      {"Qwen3-30B-A3B", 151936, 2048, 6144, 8, 768, 1, 48, DType::kBF16, 2.68, 1.41},
      {"Qwen2.5-72B-Instruct", 152064, 8192, 29568, 0, 0, 2, 80, DType::kBF16, 2.29, 1.61},
      {"Llama-3.3-70B-Instruct-FP8", 128256, 8192, 28672, 0, 0, 2, 80, DType::kBF16, 1.96, 1.79},
      {"Llama-3.3-70B-Instruct-FP8", 128256, 8192, 28672, 0, 0, 4, 80, DType::kBF16, 1.97, 1.66,
       16.96, 54.09},
      {"gpt-oss-20b", 201088, 2880, 2880, 4, 2880, 2, 24, DType::kBF16, 2.87, 1.55, 7.01, 59.32,
       0.9},
      {"phi-4", 100352, 5120, 17920, 0, 0, 1, 40, DType::kBF16, 1.52, 1.07},
      {"Mistral-Small-3.1-24B", 131072, 5120, 32768, 0, 0, 1, 40, DType::kBF16, 2.03, 1.06},
      {"gemma-2-9b-it", 256000, 3584, 14336, 0, 0, 1, 42, DType::kBF16, 3.65, 1.09},
      {"gemma-2-27b-it", 256000, 4608, 36864, 0, 0, 1, 46, DType::kBF16, 3.66, 1.23},
      {"CodeLlama-7b-hf", 32016, 4096, 11008, 0, 0, 1, 32, DType::kBF16, 0.77, 0.89},
      {"granite-3.1-8b-instruct", 49155, 4096, 12800, 0, 0, 1, 40, DType::kBF16, 0.85, 0.98},
      {"DeepSeek-V2-Lite-Chat", 102400, 2048, 10944, 6, 1408, 1, 27, DType::kBF16, 1.93, 1.57,
       29.43, 43.61},
      {"Mixtral-8x7B-Instruct", 32000, 4096, 14336, 2, 14336, 2, 32, DType::kBF16, 1.21, 0.93},
  };
  double worst = 0, worst_dense_graph_tp1 = 0, worst_kv = 0;
  int within_5 = 0;
  for (const PublishedProfile& p : profiles) {
    ModelSpec m;
    m.name = p.model;
    m.dtype = p.dtype;
    m.vocab_size = p.vocab;
    m.hidden_size = static_cast<int32_t>(p.hidden);
    m.intermediate_size = p.mlp;
    m.experts_per_token = p.topk;
    m.moe_intermediate_size = p.expert_width;
    m.layers.resize(p.layers);
    PlanOptions o = Vllm();
    o.tp = p.tp;
    auto est = EstimateVllmRuntimeMemory(m, o);
    ASSERT_TRUE(est.ok()) << est.status();
    const double activation = static_cast<double>(est->activation_bytes) / kGiB;
    const double graphs = static_cast<double>(est->cuda_graph_bytes) / kGiB;
    const double error = (activation - p.activation) / p.activation;
    std::printf("%-28s tp %d  activation %.2f / %.2f (%+.1f%%)  graphs %.2f / %.2f\n", p.model,
                p.tp, p.activation, activation, 100 * error, p.graphs, graphs);
    worst = std::max(worst, std::abs(error));
    within_5 += std::abs(error) <= 0.05;
    if (p.kv > 0) {
      const double kv = 79.19 * p.utilization - p.weights - activation -
                        static_cast<double>(est->non_torch_bytes) / kGiB;
      std::printf("%-28s tp %d  KV cache %.2f / %.2f\n", p.model, p.tp, p.kv, kv);
      worst_kv = std::max(worst_kv, std::abs(kv - p.kv) / p.kv);
    }
    if (p.topk == 0 && p.tp == 1) {
      worst_dense_graph_tp1 = std::max(worst_dense_graph_tp1, std::abs(graphs - p.graphs));
    }
  }
  EXPECT_LT(worst, 0.13);
  EXPECT_EQ(within_5, 17);
  EXPECT_LT(worst_dense_graph_tp1, 0.12);
  EXPECT_LT(worst_kv, 0.007);
}

// Held out of the fit: a published vLLM 0.31 log (Model Runner V2, A100 80GB, Llama-3.1-8B,
// `vllm serve` defaults there: 2,048 tokens, 256 requests, utilization 0.92) printed 1.44 GiB
// of peak activation plus graph estimate and 56.21 GiB of KV cache out of 72.91 GiB requested.
TEST(VllmRuntimeMemoryTest, HeldOutVllm031OnAnA100) {
  PlanOptions o = Vllm();
  o.max_num_batched_tokens = 2048;
  o.max_num_seqs = 256;
  auto model = LoadModel("llama-3.1-8b");
  ASSERT_TRUE(model.ok()) << model.status();
  auto m = EstimateVllmRuntimeMemory(*model, o);
  ASSERT_TRUE(m.ok()) << m.status();
  // 14 × 256 × 128,256 + 2.5 × 2 × 2,048 × 4,096 = 501,612,544 B; graphs 969,051,997 B.
  const double printed = static_cast<double>(m->activation_bytes + m->cuda_graph_bytes) / kGiB;
  EXPECT_NEAR(printed, 1.37, 0.005);
  // 72.91 − 16,060,522,496 B of weights − 0.25 GiB non-torch − 1.37 GiB.
  const double kv = 72.91 - static_cast<double>(model->WeightBytes() + m->total()) / kGiB;
  EXPECT_NEAR(kv, 56.33, 0.005);
}

}  // namespace
}  // namespace kvpage
