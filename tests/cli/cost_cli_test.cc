// End-to-end tests of `kvpage cost`: runs the binary in a shell and checks exit status and output.
#include <sys/wait.h>

#include <cstdio>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "nlohmann/json.hpp"
#include "testing/run_kvpage.h"

namespace {

using ::testing::HasSubstr;

using kvpage::testing::CommandResult;
using kvpage::testing::RunKvpage;

const std::string kExample =
    "cost --model llama-3.1-8b --gpu a100 --batch 1024:512,2048:1,2048:1";

// The numbers come from the bundled A100 fit (sim/data/hardware/a100-sxm-80gb.json); they are
// the same as CalibratedCostModelTest.BundledA100ExampleBatch's and move with a refit.
TEST(CostCliTest, JsonTermsOfTheExampleBatch) {
  const CommandResult r = RunKvpage(kExample + " --format json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json j = nlohmann::json::parse(r.output, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.output;
  EXPECT_EQ(j["cost_model"], "calibrated");
  EXPECT_EQ(j["gpu"], "A100-SXM4-80GB");
  EXPECT_EQ(j["new_tokens"], 514);
  ASSERT_EQ(j["requests"].size(), 3u);
  EXPECT_EQ(j["requests"][0]["context"], 1024);
  EXPECT_EQ(j["requests"][0]["new_tokens"], 512);
  const auto& t = j["terms_s"];
  EXPECT_NEAR(t["linear"].get<double>(), 0.035122398, 1e-10);
  EXPECT_NEAR(t["lm_head"].get<double>(), 0.000658032495, 1e-12);
  EXPECT_NEAR(t["attention"].get<double>(), 0.00253758206, 1e-11);
  EXPECT_NEAR(t["small_ops"].get<double>(), 0.00288367879, 1e-11);
  EXPECT_EQ(t["all_reduce"].get<double>(), 0);
  EXPECT_NEAR(j["total_s"].get<double>(), 0.0412016914, 1e-10);
  EXPECT_NEAR(j["mfu"].get<double>(), 0.585304631, 1e-9);
}

TEST(CostCliTest, TextTable) {
  const CommandResult r = RunKvpage(kExample);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("llama-3.1-8b on A100-SXM4-80GB, tp 1: 3 requests, 514 new tokens"));
  EXPECT_THAT(r.output, HasSubstr("linear            35.1224   85.2%"));
  EXPECT_THAT(r.output, HasSubstr("total             41.2017"));
  EXPECT_THAT(r.output, HasSubstr("GEMM efficiency at 514 tokens 0.665; step MFU 0.585"));
}

TEST(CostCliTest, RooflineOnRequest) {
  const CommandResult r = RunKvpage(kExample + " --cost-model roofline --format json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json j = nlohmann::json::parse(r.output, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.output;
  EXPECT_EQ(j["cost_model"], "roofline");
  // max(compute, memory) + overhead with the file's mfu 0.38 and 126 + 32·32 + 3·4 us.
  EXPECT_NEAR(j["terms_s"]["overhead"].get<double>(), 0.001162, 1e-12);
  EXPECT_NEAR(j["total_s"].get<double>(), 0.0646239, 1e-6);
}

TEST(CostCliTest, TensorParallelAddsAllReduce) {
  const CommandResult r =
      RunKvpage("cost --model llama-3.1-70b --gpu h100 --tp 4 --batch 0:2048 --format json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json j = nlohmann::json::parse(r.output, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.output;
  EXPECT_NEAR(j["terms_s"]["all_reduce"].get<double>(), 0.02672, 1e-9);
}

// DeepSeek-V3.2 on 8 H200s, one decode step at context 131,072: the MLA attends 2,048 keys
// of the latent every GPU holds whole, the indexer reads all 131,072 keys on each GPU
// (calibrated tp-8 hbm_efficiency 0.8313):
//   attention max(61 · 4 · 128 · 576 · 2,048 / 8 / (989.4e12 · 0.35) = 13.299 us,
//                 2,049 rows · 61 · 576 · 2 B / (4.8e12 · 0.8313)      = 36.085 us)
//   indexer   61 · 132 · 131,072 / (4.8e12 · 0.8313)                = 264.493 us (byte-bound)
TEST(CostCliTest, SparseAttentionHasAnIndexerTerm) {
  const CommandResult r = RunKvpage(
      "cost --model deepseek-v3.2 --gpu h200 --tp 8 --batch 131071:1 --format json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json j = nlohmann::json::parse(r.output, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.output;
  EXPECT_NEAR(j["terms_s"]["attention"].get<double>(), 36.0848791e-6, 1e-12);
  EXPECT_NEAR(j["terms_s"]["indexer"].get<double>(), 264.4933e-6, 1e-10);
  // A model without sparse attention shows no indexer term.
  const CommandResult dense = RunKvpage(kExample + " --format json");
  ASSERT_EQ(dense.exit_code, 0) << dense.output;
  EXPECT_THAT(dense.output, ::testing::Not(HasSubstr("indexer")));
}

TEST(CostCliTest, BadInputNamesTheValue) {
  struct Case {
    std::string args, message;
  } cases[] = {
      {"cost --model llama-3.1-8b --gpu a100 --batch 1024", "got '1024'"},
      {"cost --model llama-3.1-8b --gpu a100 --batch 5:0", "got '0'"},
      {"cost --model llama-3.1-8b --gpu a100 --batch x:1", "got 'x'"},
      {"cost --model llama-3.1-8b --gpu a100", "--batch is required"},
      {"cost --model llama-3.1-8b --gpu a100 --batch 0:1 --tp 3", "tp 3 was not profiled"},
      {"cost --model llama-3.1-8b --gpu a100 --batch 0:1 --format xml", "got 'xml'"},
      {"cost --model llama-3.1-8b --gpu a100 --batch 0:1 --cost-model magic", "got 'magic'"},
      {"cost --model llama-3.1-8b --gpu tpu --batch 0:1", "unknown GPU 'tpu'"},
  };
  for (const Case& c : cases) {
    const CommandResult r = RunKvpage(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.output;
    EXPECT_THAT(r.output, HasSubstr(c.message)) << c.args;
  }
}

}  // namespace
