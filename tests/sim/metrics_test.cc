#include "sim/metrics.h"

#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "nlohmann/json.hpp"

namespace kvpage::sim {
namespace {

using ::testing::HasSubstr;

TEST(PercentileTest, MatchesNumpyLinear) {
  // numpy.percentile([1, 2, 3, 4], [0, 50, 90, 99, 100]) = [1, 2.5, 3.7, 3.97, 4].
  const std::vector<double> v = {4, 1, 3, 2};
  EXPECT_DOUBLE_EQ(Percentile(v, 0), 1.0);
  EXPECT_DOUBLE_EQ(Percentile(v, 50), 2.5);
  EXPECT_DOUBLE_EQ(Percentile(v, 90), 3.7);
  EXPECT_DOUBLE_EQ(Percentile(v, 99), 3.97);
  EXPECT_DOUBLE_EQ(Percentile(v, 100), 4.0);
  EXPECT_DOUBLE_EQ(Percentile({7}, 99), 7.0);
  EXPECT_DOUBLE_EQ(Percentile({}, 50), 0.0);
  // numpy.std([1, 2, 3, 4]) = sqrt(1.25).
  LatencyStats s = ComputeStats(v);
  EXPECT_DOUBLE_EQ(s.mean, 2.5);
  EXPECT_DOUBLE_EQ(s.median, 2.5);
  EXPECT_DOUBLE_EQ(s.std, std::sqrt(1.25));
}

// Three requests, times in seconds:
//   r0: arrives 0,   tokens at 0.1, 0.2, 0.4          (prompt 10, 3 outputs)
//   r1: arrives 0.5, tokens at 1.0, 1.5               (prompt 20, 2 outputs, 1 preemption)
//   r2: arrives 1.0, token at 1.25                    (prompt 30, 1 output, 16 hit tokens)
std::vector<RequestRecord> Records() {
  RequestRecord r0{0, 0.0, 0.1, 0.4, 10, 3, 0, 0, {0.1, 0.2, 0.4}};
  RequestRecord r1{1, 0.5, 1.0, 1.5, 20, 2, 0, 1, {1.0, 1.5}};
  RequestRecord r2{2, 1.0, 1.25, 1.25, 30, 1, 16, 0, {1.25}};
  return {r0, r1, r2};
}

TEST(SummarizeTest, ExactNumbers) {
  auto s = Summarize(Records());
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->completed, 3);
  EXPECT_DOUBLE_EQ(s->duration_s, 1.5);  // last finish 1.5 − first arrival 0
  EXPECT_EQ(s->total_input_tokens, 60);
  EXPECT_EQ(s->total_output_tokens, 6);
  EXPECT_EQ(s->prefix_hit_tokens, 16);
  EXPECT_EQ(s->num_preemptions, 1);
  EXPECT_DOUBLE_EQ(s->request_throughput, 2.0);
  EXPECT_DOUBLE_EQ(s->output_throughput, 4.0);
  EXPECT_DOUBLE_EQ(s->total_token_throughput, 44.0);
  // TTFT 100, 500, 250 ms.
  EXPECT_DOUBLE_EQ(s->ttft_ms.mean, 850.0 / 3);
  EXPECT_DOUBLE_EQ(s->ttft_ms.median, 250.0);
  EXPECT_DOUBLE_EQ(s->ttft_ms.p90, 450.0);  // 250 + 0.8 · (500 − 250)
  EXPECT_DOUBLE_EQ(s->ttft_ms.p99, 495.0);
  // TPOT: r0 (400 − 100) / 2 = 150, r1 (1500 − 1000) / 1 = 500; r2 has one token.
  EXPECT_DOUBLE_EQ(s->tpot_ms.mean, 325.0);
  EXPECT_DOUBLE_EQ(s->tpot_ms.median, 325.0);
  EXPECT_DOUBLE_EQ(s->tpot_ms.p99, 150 + 0.99 * 350);
  // ITLs pooled: 100, 200, 500.
  EXPECT_NEAR(s->itl_ms.mean, 800.0 / 3, 1e-9);
  EXPECT_NEAR(s->itl_ms.median, 200.0, 1e-9);
  EXPECT_NEAR(s->itl_ms.p90, 440.0, 1e-9);  // 200 + 0.8 · 300
  // E2E 400, 1000, 250 ms.
  EXPECT_DOUBLE_EQ(s->e2el_ms.mean, 550.0);
  EXPECT_DOUBLE_EQ(s->e2el_ms.median, 400.0);
  EXPECT_NEAR(s->e2el_ms.p99, 400 + 0.98 * 600, 1e-9);
}

TEST(SummarizeTest, EmptyAndInvalid) {
  auto empty = Summarize({});
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->completed, 0);
  EXPECT_EQ(empty->request_throughput, 0.0);
  EXPECT_EQ(empty->ttft_ms.p99, 0.0);

  std::vector<RequestRecord> r = Records();
  r[1].first_token_s = 0.4;  // before its arrival
  EXPECT_THAT(Summarize(r).status().message(), HasSubstr("request 1: times"));
  r = Records();
  r[0].token_times_s = {0.1, 0.4};
  EXPECT_THAT(Summarize(r).status().message(), HasSubstr("token_times_s has 2 entries"));
  r = Records();
  r[2].output_len = 0;
  EXPECT_THAT(Summarize(r).status().message(), HasSubstr("output_len 0"));
  // Token times are optional: without them there are no ITLs, everything else stays.
  r = Records();
  for (RequestRecord& x : r) x.token_times_s.clear();
  auto no_itl = Summarize(r);
  ASSERT_TRUE(no_itl.ok());
  EXPECT_EQ(no_itl->itl_ms.mean, 0.0);
  EXPECT_DOUBLE_EQ(no_itl->tpot_ms.mean, 325.0);
}

TEST(WritersTest, JsonHasVllmNamesInAFixedOrder) {
  auto s = Summarize(Records());
  ASSERT_TRUE(s.ok());
  const std::string text = SummaryToJson(*s);
  EXPECT_EQ(text, SummaryToJson(*s));
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(text);
  std::vector<std::string> keys;
  for (auto it = j.begin(); it != j.end(); ++it) keys.push_back(it.key());
  ASSERT_EQ(keys.size(), 9u + 4 * 5);
  EXPECT_EQ(keys[0], "completed");
  EXPECT_EQ(keys[6], "request_throughput");
  EXPECT_EQ(keys[9], "mean_ttft_ms");
  EXPECT_EQ(keys[13], "p99_ttft_ms");
  EXPECT_EQ(keys[14], "mean_tpot_ms");
  EXPECT_EQ(keys[19], "mean_itl_ms");
  EXPECT_EQ(keys[28], "p99_e2el_ms");
  EXPECT_EQ(j["completed"], 3);
  EXPECT_DOUBLE_EQ(j["median_ttft_ms"].get<double>(), 250.0);
  EXPECT_DOUBLE_EQ(j["output_throughput"].get<double>(), 4.0);
}

TEST(WritersTest, RequestAndStepCsv) {
  std::ostringstream req;
  WriteRequestsCsv(Records(), req);
  EXPECT_EQ(req.str(),
            "index,arrival_s,first_token_s,finish_s,prompt_len,output_len,hit_tokens,"
            "num_preemptions,ttft_ms,tpot_ms,e2el_ms\n"
            "0,0,0.1,0.4,10,3,0,0,100,150,400\n"
            "1,0.5,1,1.5,20,2,0,1,500,500,1000\n"
            "2,1,1.25,1.25,30,1,16,0,250,,250\n");

  std::vector<StepRecord> steps = {{0.0, 0.0125, 2, 1, 2048, 0, {0.5, 0.25}},
                                   {0.0125, 0.007, 3, 0, 3, 1, {0.75, 0.125}}};
  std::vector<std::string> pools = {"full", "sliding"};
  std::ostringstream st;
  WriteStepsCsv(steps, pools, st);
  EXPECT_EQ(st.str(),
            "time_s,duration_s,running,waiting,scheduled_tokens,preemptions,kv_usage_full,"
            "kv_usage_sliding\n"
            "0,0.0125,2,1,2048,0,0.5,0.25\n"
            "0.0125,0.007,3,0,3,1,0.75,0.125\n");
}

TEST(WritersTest, WriteTextFile) {
  const std::string path = std::string(KVPAGE_BINARY_DIR) + "/metrics_test_out.json";
  ASSERT_TRUE(WriteTextFile(path, "{}\n").ok());
  EXPECT_EQ(WriteTextFile("/nonexistent-dir/x.json", "{}").code(), absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace kvpage::sim
