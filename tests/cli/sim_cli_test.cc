// End-to-end tests of `kvpage sim`: runs the binary in a shell and checks exit status and output.
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "nlohmann/json.hpp"
#include "testing/run_kvpage.h"

namespace {

using ::testing::HasSubstr;
using json = nlohmann::ordered_json;

using kvpage::testing::CommandResult;

// Simulations here print no progress line.
CommandResult RunKvpage(const std::string& args, const std::string& env = "") {
  return kvpage::testing::RunKvpage(args + " --no-progress", env);
}

void ExpectUsageError(const std::string& args, const std::string& bad_value) {
  const CommandResult r = RunKvpage(args);
  EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.output;
  EXPECT_THAT(r.output, HasSubstr(bad_value)) << args;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// 40 requests of the bundled trace, found by its bare name.
const std::string kBase =
    "sim --model qwen3-8b --gpu h100 --trace mooncake_conversation_trace.jsonl "
    "--max-requests 40";

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("kvpage_sim_cli_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

// Bare trace names are looked up in share/kvpage/traces beside bin/ (links in the build tree,
// copies once installed), or in $KVPAGE_DATA_DIR/traces when it is set; never in the sources.
TEST(SimCliTest, BundledTracesComeFromTheDataDir) {
  const std::string empty = TempPath("empty_data_dir");
  std::filesystem::create_directories(empty);
  CommandResult r = RunKvpage(kBase, "KVPAGE_DATA_DIR=" + empty + " ");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("cannot read trace file 'mooncake_conversation_trace.jsonl'"));
  std::filesystem::remove_all(empty);

  r = RunKvpage(kBase, "KVPAGE_DATA_DIR=" + std::string(KVPAGE_BINARY_DIR) + "/share/kvpage ");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  r = RunKvpage(kBase);
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

TEST(SimCliTest, HelpListsEveryFlag) {
  const CommandResult r = RunKvpage("sim --help");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (const char* flag :
       {"--model", "--gpu", "--trace", "--trace-format", "--kv-budget-gib",
        "--gpu-memory-utilization", "--block-size", "--max-num-batched-tokens", "--max-num-seqs",
        "--max-model-len", "--enable-chunked-prefill", "--no-enable-chunked-prefill",
        "--long-prefill-token-threshold", "--scheduling-policy", "--enable-prefix-caching",
        "--no-enable-prefix-caching", "--kv-cache-dtype", "--tp", "--allocator",
        "--kv-chunk-mib", "--compare-allocators", "--max-requests", "--request-rate", "--synthetic",
        "--output-json", "--output-dir", "--seed", "--replicas", "--router",
        "--overlap-weight", "--host-cache-gib", "--host-policy", "--pcie-gbps"}) {
    EXPECT_THAT(r.output, HasSubstr(flag)) << flag;
  }
}

// Mistral's vocabulary (32,768) is smaller than the traces' default (100,000): kvpage sim draws
// token ids below the model's, which the scheduler would otherwise refuse.
TEST(SimCliTest, SmallVocabularyModelRuns) {
  const CommandResult r = RunKvpage(
      "sim --model mistral-7b-v0.3 --gpu h100 --trace mooncake_conversation_trace.jsonl "
      "--max-requests 20");
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

TEST(SimCliTest, BadValuesExitTwoNamingTheValue) {
  ExpectUsageError(kBase + " --allocator tcmalloc", "tcmalloc");
  ExpectUsageError(kBase + " --block-size 0", "--block-size");
  ExpectUsageError(kBase + " --allocator vllm --block-size 7",
                   "--block-size: block_size 7 is not one vLLM accepts (1, 8, 16, 32, 64 or 128)");
  ExpectUsageError(kBase + " --compare-allocators --block-size 7", "block_size 7");
  ExpectUsageError(kBase + " --max-num-seqs abc", "abc");
  ExpectUsageError(kBase + " --gpu-memory-utilization 1.5", "1.5");
  ExpectUsageError(kBase + " --kv-budget-gib -3", "-3");
  ExpectUsageError(kBase + " --kv-budget-gib 1e30", "must be in (0, 1e9], got 1e+30");
  ExpectUsageError(kBase + " --long-prefill-token-threshold 1073741825",
                   "--long-prefill-token-threshold must be in [0, 2^30], got 1073741825");
  // GPU memory x tp used to overflow ("do not fit in -365804879733168576 bytes").
  ExpectUsageError(kBase + " --tp 4294967296", "--tp must be in [1, 1024], got 4294967296");
  ExpectUsageError(kBase + " --tp 1025", "--tp must be in [1, 1024], got 1025");
  ExpectUsageError(kBase + " --scheduling-policy lifo", "lifo");
  ExpectUsageError(kBase + " --allocator vllm --vllm-version 1.0", "unknown vLLM version '1.0'");
  ExpectUsageError(kBase + " --trace-format parquet", "parquet");
  ExpectUsageError(kBase + " --kv-cache-dtype int3", "int3");
  ExpectUsageError(kBase + " --bogus-flag", "--bogus-flag");
  ExpectUsageError(kBase + " --compare-allocators --allocator vllm", "--allocator");
  ExpectUsageError("sim --model qwen3-8b --gpu h100 --trace /nonexistent/x.jsonl",
                   "/nonexistent/x.jsonl");
  ExpectUsageError("sim --model no-such-model --gpu h100 --trace x.jsonl", "no-such-model");
  ExpectUsageError("sim --model qwen3-8b --gpu h100 --synthetic 10", "--request-rate");
  ExpectUsageError("sim --model qwen3-8b --gpu h100", "--trace");
}

// The budget of tp GPUs in whole-model bytes: each GPU's (memory x 0.9 - weights / tp) times
// what its share of the KV heads shrinks by (docs/capacity_planning.md §7).
TEST(SimCliTest, TensorParallelBudgetSplitsKvHeads) {
  const struct {
    const char* model;
    int tp;
    int64_t budget;
  } cases[] = {
      // 76,968,728,985 - 16,381,470,720 (weights) at tp 1.
      {"qwen3-8b", 1, 60'587'258'265},
      // Gemma 3 4B's 4 KV heads over 8 GPUs: one each (replicated twice), so x4, not x8:
      // (76,968,728,985 - 970,022,272) x 4.
      {"gemma-3-4b-it", 8, 303'994'826'852},
      // Llama-3.1-70B at tp 8: (76,968,728,985 - 17,638,426,624) x 8.
      {"llama-3.1-70b", 8, 474'642'418'888},
  };
  for (const auto& c : cases) {
    const std::string out = TempPath(std::string(c.model) + "_tp.json");
    const CommandResult r =
        RunKvpage(std::string("sim --model ") + c.model + " --gpu h100 --tp " +
                  std::to_string(c.tp) + " --synthetic 4 --prompt-len 64 --output-len 4 " +
                  "--arrival burst --output-json " + out);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(json::parse(ReadFile(out))["kv_budget_bytes"].get<int64_t>(), c.budget)
        << c.model << " tp " << c.tp;
  }
  ExpectUsageError(kBase + " --tp 3", "tp 3 does not divide qwen3-8b's attention heads (32)");
}

TEST(SimCliTest, JsonHasTheBenchServeFieldsAndIsDeterministic) {
  const std::string a = TempPath("a.json"), b = TempPath("b.json");
  const CommandResult r1 = RunKvpage(kBase + " --output-json " + a);
  ASSERT_EQ(r1.exit_code, 0) << r1.output;
  EXPECT_THAT(r1.output, HasSubstr("Max concurrency"));
  const CommandResult r2 = RunKvpage(kBase + " --output-json " + b);
  ASSERT_EQ(r2.exit_code, 0) << r2.output;
  json ja = json::parse(ReadFile(a)), jb = json::parse(ReadFile(b));
  for (const char* key :
       {"completed", "request_throughput", "output_throughput", "total_token_throughput",
        "mean_ttft_ms", "median_ttft_ms", "p90_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
        "median_tpot_ms", "p90_tpot_ms", "p99_tpot_ms", "mean_itl_ms", "median_itl_ms",
        "p90_itl_ms", "p99_itl_ms", "mean_e2el_ms", "median_e2el_ms", "p90_e2el_ms",
        "p99_e2el_ms", "preemptions", "prefix_cache", "kv_usage", "max_concurrency",
        "simulated_seconds", "wall_seconds"}) {
    EXPECT_TRUE(ja.contains(key)) << key;
  }
  for (const char* key : {"queried_tokens", "hit_tokens", "hit_rate"}) {
    EXPECT_TRUE(ja["prefix_cache"].contains(key)) << key;
  }
  EXPECT_EQ(ja["completed"].get<int64_t>() + ja["dropped_requests"].get<int64_t>(), 40);
  ja.erase("wall_seconds");
  jb.erase("wall_seconds");
  EXPECT_EQ(ja.dump(), jb.dump());
  std::filesystem::remove(a);
  std::filesystem::remove(b);
}

TEST(SimCliTest, FleetFlagsRejectBadValuesNamingThem) {
  ExpectUsageError(kBase + " --replicas 0", "--replicas must be in [1, 4096], got 0");
  ExpectUsageError(kBase + " --replicas -3", "--replicas must be in [1, 4096], got -3");
  ExpectUsageError(kBase + " --replicas 100000", "--replicas must be in [1, 4096], got 100000");
  ExpectUsageError(kBase + " --replicas 2 --router random", "unknown router 'random'");
  ExpectUsageError(kBase + " --router Prefix-Aware", "'Prefix-Aware'");
  ExpectUsageError(kBase + " --replicas 2 --overlap-weight -1", "--overlap-weight");
  ExpectUsageError(kBase + " --replicas 2 --output-dir /tmp/x", "--output-dir");
  ExpectUsageError(kBase + " --replicas 2 --compare-allocators", "--compare-allocators");
}

TEST(SimCliTest, FleetPrintsTheFleetAndEachReplica) {
  CommandResult r = RunKvpage(kBase + " --replicas 3 --router least-loaded");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("qwen3-8b on 3 x H100-SXM5-80GB, router least-loaded"));
  EXPECT_THAT(r.output, HasSubstr("Load imbalance"));
  EXPECT_THAT(r.output, HasSubstr("replica   routed"));
  r = RunKvpage(kBase + " --replicas 3 --router prefix-aware --output-json -");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json j = json::parse(r.output);
  EXPECT_EQ(j["router"], "prefix-aware");
  EXPECT_EQ(j["replicas"], 3);
  ASSERT_EQ(j["per_replica"].size(), 3u);
  int64_t routed = 0;
  for (const json& replica : j["per_replica"]) routed += replica["routed"].get<int64_t>();
  EXPECT_EQ(routed, 40);
  EXPECT_EQ(j["completed"].get<int64_t>() + j["dropped_requests"].get<int64_t>(), 40);
  for (const char* key : {"prefix_cache", "load_imbalance", "event_bytes", "event_bytes_per_s",
                          "median_ttft_ms", "p99_tpot_ms"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
}

TEST(SimCliTest, HostTierFlagsRejectBadValuesNamingThem) {
  ExpectUsageError(kBase + " --host-cache-gib -1", "--host-cache-gib must be in [0, 1e9], got -1");
  ExpectUsageError(kBase + " --host-cache-gib 2e9", "--host-cache-gib must be in [0, 1e9], got 2e+09");
  ExpectUsageError(kBase + " --host-cache-gib 8 --host-policy lru",
                   "--host-policy must be write-through or write-back, got 'lru'");
  ExpectUsageError(kBase + " --host-cache-gib 8 --pcie-gbps 0",
                   "--pcie-gbps must be in (0, 1e9], got 0");
  ExpectUsageError(kBase + " --host-policy write-back", "need --host-cache-gib");
  ExpectUsageError(kBase + " --pcie-gbps 64", "need --host-cache-gib");
  ExpectUsageError(kBase + " --host-cache-gib 8 --allocator vllm", "--host-cache-gib needs kvpage");
  ExpectUsageError(kBase + " --host-cache-gib 8 --compare-allocators",
                   "--host-cache-gib needs kvpage");
}

// 20 prefix groups of 1,024 tokens over 200 requests: a 1 GiB device (about 7,000 tokens)
// keeps few of them, a 64 GiB host tier all. The 180 requests after each group's first could
// hit 1,024 tokens each.
const std::string kSharedPrefixes =
    "sim --model qwen3-8b --gpu h100 --synthetic 200 --prompt-len 2048 --output-len 16 "
    "--shared-prefix-fraction 0.5 --num-prefix-groups 20 --request-rate 5 --kv-budget-gib 1";

TEST(SimCliTest, HostTierIsReportedInTheTableAndJson) {
  CommandResult r = RunKvpage(kSharedPrefixes + " --output-json -");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(json::parse(r.output)["prefix_cache"]["hit_tokens"], 33792);
  EXPECT_FALSE(json::parse(r.output).contains("host_tier"));
  // --host-cache-gib 0 is no tier: the plain run's output.
  CommandResult zero = RunKvpage(kSharedPrefixes + " --host-cache-gib 0 --output-json -");
  ASSERT_EQ(zero.exit_code, 0) << zero.output;
  json a = json::parse(r.output), b = json::parse(zero.output);
  a.erase("wall_seconds");
  b.erase("wall_seconds");
  EXPECT_EQ(a, b);

  const std::string host = kSharedPrefixes + " --host-cache-gib 64";
  r = RunKvpage(host);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("184320 / 409600 (45.00%)"));
  EXPECT_THAT(r.output, HasSubstr("from device / host tier"));
  EXPECT_THAT(r.output, HasSubstr("64.00, write-through, 32.0"));
  r = RunKvpage(host + " --host-policy write-back --pcie-gbps 16 --output-json -");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json j = json::parse(r.output);
  const json& h = j["host_tier"];
  EXPECT_EQ(h["policy"], "write-back");
  EXPECT_EQ(h["pcie_gbps"], 16.0);
  EXPECT_EQ(h["budget_bytes"], int64_t{64} << 30);
  EXPECT_EQ(j["prefix_cache"]["hit_tokens"], 184320);
  EXPECT_EQ(h["device_hit_tokens"], 33792);
  EXPECT_EQ(h["host_hit_tokens"], 150528);
  // Fleets pass the tier to every replica and sum it.
  r = RunKvpage(host + " --replicas 2 --output-json -");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(json::parse(r.output)["host_tier"]["budget_bytes"], int64_t{128} << 30);
}

TEST(SimCliTest, CompareAllocatorsPrintsBothColumns) {
  const CommandResult r = RunKvpage(
      "sim --model gemma-3-4b-it --gpu h100 --trace mooncake_conversation_trace.jsonl "
      "--max-requests 30 --compare-allocators --output-json -");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json j = json::parse(r.output);
  ASSERT_TRUE(j.contains("kvpage"));
  ASSERT_TRUE(j.contains("vllm"));
  EXPECT_TRUE(j["kvpage"]["kv_usage"].contains("g0_sliding_window"));
  EXPECT_TRUE(j["vllm"]["kv_usage"].contains("shared"));
}

TEST(SimCliTest, SyntheticTraceRuns) {
  const CommandResult r = RunKvpage(
      "sim --model qwen3-8b --gpu a100 --synthetic 20 --prompt-len 512 --output-len 16 "
      "--arrival burst --output-json -");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json j = json::parse(r.output);
  EXPECT_EQ(j["completed"], 20);
  EXPECT_EQ(j["total_output_tokens"], 320);
}

// `--gpu FILE` prices steps with the file's own calibration: a renamed copy of the bundled
// A100 file simulates exactly as `--gpu a100`, and a refit with slower GEMMs runs slower.
TEST(SimCliTest, GpuFileCalibrationIsUsed) {
  std::string text = ReadFile(std::string(KVPAGE_SOURCE_DIR) +
                              "/sim/data/hardware/a100-sxm-80gb.json");
  const std::string name = "\"name\": \"A100-SXM4-80GB\"";
  ASSERT_NE(text.find(name), std::string::npos);
  text.replace(text.find(name), name.size(), "\"name\": \"My-A100\"");
  const std::string copy = TempPath("my_a100.json");
  std::ofstream(copy) << text;
  const std::string launch = "\"launch_us\": 4.";  // the tp 1 GEMM curve comes first
  ASSERT_NE(text.find(launch), std::string::npos);
  text.replace(text.find(launch), launch.size(), "\"launch_us\": 404.");
  const std::string slow = TempPath("slow_a100.json");
  std::ofstream(slow) << text;

  const std::string args = "sim --model qwen3-8b --synthetic 20 --prompt-len 512 "
                           "--output-len 16 --arrival burst --output-json - --gpu ";
  const CommandResult bundled = RunKvpage(args + "a100");
  const CommandResult same = RunKvpage(args + copy);
  const CommandResult slower = RunKvpage(args + slow);
  ASSERT_EQ(bundled.exit_code, 0) << bundled.output;
  ASSERT_EQ(same.exit_code, 0) << same.output;
  ASSERT_EQ(slower.exit_code, 0) << slower.output;
  json a = json::parse(bundled.output);
  json b = json::parse(same.output);
  const json c = json::parse(slower.output);
  EXPECT_EQ(a["cost_model"]["calibration"], "bundled:a100-sxm-80gb");
  EXPECT_EQ(b["cost_model"]["calibration"], copy);
  for (json* j : {&a, &b}) {
    j->erase("wall_seconds");
    j->erase("cost_model");
  }
  EXPECT_EQ(a.dump(), b.dump());
  // 400 us more per GEMM x (36 layers x 4 + LM head) = 58 ms more per step; every request
  // waits for at least one step before its first token.
  EXPECT_GE(c["mean_ttft_ms"].get<double>() - a["mean_ttft_ms"].get<double>(), 58.0);
  std::filesystem::remove(copy);
  std::filesystem::remove(slow);
}

// A GPU without a measured calibration is priced by the roofline, and the output says so.
TEST(SimCliTest, UncalibratedGpuSaysItIsARooflineEstimate) {
  const std::string args = "sim --model qwen3-8b --gpu l4 --synthetic 8 --prompt-len 256 "
                           "--output-len 8 --arrival burst";
  const CommandResult text = RunKvpage(args);
  ASSERT_EQ(text.exit_code, 0) << text.output;
  EXPECT_THAT(text.output, HasSubstr("qwen3-8b on L4, 8 requests\n"
                                     "cost model: no measured calibration for L4: roofline "
                                     "estimate at 32% of peak dense FLOP/s and 80% of memory "
                                     "bandwidth"));
  const CommandResult out = RunKvpage(args + " --output-json -");
  ASSERT_EQ(out.exit_code, 0) << out.output;
  const json j = json::parse(out.output);
  EXPECT_EQ(j["completed"], 8);
  EXPECT_EQ(j["cost_model"]["kind"], "roofline");
  EXPECT_TRUE(j["cost_model"]["calibration"].is_null());
  EXPECT_EQ(j["cost_model"]["mfu"], 0.32);
  EXPECT_EQ(j["cost_model"]["hbm_efficiency"], 0.8);

  const CommandResult h100 = RunKvpage(
      "sim --model qwen3-8b --gpu h100 --synthetic 8 --prompt-len 256 --output-len 8 "
      "--arrival burst --output-json -");
  ASSERT_EQ(h100.exit_code, 0) << h100.output;
  EXPECT_EQ(json::parse(h100.output)["cost_model"]["kind"], "calibrated");
}

TEST(SimCliTest, OutputDirWritesCsvsAndPlot) {
  const std::string dir = TempPath("out");
  const CommandResult r = RunKvpage(kBase + " --output-dir " + dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string steps = ReadFile(dir + "/steps.csv");
  EXPECT_THAT(steps, HasSubstr(
      "time_s,duration_s,running,waiting,scheduled_tokens,preemptions,kv_usage_g0_full_attention"));
  EXPECT_THAT(ReadFile(dir + "/requests.csv"), HasSubstr("index,arrival_s,first_token_s"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/sim.png"));
  std::filesystem::remove_all(dir);
}

}  // namespace
