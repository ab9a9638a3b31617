// Tests of kvpage/plan_format.h: the JSON contract, CSV and text tables.
#include "kvpage/plan_format.h"

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_split.h"
#include "absl/types/span.h"
#include "kvpage/catalog.h"
#include "kvpage/planner.h"
#include "nlohmann/json.hpp"

namespace kvpage {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using json = nlohmann::json;

constexpr int64_t kGiB = int64_t{1} << 30;

GroupReservation Group(LayerKind kind, int32_t layers, int32_t padding, int32_t block_size,
                       int64_t blocks, int64_t bytes) {
  GroupReservation g;
  g.kind = kind;
  g.num_layers = layers;
  g.padding_layers = padding;
  g.block_size = block_size;
  g.blocks = blocks;
  g.reserved_bytes = bytes;
  return g;
}

// A hand-made hybrid plan (not computed by any policy): two contexts, no budget.
//   32768 tokens: 1 GiB reserved = 1,069,547,520 KV + 4,194,304 state.
//   1000 tokens:  1,500 bytes, 1.5 bytes per token.
Plan HybridPlan() {
  Plan plan;
  plan.model = "tiny-hybrid";
  plan.policy = Policy::kVllm;
  plan.kv_cache_dtype = DType::kFP8;
  PlanRow big;
  big.context = 32768;
  big.reserved_bytes = kGiB;
  big.kv_bytes = 1'069'547'520;
  big.state_bytes = 4'194'304;
  big.shared_bytes = 8'388'608;
  big.snapshot_bytes = 4'194'304;
  big.bytes_per_token = 32768.0;
  big.groups = {Group(LayerKind::kLinearAttention, 24, 0, 0, 1, 4'194'304),
                Group(LayerKind::kFullAttention, 8, 16, 16, 2048, 1'069'547'520)};
  PlanRow small;
  small.context = 1000;
  small.reserved_bytes = 1500;
  small.kv_bytes = 1500;
  small.bytes_per_token = 1.5;
  small.groups = {Group(LayerKind::kSlidingWindow, 2, 0, 1, 750, 1500)};
  plan.rows = {big, small};
  return plan;
}

// HybridPlan with a 10 GiB budget: 9 requests of 32K fit, 7,158,278 of 1000 tokens.
Plan BudgetedPlan() {
  Plan plan = HybridPlan();
  plan.kv_budget_bytes = 10 * kGiB;
  plan.rows[0].max_concurrency = 9;
  plan.rows[1].max_concurrency = 7'158'278;
  return plan;
}

std::set<std::string> Keys(const json& object) {
  std::set<std::string> keys;
  for (const auto& [key, value] : object.items()) keys.insert(key);
  return keys;
}

json ParseJson(const std::string& text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(j.is_discarded()) << text;
  return j;
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines = absl::StrSplit(text, '\n');
  if (!lines.empty() && lines.back().empty()) lines.pop_back();
  return lines;
}

const std::set<std::string> kPlanKeys = {"model", "policy", "kv_cache_dtype", "kv_budget_bytes",
                                         "rows"};
const std::set<std::string> kRowKeys = {"context",        "reserved_bytes",  "kv_bytes",
                                        "state_bytes",    "shared_bytes",    "snapshot_bytes",
                                        "bytes_per_token", "max_concurrency", "groups"};
const std::set<std::string> kGroupKeys = {"kind",       "num_layers", "padding_layers",
                                          "block_size", "blocks",     "reserved_bytes"};

// ---- JSON -------------------------------------------------------------------------------

TEST(PlansToJsonTest, OnePlanIsAnObjectWithTheContractKeys) {
  const Plan plan = HybridPlan();
  const json j = ParseJson(PlansToJson(absl::MakeConstSpan(&plan, 1)));
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(Keys(j), kPlanKeys);
  EXPECT_EQ(j["model"], "tiny-hybrid");
  EXPECT_EQ(j["policy"], "vllm");
  EXPECT_EQ(j["kv_cache_dtype"], "fp8");
  EXPECT_TRUE(j["kv_budget_bytes"].is_null());
  ASSERT_TRUE(j["rows"].is_array());
  ASSERT_EQ(j["rows"].size(), 2u);
  for (const json& row : j["rows"]) {
    // A vllm plan says whether vLLM would start (these rows would: no refusal, no fix).
    std::set<std::string> keys = kRowKeys;
    keys.insert("vllm_starts");
    EXPECT_EQ(Keys(row), keys);
    EXPECT_EQ(row["vllm_starts"], true);
    EXPECT_TRUE(row["max_concurrency"].is_null());
    for (const json& group : row["groups"]) EXPECT_EQ(Keys(group), kGroupKeys);
  }
}

TEST(PlansToJsonTest, RowAndGroupValues) {
  const Plan plan = HybridPlan();
  const json j = ParseJson(PlansToJson(absl::MakeConstSpan(&plan, 1)));
  const json& row = j["rows"][0];
  EXPECT_EQ(row["context"], 32768);
  EXPECT_EQ(row["reserved_bytes"], 1'073'741'824);
  EXPECT_EQ(row["kv_bytes"], 1'069'547'520);
  EXPECT_EQ(row["state_bytes"], 4'194'304);
  EXPECT_EQ(row["shared_bytes"], 8'388'608);
  EXPECT_EQ(row["snapshot_bytes"], 4'194'304);
  EXPECT_TRUE(row["bytes_per_token"].is_number());
  EXPECT_EQ(row["bytes_per_token"].get<double>(), 32768.0);
  ASSERT_EQ(row["groups"].size(), 2u);
  EXPECT_EQ(row["groups"][0],
            json({{"kind", "linear_attention"}, {"num_layers", 24}, {"padding_layers", 0},
                  {"block_size", 0}, {"blocks", 1}, {"reserved_bytes", 4'194'304}}));
  EXPECT_EQ(row["groups"][1],
            json({{"kind", "full_attention"}, {"num_layers", 8}, {"padding_layers", 16},
                  {"block_size", 16}, {"blocks", 2048}, {"reserved_bytes", 1'069'547'520}}));
  const json& small = j["rows"][1];
  EXPECT_EQ(small["context"], 1000);
  EXPECT_EQ(small["bytes_per_token"].get<double>(), 1.5);
  ASSERT_EQ(small["groups"].size(), 1u);
  EXPECT_EQ(small["groups"][0]["kind"], "sliding_window");
}

TEST(PlansToJsonTest, BudgetAndMaxConcurrencyAreIntegers) {
  const Plan plan = BudgetedPlan();
  const json j = ParseJson(PlansToJson(absl::MakeConstSpan(&plan, 1)));
  ASSERT_TRUE(j["kv_budget_bytes"].is_number_integer());
  EXPECT_EQ(j["kv_budget_bytes"].get<int64_t>(), 10'737'418'240);
  ASSERT_TRUE(j["rows"][0]["max_concurrency"].is_number_integer());
  EXPECT_EQ(j["rows"][0]["max_concurrency"].get<int64_t>(), 9);
  EXPECT_EQ(j["rows"][1]["max_concurrency"].get<int64_t>(), 7'158'278);
}

TEST(PlansToJsonTest, MlaKindName) {
  Plan plan = HybridPlan();
  plan.rows[1].groups[0].kind = LayerKind::kMla;
  const json j = ParseJson(PlansToJson(absl::MakeConstSpan(&plan, 1)));
  EXPECT_EQ(j["rows"][1]["groups"][0]["kind"], "mla");
}

TEST(PlansToJsonTest, TwoPlansAreWrappedInPlans) {
  Plan llama = HybridPlan();
  llama.policy = Policy::kLlamaCpp;
  llama.kv_cache_dtype = DType::kQ8_0;
  const std::vector<Plan> plans = {HybridPlan(), llama};
  const json j = ParseJson(PlansToJson(plans));
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(Keys(j), std::set<std::string>{"plans"});
  ASSERT_TRUE(j["plans"].is_array());
  ASSERT_EQ(j["plans"].size(), 2u);
  EXPECT_EQ(Keys(j["plans"][0]), kPlanKeys);
  EXPECT_EQ(j["plans"][0]["policy"], "vllm");
  EXPECT_EQ(j["plans"][1]["policy"], "llamacpp");
  EXPECT_EQ(j["plans"][1]["kv_cache_dtype"], "q8_0");
}

TEST(PlansToJsonTest, NoPlansIsAnEmptyPlansArray) {
  const json j = ParseJson(PlansToJson({}));
  EXPECT_EQ(j, json({{"plans", json::array()}}));
}

TEST(PlansToJsonTest, PlannedModelRoundTrips) {
  absl::StatusOr<ModelSpec> model = LoadModel("qwen3-8b");
  ASSERT_TRUE(model.ok()) << model.status();
  PlanOptions options;
  options.policy = Policy::kLlamaCpp;
  const std::vector<int64_t> contexts = {4096, 32768};
  absl::StatusOr<Plan> plan = MakePlan(*model, options, contexts);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const json j = ParseJson(PlansToJson(absl::MakeConstSpan(&*plan, 1)));
  EXPECT_EQ(j["model"], "qwen3-8b");
  EXPECT_EQ(j["kv_cache_dtype"], "f16");  // llama.cpp's -ctk/-ctv default
  ASSERT_EQ(j["rows"].size(), 2u);
  // 36 layers × 2 (K, V) × 8 heads × 128 × 2 B = 147,456 B per token.
  EXPECT_EQ(j["rows"][0]["reserved_bytes"], 603'979'776);    // 4,096 × 147,456
  EXPECT_EQ(j["rows"][1]["reserved_bytes"], 4'831'838'208);  // 32,768 × 147,456
  EXPECT_EQ(j["rows"][1]["bytes_per_token"].get<double>(), 147456.0);
}

// ---- CSV --------------------------------------------------------------------------------

constexpr char kCsvHeader[] =
    "model,policy,kv_cache_dtype,context,reserved_bytes,kv_bytes,state_bytes,shared_bytes,"
    "snapshot_bytes,bytes_per_token,max_concurrency,vllm_starts,vllm_refusal";

TEST(PlansToCsvTest, HeaderAndOneLinePerRow) {
  const Plan plan = HybridPlan();
  const std::vector<std::string> lines = Lines(PlansToCsv(absl::MakeConstSpan(&plan, 1)));
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0], kCsvHeader);
  EXPECT_EQ(lines[1],
            "tiny-hybrid,vllm,fp8,32768,1073741824,1069547520,4194304,8388608,4194304,"
            "32768.000,,true,");
  EXPECT_EQ(lines[2], "tiny-hybrid,vllm,fp8,1000,1500,1500,0,0,0,1.500,,true,");
}

TEST(PlansToCsvTest, MaxConcurrencyWhenBudgeted) {
  const Plan plan = BudgetedPlan();
  const std::vector<std::string> lines = Lines(PlansToCsv(absl::MakeConstSpan(&plan, 1)));
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_THAT(lines[1], ::testing::EndsWith(",32768.000,9,true,"));
  EXPECT_THAT(lines[2], ::testing::EndsWith(",1.500,7158278,true,"));
}

TEST(PlansToCsvTest, QuotesTheRefusalAndLeavesOtherPoliciesEmpty) {
  Plan plan = BudgetedPlan();
  plan.rows[0].refusal = R"(say "no", twice)";
  plan.rows[0].fixes = {"--max-model-len 16"};
  std::vector<std::string> lines = Lines(PlansToCsv(absl::MakeConstSpan(&plan, 1)));
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_THAT(lines[1], ::testing::EndsWith(R"(,9,false,"say ""no"", twice")"));
  plan.policy = Policy::kKvpage;
  lines = Lines(PlansToCsv(absl::MakeConstSpan(&plan, 1)));
  EXPECT_THAT(lines[1], ::testing::EndsWith(",32768.000,9,,"));
}

TEST(PlansToCsvTest, RowsOfSeveralPlans) {
  const std::vector<Plan> plans = {HybridPlan(), BudgetedPlan(), HybridPlan()};
  const std::vector<std::string> lines = Lines(PlansToCsv(plans));
  ASSERT_EQ(lines.size(), 1u + 3 * 2);
  EXPECT_EQ(lines[0], kCsvHeader);
  EXPECT_EQ(Lines(PlansToCsv({})), std::vector<std::string>{kCsvHeader});
}

// ---- Tables -----------------------------------------------------------------------------

TEST(PlanToTableTest, ShowsModelContextsAndMiB) {
  const Plan plan = HybridPlan();
  const std::string table = PlanToTable(plan);
  EXPECT_THAT(table, HasSubstr("tiny-hybrid"));
  EXPECT_THAT(table, HasSubstr("vllm"));
  EXPECT_THAT(table, HasSubstr("fp8"));
  EXPECT_THAT(table, HasSubstr("32K"));
  EXPECT_THAT(table, HasSubstr("1000"));      // not a multiple of 1024: printed in tokens
  EXPECT_THAT(table, HasSubstr("1024.000"));  // 1 GiB reserved, in MiB
  EXPECT_THAT(table, Not(HasSubstr("budget")));
  EXPECT_EQ(Lines(table).size(), 2u + 2);  // title, column heads, one line per row
}

TEST(PlanToTableTest, ShowsBudgetAndConcurrency) {
  const std::string table = PlanToTable(BudgetedPlan());
  EXPECT_THAT(table, HasSubstr("budget 10.00 GiB"));
  EXPECT_THAT(table, HasSubstr("7158278"));
}

// The same model and contexts under all three policies.
std::vector<Plan> Qwen3Plans(std::optional<int64_t> budget) {
  absl::StatusOr<ModelSpec> model = LoadModel("qwen3-8b");
  EXPECT_TRUE(model.ok()) << model.status();
  std::vector<Plan> plans;
  if (!model.ok()) return plans;
  const std::vector<int64_t> contexts = {4096, 32768};
  for (Policy policy : {Policy::kKvpage, Policy::kVllm, Policy::kLlamaCpp}) {
    PlanOptions options;
    options.policy = policy;
    absl::StatusOr<Plan> plan = MakePlan(*model, options, contexts, budget);
    EXPECT_TRUE(plan.ok()) << plan.status();
    if (plan.ok()) plans.push_back(*std::move(plan));
  }
  return plans;
}

TEST(CompareTableTest, OneLinePerContextOneColumnPerPolicy) {
  const std::vector<Plan> plans = Qwen3Plans(std::nullopt);
  ASSERT_EQ(plans.size(), 3u);
  const std::string table = CompareTable(plans);
  EXPECT_THAT(table, HasSubstr("qwen3-8b"));
  EXPECT_THAT(table, HasSubstr("kvpage MiB"));
  EXPECT_THAT(table, HasSubstr("vllm MiB"));
  EXPECT_THAT(table, HasSubstr("llamacpp MiB"));
  EXPECT_THAT(table, Not(HasSubstr("reqs")));
  const std::vector<std::string> lines = Lines(table);
  ASSERT_EQ(lines.size(), 2u + 2);
  EXPECT_THAT(lines[2], HasSubstr("4K"));
  EXPECT_THAT(lines[3], HasSubstr("32K"));
  // 32K × 147,456 B = 4,608 MiB for every policy on this all-full-attention model.
  EXPECT_THAT(lines[3], HasSubstr("4608.000"));
}

TEST(CompareTableTest, RequestColumnsWhenBudgeted) {
  const std::string table = CompareTable(Qwen3Plans(40 * kGiB));
  EXPECT_THAT(table, HasSubstr("budget 40.00 GiB"));
  EXPECT_THAT(table, HasSubstr("kvpage reqs"));
  EXPECT_THAT(table, HasSubstr("llamacpp reqs"));
  EXPECT_EQ(CompareTable({}), "");
}

}  // namespace
}  // namespace kvpage
