// MakePlan's contract: validation, dtype resolution, budgets, invariants on every model.
#include <gtest/gtest.h>

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
  const std::vector<Case> cases = {
      {zero_block, ok_ctx, std::nullopt, "block_size must be positive, got 0"},
      {neg_parallel, ok_ctx, std::nullopt, "parallel must be positive, got -3"},
      {zero_batched, ok_ctx, std::nullopt, "max_num_batched_tokens"},
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
