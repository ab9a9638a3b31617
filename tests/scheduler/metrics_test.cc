// Metrics: a scheduler run on a fixed clock gives exact counters and histograms, and the
// Prometheus text carries vLLM's names, cumulative buckets and escaped labels.
#include "kvpage/metrics.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "block/manager_test_util.h"
#include "kvpage/scheduler.h"

namespace kvpage {
namespace {

using ::testing::HasSubstr;
using testing::TinyModel;
using testing::Tokens;

ModelOutput OneTokenEach(const SchedulerOutput& out) {
  ModelOutput m;
  m.sampled_offsets.push_back(0);
  for (const ScheduledRequest& r : out.requests) {
    if (r.samples) m.sampled_token_ids.push_back(7);
    m.sampled_offsets.push_back(static_cast<int32_t>(m.sampled_token_ids.size()));
  }
  return m;
}

// Four requests of 20, 21, 20 and 21 prompt tokens arrive at t = 0, each for 3 new tokens;
// step k is scheduled at t = k and its tokens come back at t = k + 0.5. Request 3 is aborted
// after step 1, so steps 2 and 3 decode three requests, which finish at t = 3.5.
class MetricsRun : public ::testing::Test {
 protected:
  void SetUp() override {
    SchedulerConfig c;
    c.kv.kv_budget_bytes = 200 * 512;  // kTinyFull: 512 bytes per block
    c.kv.chunk_bytes = c.kv.kv_budget_bytes;
    c.max_model_len = 1024;
    scheduler_ = *Scheduler::Create(TinyModel(testing::kTinyFull), c);
    for (int i = 0; i < 4; ++i) {
      RequestSpec r{.id = RequestId(i), .prompt_token_ids = Tokens(20 + i % 2, 100 * i),
                    .max_new_tokens = 3};
      ASSERT_TRUE(scheduler_->AddRequest(r).ok());
      recorder_.ObserveArrival(r.id, static_cast<int64_t>(r.prompt_token_ids.size()), 0.0);
    }
    for (int step = 1; scheduler_->HasUnfinishedRequests(); ++step) {
      const SchedulerOutput& out = scheduler_->Schedule();
      recorder_.ObserveSchedule(out, step);
      recorder_.ObserveSchedule(out, step + 0.25);  // the same step again: ignored
      const ModelOutput model_output = OneTokenEach(out);
      auto result = scheduler_->Update(out, model_output);
      ASSERT_TRUE(result.ok()) << result.status();
      recorder_.ObserveUpdate(out, model_output, *result, step + 0.5);
      if (step == 1) {
        ASSERT_TRUE(scheduler_->Abort(RequestId(3)).ok());
        mid_run_ = recorder_.Snapshot(*scheduler_);
      }
    }
  }

  std::unique_ptr<Scheduler> scheduler_;
  MetricsRecorder recorder_{1024};
  Metrics mid_run_;
};

TEST_F(MetricsRun, CountsEveryTokenAndRequest) {
  const Metrics m = recorder_.Snapshot(*scheduler_);
  EXPECT_EQ(mid_run_.num_requests_running, 3);
  EXPECT_EQ(mid_run_.num_requests_waiting, 0);
  // 3 requests × 2 blocks (21 tokens and 22 of request 1) of 200.
  EXPECT_DOUBLE_EQ(mid_run_.kv_cache_usage_perc, 6.0 / 200);
  ASSERT_EQ(mid_run_.pools.size(), 1u);
  EXPECT_DOUBLE_EQ(mid_run_.pools[0].usage, 6.0 / 200);
  EXPECT_EQ(m.num_requests_running, 0);
  EXPECT_DOUBLE_EQ(m.kv_cache_usage_perc, 0);
  EXPECT_EQ(m.prompt_tokens, 82);
  EXPECT_EQ(m.prompt_tokens_cached, 0);
  EXPECT_EQ(m.prefix_cache_queries, 82);
  EXPECT_EQ(m.prefix_cache_hits, 0);
  EXPECT_EQ(m.num_preemptions, 0);
  EXPECT_EQ(m.generation_tokens, 4 + 3 + 3);
  EXPECT_EQ(m.requests_stop, 0);
  EXPECT_EQ(m.requests_length, 3);
  EXPECT_EQ(m.requests_abort, 1);
  EXPECT_EQ(m.iteration_tokens.count, 3u);
  EXPECT_EQ(m.iteration_tokens.sum, 82 + 3 + 3);
  EXPECT_EQ(m.queue_time_seconds.count, 4u);
  EXPECT_EQ(m.queue_time_seconds.sum, 4.0);
  EXPECT_EQ(m.time_to_first_token_seconds.count, 4u);
  EXPECT_EQ(m.time_to_first_token_seconds.sum, 4 * 1.5);
  EXPECT_EQ(m.e2e_latency_seconds.count, 3u);
  EXPECT_EQ(m.e2e_latency_seconds.sum, 3 * 3.5);
  EXPECT_EQ(m.request_prompt_tokens.sum, 20 + 21 + 20);
  EXPECT_EQ(m.request_generation_tokens.sum, 9);
  // 1-2-5 buckets up to max_model_len 1024: 1, 2, 5, ..., 500, 1000.
  EXPECT_EQ(m.request_prompt_tokens.upper_bounds,
            (std::vector<double>{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000}));
}

TEST_F(MetricsRun, RendersPrometheusText) {
  const std::string text = RenderPrometheus(recorder_.Snapshot(*scheduler_), "tiny");
  EXPECT_THAT(text, HasSubstr("# TYPE vllm:num_requests_running gauge\n"
                              "vllm:num_requests_running{model_name=\"tiny\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("vllm:prefix_cache_queries_total{model_name=\"tiny\"} 82\n"));
  EXPECT_THAT(text, HasSubstr("vllm:generation_tokens_total{model_name=\"tiny\"} 10\n"));
  EXPECT_THAT(text, HasSubstr(
      "vllm:request_success_total{model_name=\"tiny\",finished_reason=\"length\"} 3\n"
      "vllm:request_success_total{model_name=\"tiny\",finished_reason=\"abort\"} 1\n"));
  EXPECT_THAT(text, HasSubstr(
      "kvpage:kv_pool_usage_perc{model_name=\"tiny\",group=\"0\",kind=\"full_attention\"} 0\n"));
  // Steps of 82, 3 and 3 tokens, buckets cumulative.
  EXPECT_THAT(text, HasSubstr(
      "vllm:iteration_tokens_total_bucket{model_name=\"tiny\",le=\"1\"} 0\n"
      "vllm:iteration_tokens_total_bucket{model_name=\"tiny\",le=\"8\"} 2\n"
      "vllm:iteration_tokens_total_bucket{model_name=\"tiny\",le=\"16\"} 2\n"
      "vllm:iteration_tokens_total_bucket{model_name=\"tiny\",le=\"32\"} 2\n"
      "vllm:iteration_tokens_total_bucket{model_name=\"tiny\",le=\"64\"} 2\n"
      "vllm:iteration_tokens_total_bucket{model_name=\"tiny\",le=\"128\"} 3\n"));
  EXPECT_THAT(text, HasSubstr(
      "vllm:iteration_tokens_total_bucket{model_name=\"tiny\",le=\"+Inf\"} 3\n"
      "vllm:iteration_tokens_total_sum{model_name=\"tiny\"} 88\n"
      "vllm:iteration_tokens_total_count{model_name=\"tiny\"} 3\n"));
  // Queue time 1 s each: the bucket of 1.0, not 0.8.
  EXPECT_THAT(text, HasSubstr(
      "vllm:request_queue_time_seconds_bucket{model_name=\"tiny\",le=\"0.8\"} 0\n"
      "vllm:request_queue_time_seconds_bucket{model_name=\"tiny\",le=\"1\"} 4\n"));
}

// A request the server finishes itself counts by its reason; an aborted one only in the
// scheduler's abort count.
TEST_F(MetricsRun, CountsFinishCalls) {
  ASSERT_TRUE(scheduler_->AddRequest({.id = RequestId(9), .prompt_token_ids = Tokens(30, 900),
                                      .max_new_tokens = 8}).ok());
  recorder_.ObserveArrival(RequestId(9), 30, 10.0);
  auto f = scheduler_->Finish(RequestId(9), FinishReason::kStop);
  ASSERT_TRUE(f.ok()) << f.status();
  recorder_.ObserveFinish(*f, 12.0);
  const Metrics m = recorder_.Snapshot(*scheduler_);
  EXPECT_EQ(m.requests_stop, 1);
  EXPECT_EQ(m.e2e_latency_seconds.count, 4u);
  EXPECT_EQ(m.e2e_latency_seconds.sum, 3 * 3.5 + 2.0);
  EXPECT_EQ(m.request_prompt_tokens.sum, 20 + 21 + 20 + 30);
}

TEST(Metrics, EscapesTheModelName) {
  const std::string text = RenderPrometheus(Metrics{}, "a\"b\\c\nd");
  EXPECT_THAT(text, HasSubstr("vllm:num_requests_waiting{model_name=\"a\\\"b\\\\c\\nd\"} 0\n"));
}

TEST(Metrics, HistogramIgnoresNanAndCountsInfinityLast) {
  Histogram h = Histogram::WithBounds({1, 2});
  h.Observe(std::numeric_limits<double>::quiet_NaN());
  h.Observe(1);
  h.Observe(1.5);
  h.Observe(std::numeric_limits<double>::infinity());
  EXPECT_EQ(h.counts, (std::vector<uint64_t>{1, 1, 1}));
  EXPECT_EQ(h.count, 3u);
}

}  // namespace
}  // namespace kvpage
