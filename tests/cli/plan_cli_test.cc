// End-to-end tests of the `kvpage` binary: runs it in a shell and checks exit status and output.
#include <sys/wait.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "nlohmann/json.hpp"
#include "testing/run_kvpage.h"

namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;

using kvpage::testing::CommandResult;
using kvpage::testing::RunKvpage;

// Runs a command that must succeed and print JSON; returns the parsed document.
json RunJson(const std::string& args) {
  const CommandResult r = RunKvpage(args);
  EXPECT_EQ(r.exit_code, 0) << args << "\n" << r.output;
  json j = json::parse(r.output, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(j.is_discarded()) << args << "\n" << r.output;
  return j;
}

// Expects `kvpage ARGS` to exit 2 with a message containing `bad_value`.
void ExpectUsageError(const std::string& args, const std::string& bad_value) {
  const CommandResult r = RunKvpage(args);
  EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.output;
  EXPECT_THAT(r.output, HasSubstr(bad_value)) << args;
}

std::string Quote(const std::string& s) { return "'" + s + "'"; }

constexpr char kQwen[] = "plan --model qwen3-8b --context 4K,32K,128K";

// ---- Successful runs --------------------------------------------------------------------

TEST(PlanCliTest, LlamaCppJsonReservations) {
  const json j = RunJson(std::string(kQwen) + " --policy llamacpp --format json");
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j["model"], "qwen3-8b");
  EXPECT_EQ(j["policy"], "llamacpp");
  EXPECT_EQ(j["kv_cache_dtype"], "f16");
  EXPECT_TRUE(j["kv_budget_bytes"].is_null());
  ASSERT_EQ(j["rows"].size(), 3u);
  // 36 layers × K+V × 8 kv heads × 128 × 2 B (f16) = 147,456 B per cell; contexts are
  // multiples of 256, so cells = context.
  const int64_t contexts[] = {4096, 32768, 131072};
  const int64_t reserved[] = {603'979'776, 4'831'838'208, 19'327'352'832};
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(j["rows"][i]["context"], contexts[i]);
    EXPECT_EQ(j["rows"][i]["reserved_bytes"], reserved[i]);
    EXPECT_EQ(j["rows"][i]["state_bytes"], 0);
    EXPECT_TRUE(j["rows"][i]["max_concurrency"].is_null());
  }
}

TEST(PlanCliTest, CompareJsonHasOnePlanPerPolicy) {
  const json j = RunJson(std::string(kQwen) + " --compare --format json");
  ASSERT_TRUE(j.contains("plans"));
  ASSERT_EQ(j["plans"].size(), 3u);
  EXPECT_EQ(j["plans"][0]["policy"], "kvpage");
  EXPECT_EQ(j["plans"][1]["policy"], "vllm");
  EXPECT_EQ(j["plans"][2]["policy"], "llamacpp");
  for (const json& plan : j["plans"]) EXPECT_EQ(plan["rows"].size(), 3u);
}

TEST(PlanCliTest, GpuBudgetFillsMaxConcurrency) {
  const json j = RunJson(std::string(kQwen) + " --policy kvpage --gpu h100 --format json");
  // H100: floor(85,520,809,984 × 0.9) = 76,968,728,985 − weights 8,190,735,360 × 2 B
  //       = 60,587,258,265 bytes of KV budget.
  ASSERT_TRUE(j["kv_budget_bytes"].is_number_integer());
  EXPECT_EQ(j["kv_budget_bytes"].get<int64_t>(), 60'587'258'265);
  ASSERT_EQ(j["rows"].size(), 3u);
  // budget / (context × 147,456 B): 100.3, 12.5, 3.1 requests.
  const int64_t want[] = {100, 12, 3};
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(j["rows"][i]["max_concurrency"].is_number_integer()) << i;
    EXPECT_EQ(j["rows"][i]["max_concurrency"].get<int64_t>(), want[i]) << i;
  }
}

TEST(PlanCliTest, Mi300xBudgetFromItsRocmSmiTotal) {
  const json j = RunJson(std::string(kQwen) + " --policy kvpage --gpu mi300x --format json");
  // MI300X: floor(206,141,652,992 × 0.9) = 185,527,487,692 − 16,381,470,720 B of weights.
  EXPECT_EQ(j["kv_budget_bytes"].get<int64_t>(), 169'146'016'972);
  // budget / (context × 147,456 B): 280.05, 35.0, 8.75 requests.
  const int64_t want[] = {280, 35, 8};
  ASSERT_EQ(j["rows"].size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(j["rows"][i]["max_concurrency"], want[i]) << i;
}

// A 70B model's 141 GB of weights on a 24 GB L4: the plan warns, with both sizes, and no
// request fits.
TEST(PlanCliTest, ModelLargerThanTheGpuSaysItDoesNotFit) {
  const CommandResult r = RunKvpage("plan --model llama-3.1-70b --context 4K --gpu l4");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("the weights of llama-3.1-70b (141107412992 bytes) do not fit "
                                  "in 21737609625 bytes (gpu memory 24152899584 x utilization "
                                  "0.9); KV budget is 0"));
  EXPECT_THAT(r.output, HasSubstr("budget 0.00 GiB"));
}

TEST(PlanCliTest, TensorParallelPlansOneGpuAndSaysSo) {
  // Qwen3-8B at tp 16: 8 KV heads, one per GPU (replicated twice): 36 x 2 x 128 x 2 B =
  // 18,432 B per token; budget 76,968,728,985 - ceil(16,381,470,720 / 16) = 75,944,887,065.
  const json j = RunJson("plan --model qwen3-8b --context 4K --gpu h100 --tp 16 --format json");
  EXPECT_EQ(j["tp"], 16);
  EXPECT_EQ(j["kv_budget_bytes"].get<int64_t>(), 75'944'887'065);
  EXPECT_EQ(j["rows"][0]["reserved_bytes"].get<int64_t>(), 4096 * 18'432);
  EXPECT_EQ(j["rows"][0]["max_concurrency"].get<int64_t>(), 1005);
  // tp 1 prints what it printed before --tp existed: no "tp" key.
  EXPECT_FALSE(RunJson("plan --model qwen3-8b --context 4K --format json").contains("tp"));
  const CommandResult table = RunKvpage("plan --model qwen3-8b --context 4K --tp 2");
  EXPECT_EQ(table.exit_code, 0) << table.output;
  EXPECT_THAT(table.output, HasSubstr("tp 2 (per GPU)"));
}

TEST(PlanCliTest, CompareWithGpuFillsEveryPlan) {
  const json j = RunJson(std::string(kQwen) + " --compare --gpu h100 --format json");
  ASSERT_EQ(j["plans"].size(), 3u);
  for (const json& plan : j["plans"]) {
    for (const json& row : plan["rows"]) EXPECT_TRUE(row["max_concurrency"].is_number_integer());
  }
}

TEST(PlanCliTest, CsvHasHeaderAndOneLinePerContext) {
  const CommandResult r = RunKvpage(std::string(kQwen) + " --policy llamacpp --format csv");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, ::testing::StartsWith("model,policy,kv_cache_dtype,context,"));
  EXPECT_THAT(r.output, HasSubstr("qwen3-8b,llamacpp,f16,32768,4831838208,"));
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 4);
}

TEST(PlanCliTest, TableNamesModelAndContexts) {
  const CommandResult r = RunKvpage(std::string(kQwen) + " --compare");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("qwen3-8b"));
  EXPECT_THAT(r.output, HasSubstr("32K"));
  EXPECT_THAT(r.output, HasSubstr("128K"));
}

TEST(PlanCliTest, SaysWhyVllmWouldNotStart) {
  const CommandResult r = RunKvpage("plan --model qwen3-8b --policy vllm --context 128K");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("vLLM would not start at 128K: max_model_len 131072 is "
                                  "greater than the derived max_model_len 40960"));
  EXPECT_THAT(r.output, HasSubstr("Any one of these would let it: --max-model-len 40960; "));
  const json j = RunJson("plan --model qwen3-8b --policy vllm --context 32K,128K --format json");
  EXPECT_EQ(j["rows"][0]["vllm_starts"], true);
  EXPECT_FALSE(j["rows"][0].contains("refusal"));
  EXPECT_EQ(j["rows"][1]["vllm_starts"], false);
  EXPECT_EQ(j["rows"][1]["fixes"][0], "--max-model-len 40960");
  // The override lets 128K through to the memory check, which an L4 fails: the fixes
  // include the tp that fits on it (weights 16,381,470,720 B).
  const CommandResult csv = RunKvpage(
      "plan --model qwen3-8b --policy vllm --context 32K,128K --gpu l4 --format csv "
      "--allow-long-max-model-len");
  ASSERT_EQ(csv.exit_code, 0) << csv.output;
  EXPECT_THAT(csv.output, HasSubstr(",max_concurrency,vllm_starts,vllm_refusal\n"));
  // Budget 5,356,138,905 B less vLLM's runtime memory at 8,192 tokens and 1,024 requests
  // (3,658,911,581 B) = 1,697,227,324 B = 1.58 GiB: not even 32K (4.5 GiB) fits.
  EXPECT_THAT(csv.output, HasSubstr(",147456.000,0,false,\"one request of max_model_len 32768 "
                                    "needs 4.5 GiB of KV cache, more than the 1.58 GiB "
                                    "available\"\n"));
  EXPECT_THAT(csv.output, HasSubstr(",0,false,\"one request of max_model_len 131072 needs "
                                    "18.0 GiB of KV cache, more than the 1.58 GiB available\"\n"));
  const CommandResult text = RunKvpage(
      "plan --model qwen3-8b --policy vllm --context 128K --gpu l4 --allow-long-max-model-len");
  EXPECT_THAT(text.output, HasSubstr("vLLM's budget 1.58 GiB: the weights' remainder less its "
                                     "estimated activations 2.18 GiB, CUDA graphs 0.97 GiB, "
                                     "non-torch 0.25 GiB.\n"));
  EXPECT_THAT(text.output, HasSubstr("Any one of these would let it: --max-model-len 11488; "
                                     "--tp 4.\n"));
  ExpectUsageError("plan --model qwen3-8b --policy llamacpp --enforce-eager",
                   "--enforce-eager applies to --policy vllm");
  ExpectUsageError("plan --model qwen3-8b --policy kvpage --allow-long-max-model-len",
                   "--allow-long-max-model-len applies to --policy vllm");
}

// A checkpoint directory with qwen3-8b's config.json and, when `weight_bytes` > 0, a
// model.safetensors holding one U8 tensor of that many bytes (a sparse file: nothing written).
std::filesystem::path TinyCheckpoint(const std::string& name, int64_t weight_bytes) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(std::string(KVPAGE_SOURCE_DIR) + "/sim/data/models/qwen3-8b.json",
                             dir / "config.json");
  if (weight_bytes > 0) {
    const std::string header = "{\"w\":{\"dtype\":\"U8\",\"shape\":[" +
                               std::to_string(weight_bytes) + "],\"data_offsets\":[0," +
                               std::to_string(weight_bytes) + "]}}";
    {
      std::ofstream out(dir / "model.safetensors", std::ios::binary);
      for (int i = 0; i < 8; ++i) out.put(static_cast<char>((header.size() >> (8 * i)) & 0xff));
      out << header;
    }
    std::filesystem::resize_file(dir / "model.safetensors", 8 + header.size() + weight_bytes);
  }
  return dir;
}

// The JSON after the informational lines --checkpoint prints on stderr.
json JsonAfterNotes(const std::string& output) {
  return json::parse(output.substr(std::min(output.find('{'), output.size())), nullptr,
                     /*allow_exceptions=*/false);
}

TEST(PlanCliTest, CheckpointWeightsSetTheBudget) {
  // 8,000,000,000 B of weights instead of config.json's 16,381,470,720 B: on an H100 the
  // budget is floor(85,520,809,984 × 0.9) − 8e9 − 3,658,911,581 (vLLM's runtime memory) =
  // 65,309,817,404 B = 27,681 blocks of 2.25 MiB; 32K takes 2,048 of them: 13 requests.
  const auto dir = TinyCheckpoint("kvpage_plan_checkpoint", 8'000'000'000);
  const CommandResult r = RunKvpage("plan --checkpoint " + Quote(dir.string()) +
                                    " --policy vllm --context 32K --gpu h100 --format json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("weights of kvpage_plan_checkpoint: 8000000000 bytes in 1 "
                                  "tensors of 1 safetensors files (config.json counts "
                                  "16381470720)"));
  const json j = JsonAfterNotes(r.output);
  ASSERT_FALSE(j.is_discarded()) << r.output;
  EXPECT_EQ(j["kv_budget_bytes"], 65'309'817'404);
  EXPECT_EQ(j["rows"][0]["max_concurrency"], 13);
  // No safetensors: config.json's count, with a warning.
  const CommandResult bare = RunKvpage(
      "plan --checkpoint " + Quote(TinyCheckpoint("kvpage_plan_bare", 0).string()) +
      " --model qwen3-8b --policy vllm --context 32K --gpu h100 --format json");
  ASSERT_EQ(bare.exit_code, 0) << bare.output;
  EXPECT_THAT(bare.output, HasSubstr("weights counted from config.json (16381470720 bytes)"));
  EXPECT_EQ(JsonAfterNotes(bare.output)["kv_budget_bytes"], 56'928'346'684);
  ExpectUsageError("plan --checkpoint /nonexistent/dir --context 4K", "is not a directory");
  ExpectUsageError("plan --checkpoint " + Quote(dir.string()) + " --model qwen3-8b,gemma-3-4b-it",
                   "--checkpoint applies to one model, got 2");
  std::ofstream(dir / "model.safetensors", std::ios::binary) << "short";
  ExpectUsageError("plan --checkpoint " + Quote(dir.string()) + " --context 4K",
                   "shorter than the 8-byte header length");
}

TEST(PlanCliTest, HelpListsEveryFlag) {
  const CommandResult r = RunKvpage("plan --help");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (const char* flag :
       {"--model", "--policy", "--compare", "--context", "--kv-cache-dtype", "--block-size",
        "--max-num-batched-tokens", "--no-async-scheduling", "--no-enable-prefix-caching",
        "--ubatch", "--batch", "--parallel", "--kv-unified", "--swa-full", "--gpu",
        "--gpu-memory-utilization", "--kv-budget-gib", "--format", "--plot",
        "--vllm-version", "--tp", "--slo", "--host-cache-gib", "--allow-long-max-model-len",
        "--checkpoint"}) {
    EXPECT_THAT(r.output, HasSubstr(flag));
  }
}

// Qwen3-8B: 36 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes = 147,456 bytes per token.
TEST(PlanCliTest, HostTierHoldsTheBudgetOverTheBytesPerToken) {
  CommandResult r = RunKvpage(std::string(kQwen) + " --host-cache-gib 128");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // 128 GiB / 147,456 B = 932,067.56
  EXPECT_THAT(r.output,
              HasSubstr("host tier 128.00 GiB holds 932067 tokens of qwen3-8b (147456.0 bytes/token"));
  EXPECT_THAT(r.output, ::testing::Not(HasSubstr("approximate")));
  const json j = RunJson(std::string(kQwen) + " --compare --host-cache-gib 128 --format json");
  ASSERT_EQ(j["plans"].size(), 3u);
  for (const json& plan : j["plans"]) {
    EXPECT_EQ(plan["host_cache"]["tokens"], 932067);
    EXPECT_EQ(plan["host_cache"]["budget_bytes"], int64_t{128} << 30);
  }
  // A hybrid model: the snapshots make the figure approximate, and the output says so.
  r = RunKvpage("plan --model qwen3.5-9b --context 4K --host-cache-gib 128");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("approximate: recurrent-state snapshots"));
}

TEST(PlanCliErrorsTest, HostTierFlagIsChecked) {
  ExpectUsageError(std::string(kQwen) + " --host-cache-gib 0", "--host-cache-gib must be in (0, 1e9], got 0");
  ExpectUsageError(std::string(kQwen) + " --host-cache-gib -2", "got -2");
  ExpectUsageError(std::string(kQwen) + " --host-cache-gib 8 --format csv", "--format table or json");
}

TEST(PlanCliTest, ModelsListsBundledModels) {
  const CommandResult r = RunKvpage("models");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("qwen3.5-9b"));
  EXPECT_THAT(r.output, HasSubstr("linear_attention"));
  EXPECT_THAT(r.output, HasSubstr("deepseek-v2-lite"));
}

// DeepSeek-V3.2 under all three policies at 32K: 32,768 tokens × 61 layers × 1,284 bytes
// (kvpage, vllm: 1,152-byte latent + 132-byte indexer key) = 2,447.625 MiB, and × 1,408 bytes
// (llamacpp f16: 576 + 128 values) = 2,684 MiB.
TEST(PlanCliTest, DeepSeekV32ShowsTheIndexerUnderEveryPolicy) {
  const CommandResult models = RunKvpage("models --model deepseek-v3.2");
  EXPECT_EQ(models.exit_code, 0) << models.output;
  EXPECT_THAT(models.output, HasSubstr("indexer key 128 values (top-2048 of 64 heads)"));
  const CommandResult plan = RunKvpage("plan --compare --model deepseek-v3.2 --context 32K");
  EXPECT_EQ(plan.exit_code, 0) << plan.output;
  EXPECT_THAT(plan.output, HasSubstr("2447.625         2447.625         2684.000"));
}

// ---- Usage errors: exit 2, naming the bad value -----------------------------------------

TEST(PlanCliErrorsTest, UnknownModel) {
  ExpectUsageError("plan --model llama-9000 --context 4K", "llama-9000");
}

TEST(PlanCliErrorsTest, BlockSizeVllmRefuses) {
  ExpectUsageError("plan --model qwen3-8b --context 4K --policy vllm --block-size 7",
                   "block_size 7 is not one vLLM accepts");
  ExpectUsageError("plan --model qwen3-8b --context 4K --compare --block-size 7",
                   "block_size 7 is not one vLLM accepts");
  // kvpage's own allocator takes any block size.
  EXPECT_EQ(RunKvpage("plan --model qwen3-8b --context 4K --policy kvpage --block-size 7").exit_code,
            0);
}

TEST(PlanCliErrorsTest, UnknownVllmVersion) {
  ExpectUsageError("plan --model qwen3-8b --context 4K --policy vllm --vllm-version 0.30",
                   "--vllm-version: unknown vLLM version '0.30'");
}

// A flag of another policy is refused, not ignored.
TEST(PlanCliErrorsTest, VllmVersionUnderAnotherPolicy) {
  ExpectUsageError("plan --model qwen3-8b --context 4K --vllm-version 0.29",
                   "--vllm-version applies to --policy vllm (or --compare), not --policy kvpage");
  ExpectUsageError("plan --model qwen3-8b --context 4K --policy llamacpp --vllm-version 0.33",
                   "not --policy llamacpp");
}

// Past 1e9 GiB the budget is out of range, not "not positive".
TEST(PlanCliErrorsTest, HugeKvBudget) {
  ExpectUsageError("plan --model qwen3-8b --context 4K --kv-budget-gib 1e30",
                   "--kv-budget-gib must be in (0, 1e9], got 1e+30");
}

TEST(PlanCliErrorsTest, UnknownPolicy) {
  ExpectUsageError("plan --model qwen3-8b --context 4K --policy sglang", "sglang");
}

TEST(PlanCliErrorsTest, ZeroContext) {
  ExpectUsageError("plan --model qwen3-8b --context 0", "'0'");
}

TEST(PlanCliErrorsTest, NonNumericContext) {
  ExpectUsageError("plan --model qwen3-8b --context 4K,abc", "'abc'");
}

TEST(PlanCliErrorsTest, UnknownFormat) {
  ExpectUsageError("plan --model qwen3-8b --context 4K --format xml", "'xml'");
}

TEST(PlanCliErrorsTest, UnknownKvCacheDtype) {
  ExpectUsageError("plan --model qwen3-8b --context 4K --kv-cache-dtype int4", "int4");
}

TEST(PlanCliErrorsTest, UnknownFlag) {
  ExpectUsageError("plan --model qwen3-8b --context 4K --bogus-flag", "--bogus-flag");
}

TEST(PlanCliErrorsTest, UnknownGpu) {
  ExpectUsageError("plan --model qwen3-8b --context 4K --gpu tpu", "tpu");
}

TEST(PlanCliErrorsTest, Q8_0UnderVllm) {
  ExpectUsageError("plan --model qwen3-8b --context 4K --kv-cache-dtype q8_0 --policy vllm",
                   "q8_0");
}

TEST(PlanCliErrorsTest, Fp8UnderLlamaCpp) {
  ExpectUsageError("plan --model qwen3-8b --context 4K --kv-cache-dtype fp8 --policy llamacpp",
                   "fp8");
}

TEST(PlanCliErrorsTest, CompareAndPolicyTogether) {
  ExpectUsageError("plan --model qwen3-8b --context 4K --compare --policy vllm", "--compare");
}

TEST(PlanCliErrorsTest, TpThatDoesNotSplitTheHeads) {
  ExpectUsageError("plan --model qwen3-8b --context 4K --tp 5",
                   "tp 5 does not divide qwen3-8b's attention heads (32)");
  ExpectUsageError("plan --model qwen3-8b --context 4K --tp 0", "--tp must be in [1, 1024], got 0");
}

// ---- kvpage plan --trace --slo -------------------------------------------------------------

constexpr char kSlo[] =
    "plan --trace mooncake_conversation_trace.jsonl --model qwen3-8b --gpu h100 "
    "--max-requests 50";

TEST(PlanSloCliErrorsTest, MalformedSloNamesTheTerm) {
  const std::string base = kSlo;
  ExpectUsageError(base + " --slo ttft-p99=", "--slo term 'ttft-p99=': has no value");
  ExpectUsageError(base + " --slo ttft=2s", "unknown metric 'ttft'");
  ExpectUsageError(base + " --slo ttft-p99=-1s", "limit must be positive, got '-1s'");
  ExpectUsageError(base + " --slo ttft-p99=2", "value '2' needs a unit, s or ms");
  ExpectUsageError(base + " --slo speed-p99=2s", "unknown metric 'speed-p99'");
  ExpectUsageError(base, "--slo is required");
}

TEST(PlanSloCliErrorsTest, BadListsAndBoundsAreNamed) {
  const std::string base = std::string(kSlo) + " --slo ttft-p99=2s";
  ExpectUsageError(base + " --routers round-robin,random", "random");
  ExpectUsageError(base + " --tp 1,x", "--tp: expected degrees in [1, 1024], got 'x'");
  ExpectUsageError(base + " --tp 3", "--tp 3: tp 3 does not divide qwen3-8b's attention heads");
  ExpectUsageError(base + " --max-replicas 0", "--max-replicas must be in [1, 4096], got 0");
  ExpectUsageError(base + " --jobs 0", "--jobs must be in [1, 1024], got 0");
  ExpectUsageError(base + " --format csv", "--format must be table or json with --slo");
  ExpectUsageError("plan --slo ttft-p99=2s --model qwen3-8b --gpu h100", "--trace is required");
}

TEST(PlanSloCliErrorsTest, ModelThatDoesNotFitATp) {
  ExpectUsageError(
      "plan --trace mooncake_conversation_trace.jsonl --model llama-3.1-70b --gpu h100 "
      "--slo ttft-p99=2s --tp 2,1",
      "--tp 1: the weights of llama-3.1-70b (141107412992 bytes) do not fit");
}

TEST(PlanSloCliTest, HelpListsEveryFlag) {
  const CommandResult r = RunKvpage("plan --slo --help");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (const char* flag : {"--trace", "--slo", "--model", "--gpu", "--max-requests", "--routers",
                           "--tp", "--jobs", "--max-replicas", "--gpu-memory-utilization",
                           "--seed", "--format", "--plot", "--progress"}) {
    EXPECT_THAT(r.output, HasSubstr(flag));
  }
}

TEST(PlanSloCliTest, SearchesEveryPairAndPicksTheFewestGpus) {
  const json j = RunJson(std::string(kSlo) +
                         " --slo ttft-p99=5s,tpot-p99=100ms --tp 1,2 --routers "
                         "round-robin,least-loaded --jobs 2 --format json");
  ASSERT_EQ(j["searches"].size(), 4u);
  EXPECT_EQ(j["requests"], 50);
  EXPECT_EQ(j["slo"][1]["metric"], "tpot-p99");
  EXPECT_EQ(j["slo"][1]["limit_ms"], 100.0);
  int64_t fewest_gpus = INT64_MAX;
  for (const json& s : j["searches"]) {
    SCOPED_TRACE(s.dump());
    ASSERT_FALSE(s["probes"].empty());
    EXPECT_EQ(s["probes"][0]["replicas"], 1);  // the search starts at one replica
    if (s["fewest_replicas"].is_null()) continue;
    const int64_t fewest = s["fewest_replicas"];
    EXPECT_EQ(s["gpus"].get<int64_t>(), fewest * s["tp"].get<int64_t>());
    for (const json& p : s["probes"]) {
      // Monotone verdicts around the answer: the answer met, the count below it did not.
      if (p["replicas"] == fewest) {
        EXPECT_TRUE(p["met"].get<bool>());
      }
      if (p["replicas"] == fewest - 1) {
        EXPECT_FALSE(p["met"].get<bool>());
      }
      EXPECT_EQ(p["met"].get<bool>(), p["values_ms"]["ttft-p99"].get<double>() <= 5000 &&
                                           p["values_ms"]["tpot-p99"].get<double>() <= 100);
    }
    fewest_gpus = std::min(fewest_gpus, s["gpus"].get<int64_t>());
  }
  ASSERT_TRUE(j["answer"].is_object()) << j.dump();
  EXPECT_EQ(j["answer"]["gpus"].get<int64_t>(), fewest_gpus);
  EXPECT_EQ(j["cost_model"]["kind"], "calibrated");  // kSlo runs on an H100
}

TEST(PlanSloCliTest, UnreachableSloReportsTheBoundAndExitsOne) {
  const CommandResult r = RunKvpage(std::string(kSlo) +
                                    " --slo ttft-p99=1ms --routers round-robin --max-replicas 4");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("not met at 4 replicas (the search's upper bound)"));
  EXPECT_THAT(r.output, HasSubstr("Answer: no (tp, router) met the SLO within 4 replicas"));
}

// On a GPU without a measured calibration the answer is a roofline estimate, and says so.
TEST(PlanSloCliTest, UncalibratedGpuEndsWithTheRooflineLine) {
  const CommandResult r = RunKvpage(
      "plan --trace mooncake_conversation_trace.jsonl --model qwen3-8b --gpu l40s "
      "--max-requests 20 --slo ttft-p99=60s --routers round-robin --max-replicas 2");
  EXPECT_THAT(r.output, HasSubstr("\ncost model: no measured calibration for L40S: roofline "
                                  "estimate at 32% of peak dense FLOP/s"))
      << r.output;
}

TEST(PlanCliErrorsTest, MissingModel) { ExpectUsageError("plan --context 4K", "--model"); }

TEST(PlanCliErrorsTest, NoCommand) { ExpectUsageError("", "Usage"); }

TEST(PlanCliErrorsTest, MalformedConfigFileIsNamed) {
  const std::filesystem::path path =
      std::filesystem::path(testing::TempDir()) / "kvpage_cli_test_broken_config.json";
  {
    std::ofstream out(path);
    out << R"({"num_hidden_layers": "many"})";
  }
  const CommandResult r = RunKvpage("plan --context 4K --model " + Quote(path.string()));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr(path.string()));
  EXPECT_THAT(r.output, HasSubstr("num_hidden_layers"));
}

}  // namespace
