// MakePlan's contract: validation, dtype resolution, budgets, invariants on every model.
#include <gtest/gtest.h>

#include "kvpage/tensor_parallel.h"
#include "testing/plan_checks.h"

namespace kvpage {
namespace {

using testing::kGiB;
using testing::kMiB;

TEST(PlannerTest, ParsesPolicyNames) {
  EXPECT_EQ(*ParsePolicy("kvpage"), Policy::kKvpage);
  EXPECT_EQ(*ParsePolicy("VLLM"), Policy::kVllm);
  EXPECT_EQ(*ParsePolicy("llama.cpp"), Policy::kLlamaCpp);
  auto bad = ParsePolicy("sglang");
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status()));
  EXPECT_NE(bad.status().message().find("sglang"), absl::string_view::npos);
  for (Policy p : {Policy::kKvpage, Policy::kVllm, Policy::kLlamaCpp}) {
    EXPECT_EQ(*ParsePolicy(PolicyName(p)), p);
  }
}

TEST(PlannerTest, DefaultKvDtypeIsTheModelsExceptForLlamaCpp) {
  PlanOptions o;
  EXPECT_EQ(o.ResolvedKvDtype(DType::kBF16), DType::kBF16);
  o.policy = Policy::kLlamaCpp;
  EXPECT_EQ(o.ResolvedKvDtype(DType::kBF16), DType::kF16);
  o.kv_cache_dtype = DType::kQ8_0;
  EXPECT_EQ(o.ResolvedKvDtype(DType::kBF16), DType::kQ8_0);
}

TEST(PlannerTest, RejectsBadOptionsAndContextsNamingTheValue) {
  auto model = LoadModel("qwen3-8b");
  ASSERT_TRUE(model.ok());
  const std::vector<int64_t> ok_ctx = {4096};
  struct Case {
    PlanOptions options;
    std::vector<int64_t> contexts;
    std::optional<int64_t> budget;
    const char* needle;
  };
  PlanOptions zero_block;
  zero_block.block_size = 0;
  PlanOptions neg_parallel;
  neg_parallel.parallel = -3;
  PlanOptions zero_batched;
  zero_batched.max_num_batched_tokens = 0;
  PlanOptions vllm_bs7;  // vLLM's engine takes 1, 8, 16, 32, 64 or 128 only
  vllm_bs7.policy = Policy::kVllm;
  vllm_bs7.block_size = 7;
  const std::vector<Case> cases = {
      {zero_block, ok_ctx, std::nullopt, "block_size must be positive, got 0"},
      {neg_parallel, ok_ctx, std::nullopt, "parallel must be positive, got -3"},
      {zero_batched, ok_ctx, std::nullopt, "max_num_batched_tokens"},
      {vllm_bs7, ok_ctx, std::nullopt,
       "block_size 7 is not one vLLM accepts (1, 8, 16, 32, 64 or 128)"},
      {PlanOptions{}, {0}, std::nullopt, "got 0"},
      {PlanOptions{}, {-5}, std::nullopt, "got -5"},
      {PlanOptions{}, {}, std::nullopt, "no context"},
      {PlanOptions{}, ok_ctx, -1, "got -1"},
  };
  for (const Case& c : cases) {
    auto plan = MakePlan(*model, c.options, c.contexts, c.budget);
    EXPECT_TRUE(absl::IsInvalidArgument(plan.status())) << c.needle;
    EXPECT_NE(plan.status().message().find(c.needle), absl::string_view::npos)
        << plan.status().message();
  }
}

TEST(PlannerTest, EveryBundledModelPlansUnderEveryPolicy) {
  for (const std::string& name : BundledModelNames()) {
    for (Policy policy : {Policy::kKvpage, Policy::kVllm, Policy::kLlamaCpp}) {
      Plan plan = testing::PlanBundled(name.c_str(), testing::WithPolicy(policy),
                                       {1, 1000, 4096, 32768, 131072}, 40 * kGiB);
      ASSERT_EQ(plan.rows.size(), 5u) << name;
      for (size_t i = 1; i < plan.rows.size(); ++i) {
        // More context never costs less, and never fits more requests.
        EXPECT_GE(plan.rows[i].reserved_bytes, plan.rows[i - 1].reserved_bytes) << name;
        EXPECT_LE(*plan.rows[i].max_concurrency, *plan.rows[i - 1].max_concurrency) << name;
      }
    }
  }
}

TEST(PlannerTest, GpuBudgetIsUtilizationMinusWeights) {
  auto model = LoadModel("llama-3.1-8b");
  ASSERT_TRUE(model.ok());
  EXPECT_EQ(model->WeightBytes(), int64_t{2} * 8030261248);
  auto budget = KvBudgetFromGpu(*model, 80 * kGiB, 0.5);
  ASSERT_TRUE(budget.ok());
  EXPECT_EQ(*budget, 40 * kGiB - int64_t{2} * 8030261248);
  EXPECT_TRUE(absl::IsInvalidArgument(KvBudgetFromGpu(*model, 80 * kGiB, 0.0).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(KvBudgetFromGpu(*model, 80 * kGiB, 1.5).status()));
  auto too_small = KvBudgetFromGpu(*model, 16 * kGiB, 0.9);
  EXPECT_TRUE(absl::IsInvalidArgument(too_small.status()));
  EXPECT_NE(too_small.status().message().find("llama-3.1-8b"), absl::string_view::npos);
}

// --tp plans one GPU's share: Llama-3.1-70B's 8 KV heads split 4/2/1 ways, then stay at one
// (replicated) at tp 16; every policy reserves 4096 tokens x 80 layers x K+V x heads x 128 x 2 B.
TEST(PlannerTest, TensorParallelPlansOneGpusShare) {
  auto model = LoadModel("llama-3.1-70b");
  ASSERT_TRUE(model.ok());
  const int64_t h100 = 85'520'809'984;
  const struct {
    int32_t tp;
    int64_t reserved;     // one 4K request, per GPU
    int64_t concurrency;  // on one H100 at 0.9: (76,968,728,985 - weights / tp) / reserved
  } cases[] = {{2, 671'088'640, 9},
               {4, 335'544'320, 124},
               {8, 167'772'160, 353},
               {16, 167'772'160, 406}};
  for (Policy policy : {Policy::kKvpage, Policy::kVllm, Policy::kLlamaCpp}) {
    for (const auto& c : cases) {
      SCOPED_TRACE(::testing::Message() << PolicyName(policy) << " tp " << c.tp);
      PlanOptions o = testing::WithPolicy(policy);
      o.tp = c.tp;
      auto shard = ShardForTensorParallel(*model, c.tp);
      ASSERT_TRUE(shard.ok()) << shard.status();
      auto budget = KvBudgetFromGpu(*shard, h100, 0.9);
      ASSERT_TRUE(budget.ok()) << budget.status();
      EXPECT_EQ(*budget, 76'968'728'985 - (model->WeightBytes() + c.tp - 1) / c.tp);
      auto plan = MakePlan(*model, o, {4096}, *budget);
      ASSERT_TRUE(plan.ok()) << plan.status();
      EXPECT_EQ(plan->tp, c.tp);
      EXPECT_EQ(plan->rows[0].reserved_bytes, c.reserved);
      EXPECT_EQ(plan->rows[0].max_concurrency, c.concurrency);
    }
  }
}

TEST(PlannerTest, TensorParallelErrorsNameTheDegree) {
  auto model = LoadModel("qwen3-8b");
  ASSERT_TRUE(model.ok());
  PlanOptions o;
  o.tp = 12;  // 32 query heads
  auto plan = MakePlan(*model, o, {4096});
  EXPECT_TRUE(absl::IsInvalidArgument(plan.status()));
  EXPECT_EQ(plan.status().message(), "tp 12 does not divide qwen3-8b's attention heads (32)");
  o.tp = 0;
  plan = MakePlan(*model, o, {4096});
  EXPECT_TRUE(absl::IsInvalidArgument(plan.status()));
  EXPECT_EQ(plan.status().message(), "tp must be in [1, 1024], got 0");
}

TEST(PlannerTest, PlanCarriesModelPolicyDtypeAndBudget) {
  Plan plan = testing::PlanBundled("qwen3-8b", testing::WithPolicy(Policy::kVllm), {4096},
                                   8 * kGiB);
  EXPECT_EQ(plan.model, "qwen3-8b");
  EXPECT_EQ(plan.policy, Policy::kVllm);
  EXPECT_EQ(plan.kv_cache_dtype, DType::kBF16);
  EXPECT_EQ(plan.kv_budget_bytes, 8 * kGiB);
  EXPECT_EQ(plan.rows[0].context, 4096);
  EXPECT_EQ(plan.rows[0].reserved_bytes, 576 * kMiB);
}

}  // namespace
}  // namespace kvpage

namespace kvpage {
namespace {

TEST(PlannerTest, QuantizedCheckpointsCountTheirPublishedWeightBytes) {
  // gpt-oss-20b: 24 layers × 32 experts × 3 × 2880² = 19,110,297,600 routed-expert weights in
  // MXFP4 (17 bytes per 32), the other 1,804,458,048 parameters in bf16 → 13.76 GB (the
  // published checkpoint is 13.8 GB).
  auto oss = LoadModel("gpt-oss-20b");
  ASSERT_TRUE(oss.ok());
  EXPECT_EQ(oss->num_params, 20'914'755'648);
  EXPECT_EQ(oss->WeightBytes(), int64_t{19'110'297'600} * 17 / 32 + int64_t{1'804'458'048} * 2);
  // A bf16 checkpoint costs two bytes per parameter.
  auto qwen = LoadModel("qwen3-8b");
  ASSERT_TRUE(qwen.ok());
  EXPECT_EQ(qwen->WeightBytes(), 2 * qwen->num_params);
}

TEST(PlannerTest, GptqWeightsCostTheirBitsPlusGroupScales) {
  // 2 layers, hidden 64, MLP 128: linear = 2 × (4·64·64 + 3·64·128 + 2·64) = 82,176 parameters
  // (attention, MLP, norms); embeddings 100 × 64 tied = 6,400 in bf16.
  const char* config = R"({"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
      "vocab_size": 100, "max_position_embeddings": 128, "intermediate_size": 128,
      "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128}})";
  auto spec = ParseModelSpec(config, "tiny", "tiny.json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->num_params, 6'400 + 82'176 + 64);
  const int64_t linear = 82'176 + 64;  // the final norm is counted with the linear weights
  EXPECT_EQ(spec->WeightBytes(), 6'400 * 2 + linear / 2 + linear / 128 * 2);
}

TEST(PlannerTest, UnknownQuantizationMethodIsAnError) {
  const char* config = R"({"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
      "vocab_size": 100, "max_position_embeddings": 128, "intermediate_size": 128,
      "quantization_config": {"quant_method": "bitsandbytes"}})";
  auto spec = ParseModelSpec(config, "tiny", "tiny.json");
  EXPECT_TRUE(absl::IsInvalidArgument(spec.status()));
  EXPECT_NE(spec.status().message().find("bitsandbytes"), absl::string_view::npos);
  EXPECT_NE(spec.status().message().find("tiny.json"), absl::string_view::npos);
}

}  // namespace
}  // namespace kvpage
