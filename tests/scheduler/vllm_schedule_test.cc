// The scheduler under vllm accounting takes and frees blocks in vLLM's order. Every expected
// number is vLLM 0.33.0's answer to the same steps: its Scheduler built as
// tools/vllm_diff/vllm_sched_replay.py builds it (synchronous, prefix caching on), the same
// prompts, one sampled token per step. Block ids are given as vLLM's: Scheduler::Create probes
// the cache with a max_model_len request, which leaves the (uncached, interchangeable) free
// blocks in another order, so the i-th free block after Create is vLLM's block i + 1.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "block/manager_test_util.h"
#include "kvpage/catalog.h"
#include "kvpage/scheduler.h"
#include "scheduler/scheduler_test_util.h"

namespace kvpage {
namespace {

using ::testing::ElementsAre;

struct VllmRun {
  std::unique_ptr<Scheduler> s;
  std::map<int32_t, int32_t> to_vllm;  // kvpage block id -> vLLM's
};

// `blocks` block ids of vLLM's num_gpu_blocks (block 0 its null block), a 2,048-token budget.
VllmRun Make(const char* model, int64_t block_id_bytes, int64_t blocks, int64_t max_model_len) {
  SchedulerConfig c;
  c.kv.mode = AccountingMode::kVllm;
  c.kv.kv_budget_bytes = blocks * block_id_bytes;
  c.max_num_batched_tokens = 2048;
  c.max_model_len = max_model_len;
  VllmRun run;
  auto spec = LoadModel(model);
  EXPECT_TRUE(spec.ok()) << spec.status();
  auto s = Scheduler::Create(*spec, c);
  EXPECT_TRUE(s.ok()) << s.status();
  if (!s.ok()) return run;
  run.s = *std::move(s);
  const std::vector<BlockId> initial = run.s->kv_cache().FreeBlockOrder(GroupId(0));
  for (size_t i = 0; i < initial.size(); ++i) {
    run.to_vllm[initial[i].value] = static_cast<int32_t>(i) + 1;
  }
  return run;
}

RequestSpec Req(int64_t id, int32_t first_token, int32_t len, int32_t max_new) {
  RequestSpec r{.id = RequestId(id), .max_new_tokens = max_new};
  for (int32_t i = 0; i < len; ++i) r.prompt_token_ids.push_back(first_token + i);
  return r;
}

std::map<int64_t, int32_t> Scheduled(const SchedulerOutput& out) {
  std::map<int64_t, int32_t> m;
  for (const ScheduledRequest& r : out.requests) m[r.id.value] = r.num_scheduled_tokens;
  return m;
}

// Schedules a step and runs it with token 5 sampled wherever a request samples.
const SchedulerOutput& Step(Scheduler& s) {
  const SchedulerOutput& out = s.Schedule();
  ModelOutput m;
  m.sampled_offsets.push_back(0);
  for (const ScheduledRequest& r : out.requests) {
    if (r.samples) m.sampled_token_ids.push_back(5);
    m.sampled_offsets.push_back(static_cast<int32_t>(m.sampled_token_ids.size()));
  }
  EXPECT_TRUE(s.Update(out, m).ok());
  return out;
}

std::vector<int32_t> VllmFreeOrder(const VllmRun& run) {
  std::vector<int32_t> ids;
  for (BlockId b : run.s->kv_cache().FreeBlockOrder(GroupId(0))) ids.push_back(run.to_vllm.at(b.value));
  return ids;
}

// gemma-3-4b-it: six sliding-window groups (1,024 tokens) and one full-attention group, 16-token
// blocks; a block id spans 5 layers × 16 tokens × 4 KV heads × 256 × 2 (K, V) × 2 B = 320 KiB.
// 543 ids: the null block, 7 × 2 for A's 32 tokens, 7 × 75 for B's 1,200, and 3 left. In
// step 2, A's first decode token enters its third block (7 ids). B, last in the running order,
// has computed 1,200 tokens, so 11 blocks of each window are behind it; vLLM frees those only
// in B's own allocate_slots, after A's, so A finds 3 free ids and preempts B.
TEST(VllmScheduleTest, WindowBlocksWaitForTheirRequestsOwnAllocation) {
  VllmRun run = Make("gemma-3-4b-it", 320 << 10, 543, 1232);
  ASSERT_NE(run.s, nullptr);
  Scheduler& s = *run.s;
  ASSERT_TRUE(s.AddRequest(Req(0, 1000, 32, 8)).ok());   // A
  ASSERT_TRUE(s.AddRequest(Req(1, 5000, 1200, 4)).ok());  // B
  EXPECT_EQ(Scheduled(Step(s)), (std::map<int64_t, int32_t>{{0, 32}, {1, 1200}}));
  EXPECT_EQ(s.kv_cache().FreeBlockOrder(GroupId(0)).size(), 3u);
  const SchedulerOutput& out = Step(s);
  EXPECT_EQ(Scheduled(out), (std::map<int64_t, int32_t>{{0, 1}}));
  EXPECT_THAT(out.preempted_ids, ElementsAre(RequestId(1)));
  EXPECT_EQ(VllmFreeOrder(run).size(), 521u);
  // Step 3: B resumes from a 1,136-token hit (A's 7 ids evicted B's blocks 71-74 of group 0).
  const SchedulerOutput& third = Step(s);
  EXPECT_EQ(Scheduled(third), (std::map<int64_t, int32_t>{{0, 1}, {1, 65}}));
  EXPECT_EQ(third.requests.size(), 2u);
  for (const ScheduledRequest& r : third.requests) {
    EXPECT_EQ(r.num_computed_tokens, r.id.value == 0 ? 33 : 1136);
  }
  EXPECT_EQ(s.kv_cache().FreeBlockOrder(GroupId(0)).size(), 31u);
  EXPECT_SCHED_INVARIANTS(s);
}

// llama-3.1-8b (2 MiB per 16-token block), 100 ids. A, B, C are admitted in step 1 and take
// batch rows 0, 1, 2; when A finishes, the last row (C) moves to row 0. In step 3 B and C
// finish: vLLM frees them in its scheduling order, B before C, whatever the rows, so C's
// uncached block goes to the front of the free queue ahead of B's and its cached block to the
// back behind B's.
TEST(VllmScheduleTest, FinishedRequestsFreeInSchedulingOrder) {
  VllmRun run = Make("llama-3.1-8b", 2 << 20, 100, 1024);
  ASSERT_NE(run.s, nullptr);
  Scheduler& s = *run.s;
  ASSERT_TRUE(s.AddRequest(Req(0, 1000, 16, 1)).ok());  // A
  ASSERT_TRUE(s.AddRequest(Req(1, 2000, 16, 3)).ok());  // B
  ASSERT_TRUE(s.AddRequest(Req(2, 3000, 16, 3)).ok());  // C
  Step(s);
  EXPECT_EQ(Scheduled(Step(s)), (std::map<int64_t, int32_t>{{1, 1}, {2, 1}}));
  const SchedulerOutput& out = Step(s);
  ASSERT_EQ(out.requests.size(), 2u);
  EXPECT_EQ(out.requests[0].id, RequestId(2));  // row 0: the output's order is not vLLM's
  const std::vector<int32_t> order = VllmFreeOrder(run);
  ASSERT_EQ(order.size(), 99u);
  EXPECT_THAT(std::vector<int32_t>(order.begin(), order.begin() + 4), ElementsAre(5, 4, 6, 7));
  EXPECT_THAT(std::vector<int32_t>(order.end() - 8, order.end()),
              ElementsAre(95, 96, 97, 98, 99, 1, 2, 3));
  EXPECT_SCHED_INVARIANTS(s);
}

}  // namespace
}  // namespace kvpage
