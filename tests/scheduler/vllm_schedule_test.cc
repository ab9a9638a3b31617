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
VllmRun Make(const char* model, int64_t block_id_bytes, int64_t blocks, int64_t max_model_len,
             AccountingMode mode = AccountingMode::kVllm) {
  SchedulerConfig c;
  c.kv.mode = mode;
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


// A prompt of `len` tokens: `shared` tokens from `first`, then tokens from `tail`.
std::vector<int32_t> Prompt(int32_t first, int32_t shared, int32_t tail, int32_t len) {
  std::vector<int32_t> t;
  for (int32_t i = 0; i < len; ++i) t.push_back(i < shared ? first + i : tail + i);
  return t;
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

// One step as vllm_sched_replay.py records it: tokens per request, where each started (its
// computed count before the step), and the free block ids after scheduling.
struct Observed {
  std::map<int64_t, int32_t> scheduled;
  std::map<int64_t, int64_t> computed;
  size_t free = 0;
};

Observed Observe(Scheduler& s) {
  Observed o;
  const SchedulerOutput& out = s.Schedule();
  for (const ScheduledRequest& r : out.requests) {
    o.scheduled[r.id.value] = r.num_scheduled_tokens;
    o.computed[r.id.value] = r.num_computed_tokens;
  }
  o.free = s.kv_cache().FreeBlockOrder(GroupId(0)).size();
  ModelOutput m;
  m.sampled_offsets.push_back(0);
  for (const ScheduledRequest& r : out.requests) {
    if (r.samples) m.sampled_token_ids.push_back(5);
    m.sampled_offsets.push_back(static_cast<int32_t>(m.sampled_token_ids.size()));
  }
  EXPECT_TRUE(s.Update(out, m).ok());
  return o;
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

// qwen3.5-0.8b: three Gated DeltaNet groups and one full-attention group sharing 544-token
// blocks (6,528 KiB per block id); 100 ids. vLLM runs such a model in mamba_cache_mode
// "align" and ends every prefill chunk but a prompt's last on a block boundary
// (Scheduler._mamba_block_aligned_split). Step 1: A's 2,000 tokens fit the 2,048-token budget,
// but the chunk stops at 1,632, the last boundary before its last token; the 416 tokens left
// cannot take B (600 tokens) to a boundary, so B is held back, and nothing after it runs.
// Step 2: A's last 368 tokens, B up to 544 (the last boundary of its prompt); step 3: B's
// last 56 tokens. Each new request takes one state block per group and its attention blocks.
constexpr int64_t kQwen35BlockId = 6684672;

TEST(VllmScheduleTest, HybridChunksEndOnBlockBoundariesOrWait) {
  VllmRun run = Make("qwen3.5-0.8b", kQwen35BlockId, 100, 4096);
  ASSERT_NE(run.s, nullptr);
  Scheduler& s = *run.s;
  ASSERT_TRUE(s.AddRequest(Req(0, 1000, 2000, 2)).ok());  // A
  ASSERT_TRUE(s.AddRequest(Req(1, 5000, 600, 2)).ok());   // B
  const std::vector<std::map<int64_t, int32_t>> steps = {
      {{0, 1632}}, {{0, 368}, {1, 544}}, {{0, 1}, {1, 56}}, {{1, 1}}};
  const std::vector<size_t> free = {93, 85, 84, 94};
  for (size_t i = 0; i < steps.size(); ++i) {
    SCOPED_TRACE(i + 1);
    const Observed o = Observe(s);
    EXPECT_EQ(o.scheduled, steps[i]);
    EXPECT_EQ(o.free, free[i]);
    EXPECT_SCHED_INVARIANTS(s);
  }
  EXPECT_FALSE(s.HasUnfinishedRequests());
}

// kvpage accounting keeps its own rule on the same requests (its blocks for this model are 16
// tokens): a chunk ends on the last block boundary it reaches, a prompt's last chunk included.
// A's 2,000 tokens end on one (125 blocks) and run whole; B starts at once with the 48 tokens
// left (3 blocks), then runs to 592, its last boundary, and its last 8 tokens after that.
TEST(VllmScheduleTest, KvpageAccountingKeepsItsOwnHybridChunks) {
  VllmRun run = Make("qwen3.5-0.8b", kQwen35BlockId, 100, 4096, AccountingMode::kKvpage);
  ASSERT_NE(run.s, nullptr);
  Scheduler& s = *run.s;
  ASSERT_TRUE(s.AddRequest(Req(0, 1000, 2000, 2)).ok());
  ASSERT_TRUE(s.AddRequest(Req(1, 5000, 600, 2)).ok());
  EXPECT_EQ(Observe(s).scheduled, (std::map<int64_t, int32_t>{{0, 2000}, {1, 48}}));
  EXPECT_EQ(Observe(s).scheduled, (std::map<int64_t, int32_t>{{0, 1}, {1, 544}}));
  EXPECT_EQ(Observe(s).scheduled, (std::map<int64_t, int32_t>{{1, 8}}));
  EXPECT_SCHED_INVARIANTS(s);
}

// The junction: A (2,000 tokens) runs as 1,632 + 368, so the state is cached after 1,632
// tokens only, while its attention blocks are cached from the start. B shares A's first 1,200
// tokens: attention hits 1,088 of them, the state nothing, so vLLM ends B's first chunk at
// 1,088 (its shared-prefix boundary), where B's state is then cached; C, sharing the same
// 1,200 tokens, resumes from it.
TEST(VllmScheduleTest, HybridChunkEndsWhereFullAttentionsHitEnds) {
  VllmRun run = Make("qwen3.5-0.8b", kQwen35BlockId, 100, 4096);
  ASSERT_NE(run.s, nullptr);
  Scheduler& s = *run.s;
  ASSERT_TRUE(s.AddRequest(Req(0, 1000, 2000, 1)).ok());
  Observed o = Observe(s);
  EXPECT_EQ(o.scheduled, (std::map<int64_t, int32_t>{{0, 1632}}));
  EXPECT_EQ(o.free, 93u);
  o = Observe(s);
  EXPECT_EQ(o.scheduled, (std::map<int64_t, int32_t>{{0, 368}}));
  EXPECT_EQ(o.free, 89u);
  ASSERT_TRUE(s.AddRequest({.id = RequestId(1), .prompt_token_ids = Prompt(1000, 1200, 8000, 2000),
                            .max_new_tokens = 1}).ok());
  o = Observe(s);
  EXPECT_EQ(o.scheduled, (std::map<int64_t, int32_t>{{1, 1088}}));
  EXPECT_EQ(o.computed, (std::map<int64_t, int64_t>{{1, 0}}));
  EXPECT_EQ(o.free, 94u);
  o = Observe(s);
  EXPECT_EQ(o.scheduled, (std::map<int64_t, int32_t>{{1, 544}}));
  EXPECT_EQ(o.free, 90u);
  ASSERT_TRUE(s.AddRequest({.id = RequestId(2), .prompt_token_ids = Prompt(1000, 1200, 9000, 1500),
                            .max_new_tokens = 1}).ok());
  o = Observe(s);
  EXPECT_EQ(o.scheduled, (std::map<int64_t, int32_t>{{1, 368}, {2, 412}}));
  EXPECT_EQ(o.computed, (std::map<int64_t, int64_t>{{1, 1632}, {2, 1088}}));
  EXPECT_EQ(o.free, 80u);
  EXPECT_SCHED_INVARIANTS(s);
}

// vLLM caches a linear-attention state when the step that writes it is scheduled, but will not
// start a request from a state cached in the same step (MambaManager.cached_blocks_this_step
// in vllm/v1/core/single_type_kv_cache_manager.py): its allocation fails, and FCFS admission
// stops there. A (2,176 tokens, four blocks) runs as 1,632 + 544; B shares A's 2,176 tokens
// and C shares nothing, both added after step 1. Step 2: A's chunk caches its state after
// 2,176 tokens, which is where B's hit ends (its 2,300 tokens allow a 4-block hit), so B waits
// and C, behind it, too; free: 93 after A's 3 attention + 3 state blocks, 89 after its fourth
// block's 1 + 3. Step 3: B starts from 2,176 and computes its last 124 tokens; A's first
// decode token enters its fifth block (1 + 3 taken, its 1,632 state's 3 freed), B and C take
// 1 + 3 each: 89 - 1 - 4 - 4 = 80. Step 4: A and B both let go of the 2,176 state they
// started step 3 from, whose 3 blocks go back to the free queue: 83.
TEST(VllmScheduleTest, HitOnAStateCachedThisStepWaitsForTheNextStep) {
  VllmRun run = Make("qwen3.5-0.8b", kQwen35BlockId, 100, 4096);
  ASSERT_NE(run.s, nullptr);
  Scheduler& s = *run.s;
  ASSERT_TRUE(s.AddRequest(Req(0, 1000, 2176, 4)).ok());  // A
  Observed o = Observe(s);
  EXPECT_EQ(o.scheduled, (std::map<int64_t, int32_t>{{0, 1632}}));
  EXPECT_EQ(o.free, 93u);
  ASSERT_TRUE(s.AddRequest({.id = RequestId(1), .prompt_token_ids = Prompt(1000, 2176, 8000, 2300),
                            .max_new_tokens = 2}).ok());  // B
  ASSERT_TRUE(s.AddRequest(Req(2, 20000, 100, 2)).ok());  // C
  o = Observe(s);
  EXPECT_EQ(o.scheduled, (std::map<int64_t, int32_t>{{0, 544}}));
  EXPECT_EQ(o.free, 89u);
  o = Observe(s);
  EXPECT_EQ(o.scheduled, (std::map<int64_t, int32_t>{{0, 1}, {1, 124}, {2, 100}}));
  EXPECT_EQ(o.computed, (std::map<int64_t, int64_t>{{0, 2176}, {1, 2176}, {2, 0}}));
  EXPECT_EQ(o.free, 80u);
  o = Observe(s);
  EXPECT_EQ(o.scheduled, (std::map<int64_t, int32_t>{{0, 1}, {1, 1}, {2, 1}}));
  EXPECT_EQ(o.free, 83u);
  EXPECT_EQ(Observe(s).scheduled, (std::map<int64_t, int32_t>{{0, 1}}));
  EXPECT_FALSE(s.HasUnfinishedRequests());
  EXPECT_SCHED_INVARIANTS(s);
}

// kvpage accounting has no such rule: with its 16-token blocks A runs as 2,048 + 128, and in
// step 2 B starts from A's state after 2,048 tokens (the state after 2,176 is still being
// written), computes up to 2,176, where the prompts' known prefix ends (CacheHit::match_tokens),
// and C starts beside it with its first 96 tokens (6 blocks; the last chunk ends on a block
// boundary too).
TEST(VllmScheduleTest, KvpageAccountingStartsFromTheLastCompletedState) {
  VllmRun run = Make("qwen3.5-0.8b", kQwen35BlockId, 100, 4096, AccountingMode::kKvpage);
  ASSERT_NE(run.s, nullptr);
  Scheduler& s = *run.s;
  ASSERT_TRUE(s.AddRequest(Req(0, 1000, 2176, 4)).ok());
  EXPECT_EQ(Observe(s).scheduled, (std::map<int64_t, int32_t>{{0, 2048}}));
  ASSERT_TRUE(s.AddRequest({.id = RequestId(1), .prompt_token_ids = Prompt(1000, 2176, 8000, 2300),
                            .max_new_tokens = 2}).ok());
  ASSERT_TRUE(s.AddRequest(Req(2, 20000, 100, 2)).ok());
  const Observed o = Observe(s);
  EXPECT_EQ(o.scheduled, (std::map<int64_t, int32_t>{{0, 128}, {1, 128}, {2, 96}}));
  EXPECT_EQ(o.computed, (std::map<int64_t, int64_t>{{0, 2048}, {1, 2048}, {2, 0}}));
  EXPECT_SCHED_INVARIANTS(s);
}

// vLLM admits a request when its own whole prompt fits (scheduler_reserve_full_isl), whatever
// the running requests' prompts still need; kvpage accounting also reserves those. 13 ids:
// A (3,000 tokens) takes 3 attention blocks and 3 state blocks for its first 1,632 tokens,
// which leaves 6; B (400 tokens) needs 1 attention block and 3 state blocks, and is admitted
// in the same step, though with A's remaining 1,367 tokens it would need 3 blocks more.
TEST(VllmScheduleTest, AdmissionReservesTheRequestsOwnPromptOnly) {
  VllmRun run = Make("qwen3.5-0.8b", kQwen35BlockId, 13, 3072);
  ASSERT_NE(run.s, nullptr);
  Scheduler& s = *run.s;
  ASSERT_TRUE(s.AddRequest(Req(0, 1000, 3000, 1)).ok());  // A
  ASSERT_TRUE(s.AddRequest(Req(1, 5000, 400, 1)).ok());   // B
  const std::vector<std::map<int64_t, int32_t>> steps = {
      {{0, 1632}, {1, 400}}, {{0, 1088}}, {{0, 280}}};
  const std::vector<size_t> free = {2, 1, 0};
  for (size_t i = 0; i < steps.size(); ++i) {
    SCOPED_TRACE(i + 1);
    const Observed o = Observe(s);
    EXPECT_EQ(o.scheduled, steps[i]);
    EXPECT_EQ(o.free, free[i]);
    EXPECT_SCHED_INVARIANTS(s);
  }
  EXPECT_FALSE(s.HasUnfinishedRequests());
}

}  // namespace
}  // namespace kvpage
