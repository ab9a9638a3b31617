// The server step shown in docs/manager_api.md §2 ("How a server drives one step"): the code
// between the markers below is the doc's sample, compiled and run here, and a test checks the
// doc still shows exactly this code.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kvpage/catalog.h"
#include "kvpage/scheduler.h"
#include "testing/doc_sample.h"

namespace kvpage {
namespace {

// A stand-in forward pass: one token for every request that reached its last known token.
ModelOutput RunForwardPass(const SchedulerOutput& out) {
  ModelOutput result;
  result.sampled_offsets.push_back(0);
  for (const ScheduledRequest& r : out.requests) {
    if (r.samples) result.sampled_token_ids.push_back(7);
    result.sampled_offsets.push_back(static_cast<int32_t>(result.sampled_token_ids.size()));
  }
  return result;
}

// Serves `prompts` to completion; returns how many requests finished.
absl::StatusOr<int64_t> Serve(const ModelSpec& model,
                              const std::vector<std::vector<int32_t>>& prompts) {
  // [server step]
  SchedulerConfig config;
  config.kv.kv_budget_bytes = int64_t{1} << 30;  // KV memory for all pools
  config.max_num_batched_tokens = 2048;
  absl::StatusOr<std::unique_ptr<Scheduler>> created = Scheduler::Create(model, config);
  if (!created.ok()) return created.status();
  Scheduler& scheduler = **created;
  for (size_t i = 0; i < prompts.size(); ++i) {
    absl::Status added = scheduler.AddRequest(
        {.id = RequestId(i), .prompt_token_ids = prompts[i], .max_new_tokens = 8});
    if (!added.ok()) return added;  // names the bad value: empty prompt, duplicate id, ...
  }
  int64_t finished = 0;
  while (scheduler.HasUnfinishedRequests()) {
    const SchedulerOutput& out = scheduler.Schedule();
    // Before the forward pass: zero out.slots_to_zero (new recurrent-state slots). The
    // pass reads, per attention group g, out.attention[g].block_table (one row per
    // running request), writes new K/V at out.attention[g].slot_mapping, and uses
    // out.query_start_loc and out.seq_lens per row.
    ModelOutput sampled = RunForwardPass(out);
    absl::StatusOr<UpdateResult> step = scheduler.Update(out, sampled);
    if (!step.ok()) return step.status();
    finished += static_cast<int64_t>(step->finished.size());  // their blocks are free already
  }
  // [server step end]
  return finished;
}

TEST(ServerStepExample, ServesEveryRequest) {
  auto model = LoadModel("qwen3-8b");
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 20; ++i) prompts.push_back(std::vector<int32_t>(100 + 37 * i, i));
  absl::StatusOr<int64_t> finished = Serve(*model, prompts);
  ASSERT_TRUE(finished.ok()) << finished.status();
  EXPECT_EQ(*finished, 20);
  prompts.push_back({});
  EXPECT_EQ(Serve(*model, prompts).status().code(), absl::StatusCode::kInvalidArgument);
}

// The doc shows the code between the markers, line for line.
TEST(ServerStepExample, DocShowsThisCode) {
  const absl::Status shown =
      testing::DocShowsSample("docs/manager_api.md",
                              "tests/scheduler/server_step_example_test.cc", "server step");
  EXPECT_TRUE(shown.ok()) << shown;
}

}  // namespace
}  // namespace kvpage
