// The scheduler against vLLM's scheduler scenarios (vllm.md §6.5) with exact token counts,
// plus preemption, prefix reuse, speculative decoding, bad input, and end-to-end runs of a
// sliding-window and a hybrid model with invariants checked after every call.
#include "kvpage/scheduler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <limits>

#include <map>
#include <random>
#include <set>

#include "absl/strings/str_cat.h"
#include "block/manager_test_util.h"
#include "scheduler/scheduler_test_util.h"
#include "kvpage/catalog.h"

namespace kvpage {
namespace {

using ::testing::ElementsAre;
using testing::Concat;
using testing::H;
using testing::Tokens;
using testing::TinyModel;

// kTinyFull costs 512 bytes per 16-token block: a budget of `blocks` blocks, one chunk.
SchedulerConfig TinyConfig(int32_t blocks, int32_t budget_tokens = 8192) {
  SchedulerConfig c;
  c.kv.block_size = 16;
  c.kv.kv_budget_bytes = int64_t{blocks} * 512;
  c.kv.chunk_bytes = c.kv.kv_budget_bytes;
  c.kv.hash_seed = 7;
  c.max_num_batched_tokens = budget_tokens;
  return c;
}

std::unique_ptr<Scheduler> MakeScheduler(const ModelSpec& model, const SchedulerConfig& c) {
  auto s = Scheduler::Create(model, c);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : nullptr;
}

RequestSpec Req(int64_t id, std::vector<int32_t> prompt, int32_t max_new = 16) {
  RequestSpec r;
  r.id = RequestId(id);
  r.prompt_token_ids = std::move(prompt);
  r.max_new_tokens = max_new;
  return r;
}

// Every request that reaches its last known token samples `token`.
ModelOutput SampleAll(const SchedulerOutput& out, int32_t token = 5) {
  ModelOutput m;
  m.sampled_offsets.push_back(0);
  for (const ScheduledRequest& r : out.requests) {
    if (r.samples) m.sampled_token_ids.push_back(token);
    m.sampled_offsets.push_back(static_cast<int32_t>(m.sampled_token_ids.size()));
  }
  return m;
}

// (id, tokens) of the step, in row order.
std::map<int64_t, int32_t> Scheduled(const SchedulerOutput& out) {
  std::map<int64_t, int32_t> m;
  for (const ScheduledRequest& r : out.requests) m[r.id.value] = r.num_scheduled_tokens;
  return m;
}

UpdateResult Step(Scheduler& s, int32_t token = 5) {
  const SchedulerOutput& out = s.Schedule();
  EXPECT_TRUE(s.CheckInvariants().ok()) << s.CheckInvariants();
  auto u = s.Update(out, SampleAll(out, token));
  EXPECT_TRUE(u.ok()) << u.status();
  EXPECT_TRUE(s.CheckInvariants().ok()) << s.CheckInvariants();
  return u.ok() ? *u : UpdateResult{};
}

// K1: ten small requests fit one step.
TEST(SchedulerTest, TenSmallRequestsInOneStep) {
  auto s = MakeScheduler(TinyModel(testing::kTinyFull), TinyConfig(200));
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(s->AddRequest(Req(i, Tokens(20 + i, 100 * i))).ok());
  const SchedulerOutput& out = s->Schedule();
  ASSERT_EQ(out.requests.size(), 10u);
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(out.requests[i].id, RequestId(i));
    EXPECT_EQ(out.requests[i].row, i);
    EXPECT_EQ(out.requests[i].num_scheduled_tokens, 20 + i);
    EXPECT_TRUE(out.requests[i].is_new);
    EXPECT_TRUE(out.requests[i].samples);
  }
  EXPECT_EQ(out.total_num_scheduled_tokens, 245);
  EXPECT_EQ(s->num_waiting(), 0);
  EXPECT_EQ(s->num_running(), 10);
  EXPECT_EQ(out.query_start_loc[10], 245);
  EXPECT_EQ(out.seq_lens[3], 23);
  EXPECT_SCHED_INVARIANTS(*s);
}

// K2: long_prefill_token_threshold shares the budget between long prompts.
TEST(SchedulerTest, LongPrefillThresholdSplitsPrompts) {
  SchedulerConfig c = TinyConfig(400, 1024);
  c.long_prefill_token_threshold = 400;
  auto s = MakeScheduler(TinyModel(testing::kTinyFull), c);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(s->AddRequest(Req(i, Tokens(800, 1000 * i))).ok());
  const std::map<int64_t, int32_t> s1 = {{0, 400}, {1, 400}, {2, 224}};
  const std::map<int64_t, int32_t> s3 = {{0, 1}, {1, 1}, {2, 352}};
  const SchedulerOutput& o1 = s->Schedule();
  EXPECT_EQ(Scheduled(o1), s1);
  ASSERT_TRUE(s->Update(o1, SampleAll(o1)).ok());
  const SchedulerOutput& o2 = s->Schedule();
  EXPECT_EQ(Scheduled(o2), s1);
  EXPECT_FALSE(o2.requests[0].is_new);
  EXPECT_TRUE(o2.requests[0].samples);   // 400 + 400 = 800: the prompt is done
  EXPECT_FALSE(o2.requests[2].samples);  // 448 of 800
  ASSERT_TRUE(s->Update(o2, SampleAll(o2)).ok());
  const SchedulerOutput& o3 = s->Schedule();
  EXPECT_EQ(Scheduled(o3), s3);
  EXPECT_SCHED_INVARIANTS(*s);
}

// K4: without chunked prefill, a prompt that does not fit the budget waits and nothing is
// scheduled ahead of it.
TEST(SchedulerTest, OrderWithoutChunkedPrefill) {
  for (bool chunked : {true, false}) {
    SchedulerConfig c = TinyConfig(400, 1024);
    c.max_num_seqs = 3;
    c.enable_chunked_prefill = chunked;
    auto s = MakeScheduler(TinyModel(testing::kTinyFull), c);
    ASSERT_TRUE(s->AddRequest(Req(0, Tokens(800, 0))).ok());
    ASSERT_TRUE(s->AddRequest(Req(1, Tokens(800, 1000))).ok());
    ASSERT_TRUE(s->AddRequest(Req(2, Tokens(10, 2000))).ok());
    ASSERT_TRUE(s->AddRequest(Req(3, Tokens(10, 3000))).ok());
    const SchedulerOutput& out = s->Schedule();
    if (chunked) {
      EXPECT_EQ(Scheduled(out), (std::map<int64_t, int32_t>{{0, 800}, {1, 224}}));
    } else {
      EXPECT_EQ(Scheduled(out), (std::map<int64_t, int32_t>{{0, 800}}));
    }
    EXPECT_SCHED_INVARIANTS(*s);
  }
}

// Two identical 100-token prompts in one step under vllm accounting, as in vLLM: the second
// hits the 6 blocks the first fills in that step and computes 100 mod 16 = 4 tokens. (kvpage
// accounting waits for the step to complete: step_completion_test.cc, SameStepTwinsBothCompute.)
TEST(SchedulerTest, SameStepPrefixDedup) {
  SchedulerConfig c = TinyConfig(100);
  c.kv.mode = AccountingMode::kVllm;
  auto s = MakeScheduler(TinyModel(testing::kTinyFull), c);
  ASSERT_TRUE(s->AddRequest(Req(0, Tokens(100, 7))).ok());
  ASSERT_TRUE(s->AddRequest(Req(1, Tokens(100, 7))).ok());
  const SchedulerOutput& out = s->Schedule();
  ASSERT_EQ(out.requests.size(), 2u);
  EXPECT_EQ(out.requests[0].num_scheduled_tokens, 100);
  EXPECT_EQ(out.requests[1].num_computed_tokens, 96);
  EXPECT_EQ(out.requests[1].num_scheduled_tokens, 4);
  // Both rows start with the same six blocks; the seventh differs.
  const AttentionBatch& g = out.attention[0];
  for (int b = 0; b < 6; ++b) {
    EXPECT_EQ(g.block_table[b], g.block_table[g.max_blocks_per_row + b]);
  }
  EXPECT_NE(g.block_table[6], g.block_table[g.max_blocks_per_row + 6]);
  EXPECT_EQ(s->kv_cache().prefix_cache_stats().hit_tokens, 96);
  EXPECT_SCHED_INVARIANTS(*s);
}

// A follow-up turn reuses the finished turn's full blocks.
TEST(SchedulerTest, MultiTurnReuse) {
  auto s = MakeScheduler(TinyModel(testing::kTinyFull), TinyConfig(100));
  const std::vector<int32_t> turn1 = Tokens(100, 7);
  ASSERT_TRUE(s->AddRequest(Req(0, turn1, /*max_new=*/10)).ok());
  std::vector<int32_t> outputs;
  for (int i = 0; i < 10; ++i) {
    UpdateResult u = Step(*s, 500 + i);
    outputs.push_back(500 + i);
    if (i < 9) {
      EXPECT_TRUE(u.finished.empty());
    }
  }
  EXPECT_FALSE(s->HasUnfinishedRequests());
  // 100 prompt + 9 computed outputs = 109 tokens of K/V: 6 full blocks stay cached.
  const std::vector<int32_t> turn2 = Concat(Concat(turn1, outputs), Tokens(50, 900));
  ASSERT_TRUE(s->AddRequest(Req(1, turn2)).ok());
  const SchedulerOutput& out = s->Schedule();
  ASSERT_EQ(out.requests.size(), 1u);
  EXPECT_EQ(out.requests[0].num_computed_tokens, 96);
  EXPECT_EQ(out.requests[0].num_scheduled_tokens, 160 - 96);
  EXPECT_SCHED_INVARIANTS(*s);
}

// FCFS preemption: 10 blocks, two 80-token prompts, a step budget of 100 tokens.
TEST(SchedulerTest, FcfsPreemptsTheLastRunningRequest) {
  auto s = MakeScheduler(TinyModel(testing::kTinyFull), TinyConfig(10, 100));
  ASSERT_TRUE(s->AddRequest(Req(0, Tokens(80, 0), 40)).ok());
  ASSERT_TRUE(s->AddRequest(Req(1, Tokens(80, 1000), 40)).ok());
  // Step 1: A's prompt (5 blocks); B's first 20 tokens (2 blocks), admitted because all of its
  // prompt (5 blocks) fits in the 5 left.
  const SchedulerOutput& o1 = s->Schedule();
  EXPECT_EQ(Scheduled(o1), (std::map<int64_t, int32_t>{{0, 80}, {1, 20}}));
  ASSERT_TRUE(s->Update(o1, SampleAll(o1)).ok());
  EXPECT_EQ(s->kv_cache().Usage().used_bytes, 7 * 512);
  // Step 2: A's first decode token starts its 6th block; B needs 4 more for its next 60
  // tokens but 2 are left: B, the last running request, is preempted.
  const SchedulerOutput& o2 = s->Schedule();
  EXPECT_EQ(Scheduled(o2), (std::map<int64_t, int32_t>{{0, 1}}));
  EXPECT_THAT(o2.preempted_ids, ElementsAre(RequestId(1)));
  EXPECT_EQ(s->num_waiting(), 1);
  EXPECT_EQ(s->stats().preemptions, 1);
  ASSERT_TRUE(s->Update(o2, SampleAll(o2)).ok());
  EXPECT_SCHED_INVARIANTS(*s);
  // B waits while A runs: resuming needs its first block (cached) plus 4 new ones, 5 > 4 free.
  for (int i = 0; i < 38; ++i) {
    const SchedulerOutput& o = s->Schedule();
    EXPECT_EQ(Scheduled(o), (std::map<int64_t, int32_t>{{0, 1}})) << "step " << i;
    ASSERT_TRUE(s->Update(o, SampleAll(o)).ok());
  }
  EXPECT_EQ(s->num_running(), 0);  // A finished after 40 tokens
  // B resumes from its cached first block.
  const SchedulerOutput& o3 = s->Schedule();
  ASSERT_EQ(o3.requests.size(), 1u);
  EXPECT_TRUE(o3.requests[0].resumed);
  EXPECT_EQ(o3.requests[0].num_computed_tokens, 16);
  EXPECT_EQ(o3.requests[0].num_scheduled_tokens, 64);
  EXPECT_SCHED_INVARIANTS(*s);
}

// The model's max_model_len is lowered to what the cache holds for one request; an explicit
// one that does not fit is an error.
TEST(SchedulerTest, MaxModelLenFitsTheCache) {
  auto s = MakeScheduler(TinyModel(testing::kTinyFull), TinyConfig(10));
  EXPECT_EQ(s->max_model_len(), 160);  // 10 blocks of 16 tokens
  EXPECT_EQ(s->AddRequest(Req(0, Tokens(160, 0))).code(), absl::StatusCode::kOutOfRange);
  EXPECT_TRUE(s->AddRequest(Req(0, Tokens(159, 0))).ok());
  SchedulerConfig c = TinyConfig(10);
  c.max_model_len = 200;
  auto bad = Scheduler::Create(TinyModel(testing::kTinyFull), c);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), ::testing::HasSubstr("max_model_len 200"));
  // Positions are 32-bit inside the scheduler: more than 2^30 tokens is refused up front.
  c.max_model_len = kMaxSchedulerModelLen + 1;
  auto huge = Scheduler::Create(TinyModel(testing::kTinyFull), c);
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(huge.status().message()), ::testing::HasSubstr("1073741825"));
  // Sliding windows hold only the window. 20,480 bytes; full blocks 512 B, sliding blocks
  // (2 layers) 1,024 B; steps of 64 tokens. 480 tokens: the last step (c = 448) holds 30 full
  // blocks and sliding blocks 26–29 (earlier ones are out of the 32-token window): 15,360 +
  // 4,096 = 19,456 bytes. 481 would need 31 + 5 blocks: 20,992 bytes.
  SchedulerConfig swa = TinyConfig(0, 64);
  swa.kv.kv_budget_bytes = 40 * 512;
  swa.kv.chunk_bytes = 512;
  auto w = MakeScheduler(TinyModel(testing::kTinyHybridSwa), swa);
  EXPECT_EQ(w->max_model_len(), 480);
  EXPECT_SCHED_INVARIANTS(*s);
}

// Admission waits until the whole prompt fits (no admission that must preempt itself later),
// unless reserve_full_prompt is off.
TEST(SchedulerTest, AdmissionReservesTheWholePrompt) {
  for (bool reserve : {true, false}) {
    SchedulerConfig c = TinyConfig(10, 120);
    c.reserve_full_prompt = reserve;
    auto s = MakeScheduler(TinyModel(testing::kTinyFull), c);
    ASSERT_TRUE(s->AddRequest(Req(0, Tokens(100, 0))).ok());   // 7 blocks
    ASSERT_TRUE(s->AddRequest(Req(1, Tokens(80, 1000))).ok());  // 5 blocks, 3 left
    const SchedulerOutput& out = s->Schedule();
    if (reserve) {
      EXPECT_EQ(Scheduled(out), (std::map<int64_t, int32_t>{{0, 100}}));
      EXPECT_EQ(s->num_waiting(), 1);
    } else {
      EXPECT_EQ(Scheduled(out), (std::map<int64_t, int32_t>{{0, 100}, {1, 20}}));
    }
    EXPECT_SCHED_INVARIANTS(*s);
  }
}

// vLLM's full-sequence admission gate also counts a sliding window's blocks for the whole
// prompt (up to its per-request bound); kvpage counts only what the window can hold. Window
// 32, block 16, budget 64 tokens a step, 20,480 bytes, two 150-token prompts. Step 3: A runs
// its last 22 tokens, holding 10 full blocks and 4 window blocks per sliding layer.
//   kvpage: B needs 3 full + 7 reserved (5,120 B) and 3 sliding blocks (3,072 B) of the 11,264
//           B free: admitted.
//   vllm:   one 512-byte page per layer and block id; B needs 9 pages now and 7 + 7 + 7
//           reserved (full, and each sliding layer: min(10, bound 11) − 3), 30 of 21 free:
//           waits.
TEST(SchedulerTest, VllmAdmissionGateCountsSlidingWindows) {
  for (AccountingMode mode : {AccountingMode::kKvpage, AccountingMode::kVllm}) {
    SchedulerConfig c = TinyConfig(40, 64);
    c.kv.mode = mode;
    c.kv.chunk_bytes = 512;
    auto s = MakeScheduler(TinyModel(testing::kTinyHybridSwa), c);
    ASSERT_NE(s, nullptr);
    ASSERT_TRUE(s->AddRequest(Req(0, Tokens(150, 0))).ok());
    ASSERT_TRUE(s->AddRequest(Req(1, Tokens(150, 1000))).ok());
    Step(*s);
    Step(*s);
    const SchedulerOutput& out = s->Schedule();
    if (mode == AccountingMode::kKvpage) {
      EXPECT_EQ(Scheduled(out), (std::map<int64_t, int32_t>{{0, 22}, {1, 42}}));
    } else {
      EXPECT_EQ(Scheduled(out), (std::map<int64_t, int32_t>{{0, 22}}));
    }
    EXPECT_SCHED_INVARIANTS(*s);
  }
}

// Priority preemption: the worst request goes, even when it is not last.
TEST(SchedulerTest, PriorityPreemptsTheWorstRequest) {
  SchedulerConfig c = TinyConfig(6);
  c.policy = SchedulingPolicy::kPriority;
  auto s = MakeScheduler(TinyModel(testing::kTinyFull), c);
  RequestSpec low = Req(0, Tokens(32, 0), 50);
  low.priority = 5;
  ASSERT_TRUE(s->AddRequest(low).ok());
  Step(*s);  // low: 2 blocks, 33 tokens
  RequestSpec high = Req(1, Tokens(32, 1000), 50);
  high.priority = 0;
  high.arrival_time = 1.0;
  ASSERT_TRUE(s->AddRequest(high).ok());
  // low decodes (its token 33 takes its 3rd block), high is admitted (2 blocks): 5 of 6 used.
  const SchedulerOutput& o1 = s->Schedule();
  EXPECT_EQ(Scheduled(o1), (std::map<int64_t, int32_t>{{0, 1}, {1, 32}}));
  ASSERT_TRUE(s->Update(o1, SampleAll(o1)).ok());
  // Both decode; low runs first in queue order and fills to 48 tokens, high's 33rd token
  // takes the last block.
  for (int i = 0; i < 15; ++i) Step(*s);
  EXPECT_EQ(s->num_running(), 2);
  EXPECT_EQ(s->kv_cache().Usage().used_bytes, 6 * 512);
  // low's token 50 needs a 4th block: the worst running request is low itself; high, after
  // it in the queue, still decodes in this step.
  const SchedulerOutput& o2 = s->Schedule();
  EXPECT_THAT(o2.preempted_ids, ElementsAre(RequestId(0)));
  EXPECT_EQ(Scheduled(o2), (std::map<int64_t, int32_t>{{1, 1}}));
  ASSERT_TRUE(s->Update(o2, SampleAll(o2)).ok());
  EXPECT_SCHED_INVARIANTS(*s);
}

// A hybrid model's prompt runs in two chunks, the first ending on the last block boundary, so
// the recurrent state there is snapshotted and the next turn resumes from it.
TEST(SchedulerTest, HybridPromptsEndChunksOnBlockBoundaries) {
  SchedulerConfig c = TinyConfig(0);
  c.kv.kv_budget_bytes = 1 << 20;
  c.kv.chunk_bytes = 16 << 10;
  auto s = MakeScheduler(TinyModel(testing::kTinyGdn), c);
  const std::vector<int32_t> turn1 = Tokens(100, 7);
  ASSERT_TRUE(s->AddRequest(Req(0, turn1, 3)).ok());
  const SchedulerOutput& o1 = s->Schedule();
  ASSERT_EQ(o1.requests.size(), 1u);
  EXPECT_EQ(o1.requests[0].num_scheduled_tokens, 96);
  EXPECT_FALSE(o1.requests[0].samples);
  ASSERT_EQ(o1.slots_to_zero.size(), 1u);  // the new state starts from zeros
  ASSERT_TRUE(s->Update(o1, SampleAll(o1)).ok());
  const SchedulerOutput& o2 = s->Schedule();
  EXPECT_EQ(o2.requests[0].num_scheduled_tokens, 4);
  EXPECT_TRUE(o2.requests[0].samples);
  // The step after the snapshot reads it and writes a fresh slot.
  EXPECT_NE(o2.states[0].read_slots[0], o2.states[0].write_slots[0]);
  ASSERT_TRUE(s->Update(o2, SampleAll(o2, 11)).ok());
  Step(*s, 12);
  Step(*s, 13);
  EXPECT_FALSE(s->HasUnfinishedRequests());
  ASSERT_TRUE(s->AddRequest(Req(1, Concat(Concat(turn1, {11, 12, 13}), Tokens(40, 500)))).ok());
  const SchedulerOutput& o3 = s->Schedule();
  ASSERT_EQ(o3.requests.size(), 1u);
  EXPECT_EQ(o3.requests[0].num_computed_tokens, 96);
  EXPECT_EQ(o3.requests[0].num_scheduled_tokens, 128 - 96);  // 143 tokens: up to 128 first
  EXPECT_SCHED_INVARIANTS(*s);
}

TEST(SchedulerTest, RowsStayDenseWhenRequestsFinish) {
  auto s = MakeScheduler(TinyModel(testing::kTinyFull), TinyConfig(100));
  ASSERT_TRUE(s->AddRequest(Req(0, Tokens(20, 0), 1)).ok());
  ASSERT_TRUE(s->AddRequest(Req(1, Tokens(20, 100), 5)).ok());
  ASSERT_TRUE(s->AddRequest(Req(2, Tokens(20, 200), 5)).ok());
  UpdateResult u = Step(*s);
  ASSERT_EQ(u.finished.size(), 1u);
  EXPECT_EQ(u.finished[0].id, RequestId(0));
  EXPECT_EQ(u.finished[0].reason, FinishReason::kLength);
  const SchedulerOutput& out = s->Schedule();
  EXPECT_THAT(out.row_moves, ElementsAre(std::make_pair(2, 0)));
  EXPECT_THAT(out.finished_ids, ElementsAre(RequestId(0)));
  ASSERT_EQ(out.requests.size(), 2u);
  EXPECT_EQ(out.requests[0].id, RequestId(2));
  EXPECT_EQ(out.requests[0].row, 0);
  EXPECT_EQ(out.requests[1].id, RequestId(1));
  EXPECT_SCHED_INVARIANTS(*s);
}

TEST(SchedulerTest, StopTokenAndMaxModelLenFinish) {
  SchedulerConfig c = TinyConfig(100);
  c.max_model_len = 24;
  auto s = MakeScheduler(TinyModel(testing::kTinyFull), c);
  RequestSpec a = Req(0, Tokens(20, 0), 100);
  a.stop_token_ids = {9};
  ASSERT_TRUE(s->AddRequest(a).ok());
  ASSERT_TRUE(s->AddRequest(Req(1, Tokens(20, 100), 100)).ok());
  Step(*s, 5);
  UpdateResult u = Step(*s, 9);
  ASSERT_EQ(u.finished.size(), 1u);
  EXPECT_EQ(u.finished[0].reason, FinishReason::kStop);
  EXPECT_EQ(u.finished[0].num_output_tokens, 2);
  Step(*s, 5);
  u = Step(*s, 5);  // 20 + 4 = 24 tokens
  ASSERT_EQ(u.finished.size(), 1u);
  EXPECT_EQ(u.finished[0].id, RequestId(1));
  EXPECT_EQ(u.finished[0].reason, FinishReason::kMaxModelLen);
  EXPECT_EQ(s->kv_cache().Usage().used_bytes, 0);
}

// More drafts than num_speculative_tokens are refused, naming the request, not cut short.
TEST(SchedulerTest, DraftsBeyondNumSpeculativeTokensAreRefused) {
  SchedulerConfig c = TinyConfig(100);
  c.num_speculative_tokens = 2;
  auto s = MakeScheduler(TinyModel(testing::kTinyFull), c);
  ASSERT_TRUE(s->AddRequest(Req(4, Tokens(30, 0), 20)).ok());
  const SchedulerOutput& o1 = s->Schedule();
  ModelOutput m1 = SampleAll(o1);
  m1.draft_token_ids = {40, 41, 42};
  m1.draft_offsets = {0, 3};
  const absl::Status st = s->Update(o1, m1).status();
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_EQ(st.message(), "request 4 proposes 3 draft tokens, more than num_speculative_tokens 2");
  m1.draft_token_ids = {40, 41};
  m1.draft_offsets = {0, 2};
  ASSERT_TRUE(s->Update(o1, m1).ok());
  EXPECT_EQ(s->Schedule().requests[0].num_draft_tokens, 2);
  EXPECT_SCHED_INVARIANTS(*s);
}

// Drafts: 1 + 2 tokens per step; rejected drafts are recomputed.
TEST(SchedulerTest, SpeculativeDraftsAndRollback) {
  SchedulerConfig c = TinyConfig(100);
  c.num_speculative_tokens = 2;
  auto s = MakeScheduler(TinyModel(testing::kTinyFull), c);
  ASSERT_TRUE(s->AddRequest(Req(0, Tokens(30, 0), 20)).ok());
  const SchedulerOutput& o1 = s->Schedule();
  ModelOutput m1 = SampleAll(o1);
  m1.draft_token_ids = {40, 41};
  m1.draft_offsets = {0, 2};
  ASSERT_TRUE(s->Update(o1, m1).ok());
  const SchedulerOutput& o2 = s->Schedule();
  ASSERT_EQ(o2.requests.size(), 1u);
  EXPECT_EQ(o2.requests[0].num_computed_tokens, 30);
  EXPECT_EQ(o2.requests[0].num_scheduled_tokens, 3);
  EXPECT_EQ(o2.requests[0].num_draft_tokens, 2);
  EXPECT_EQ(o2.attention[0].slot_mapping.size(), 3u);
  // One draft accepted plus the bonus token: 2 sampled, 1 rejected.
  ModelOutput m2;
  m2.sampled_token_ids = {40, 77};
  m2.sampled_offsets = {0, 2};
  auto u = s->Update(o2, m2);
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(u->stats.num_accepted_drafts, 1);
  EXPECT_EQ(u->stats.num_rejected_drafts, 1);
  const SchedulerOutput& o3 = s->Schedule();
  EXPECT_EQ(o3.requests[0].num_computed_tokens, 32);  // 30 + token 31 + accepted draft
  EXPECT_EQ(o3.requests[0].num_scheduled_tokens, 1);
  // Too many tokens for the drafts scheduled: rejected, nothing changes.
  ModelOutput bad;
  bad.sampled_token_ids = {1, 2};
  bad.sampled_offsets = {0, 2};
  EXPECT_EQ(s->Update(o3, bad).status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(s->Update(o3, SampleAll(o3)).ok());
  EXPECT_SCHED_INVARIANTS(*s);
}

// Accepted drafts stop at the first token that ends the request: a stop token (kept as output)
// or the length limit. Request 0 samples 40, then the stop token 9, then 77: 9 ends it with 3
// outputs. Request 1 may output 2 tokens: of the 3 it samples, only the first is kept.
TEST(SchedulerTest, AcceptedDraftsEndAtAStopTokenOrTheLength) {
  SchedulerConfig c = TinyConfig(100);
  c.num_speculative_tokens = 2;
  auto s = MakeScheduler(TinyModel(testing::kTinyFull), c);
  RequestSpec a = Req(0, Tokens(30, 0), 20);
  a.stop_token_ids = {9};
  ASSERT_TRUE(s->AddRequest(a).ok());
  ASSERT_TRUE(s->AddRequest(Req(1, Tokens(30, 100), 2)).ok());
  const SchedulerOutput& o1 = s->Schedule();
  ModelOutput m1 = SampleAll(o1);
  m1.draft_token_ids = {40, 41, 40, 41};
  m1.draft_offsets = {0, 2, 4};
  ASSERT_TRUE(s->Update(o1, m1).ok());
  const SchedulerOutput& o2 = s->Schedule();
  ASSERT_EQ(o2.requests.size(), 2u);
  EXPECT_EQ(o2.requests[0].num_draft_tokens, 2);
  EXPECT_EQ(o2.requests[1].num_draft_tokens, 2);  // drafts are not limited by max_new_tokens
  ModelOutput m2;
  m2.sampled_token_ids = {40, 9, 77, 6, 7, 8};
  m2.sampled_offsets = {0, 3, 6};
  const absl::StatusOr<UpdateResult> u = s->Update(o2, m2);
  ASSERT_TRUE(u.ok()) << u.status();
  ASSERT_EQ(u->finished.size(), 2u);
  EXPECT_EQ(u->finished[0].id, RequestId(0));
  EXPECT_EQ(u->finished[0].reason, FinishReason::kStop);
  EXPECT_EQ(u->finished[0].num_output_tokens, 3);
  EXPECT_EQ(u->finished[1].id, RequestId(1));
  EXPECT_EQ(u->finished[1].reason, FinishReason::kLength);
  EXPECT_EQ(u->finished[1].num_output_tokens, 2);
  EXPECT_SCHED_INVARIANTS(*s);
}

// A server may leave sampled_offsets empty when the output says every request samples one
// token: the same steps as with the offsets 0, 1, …, n. Where a request does not sample (a
// prompt chunk), empty offsets are rejected, naming the counts, and nothing changes.
TEST(SchedulerTest, SampledOffsetsMayBeLeftOutWhenEveryRequestSamplesOne) {
  SchedulerConfig c = TinyConfig(200, 64);
  auto with = MakeScheduler(TinyModel(testing::kTinyFull), c);
  auto without = MakeScheduler(TinyModel(testing::kTinyFull), c);
  for (Scheduler* s : {with.get(), without.get()}) {
    ASSERT_TRUE(s->AddRequest(Req(0, Tokens(20, 0), 40)).ok());
    ASSERT_TRUE(s->AddRequest(Req(1, Tokens(100, 500), 40)).ok());  // chunked: 44, then 56
  }
  // Step 1: request 1's first chunk does not sample.
  const SchedulerOutput& first = without->Schedule();
  ASSERT_EQ(first.requests.size(), 2u);
  EXPECT_FALSE(first.requests[1].samples);
  EXPECT_FALSE(first.one_sample_each);
  ModelOutput two_tokens;
  two_tokens.sampled_token_ids = {5, 5};
  const absl::StatusOr<UpdateResult> rejected = without->Update(first, two_tokens);
  EXPECT_EQ(rejected.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(rejected.status().message(),
              ::testing::HasSubstr("sampled offsets are empty with 2 sampled tokens for 2"));
  ASSERT_TRUE(without->Update(first, SampleAll(first)).ok());
  Step(*with);
  int steps = 0;
  int steps_without_offsets = 0;
  std::vector<std::pair<int64_t, int32_t>> finished_with, finished_without;  // (id, outputs)
  while (with->HasUnfinishedRequests() && steps < 100) {
    const SchedulerOutput& a = with->Schedule();
    const SchedulerOutput& b = without->Schedule();
    ASSERT_EQ(a.requests.size(), b.requests.size());
    ASSERT_EQ(a.one_sample_each, b.one_sample_each);
    for (size_t g = 0; g < a.attention.size(); ++g) {
      EXPECT_EQ(a.attention[g].slot_mapping, b.attention[g].slot_mapping) << "step " << steps;
    }
    const int32_t token = 7 + steps;
    ModelOutput m = SampleAll(b, token);
    if (b.one_sample_each) {
      m.sampled_offsets.clear();
      ++steps_without_offsets;
    }
    const absl::StatusOr<UpdateResult> ua = with->Update(a, SampleAll(a, token));
    const absl::StatusOr<UpdateResult> ub = without->Update(b, m);
    ASSERT_TRUE(ua.ok()) << ua.status();
    ASSERT_TRUE(ub.ok()) << ub.status();
    for (const FinishedRequest& f : ua->finished) {
      finished_with.push_back({f.id.value, f.num_output_tokens});
    }
    for (const FinishedRequest& f : ub->finished) {
      finished_without.push_back({f.id.value, f.num_output_tokens});
    }
    EXPECT_SCHED_INVARIANTS(*with);
    EXPECT_SCHED_INVARIANTS(*without);
    ++steps;
  }
  // After the first step, both requests sample every step until each has its 40 tokens:
  // request 0 one at step 1 and 39 more, request 1 its 40 from step 2 on.
  EXPECT_EQ(steps, 40);
  EXPECT_EQ(steps_without_offsets, 40);
  EXPECT_THAT(finished_with, ElementsAre(std::pair<int64_t, int32_t>{0, 40},
                                         std::pair<int64_t, int32_t>{1, 40}));
  EXPECT_EQ(finished_without, finished_with);
  EXPECT_FALSE(without->HasUnfinishedRequests());
}


TEST(SchedulerTest, BadInputIsRejected) {
  auto s = MakeScheduler(TinyModel(testing::kTinyFull), TinyConfig(100));
  ASSERT_TRUE(s->AddRequest(Req(0, Tokens(20, 0))).ok());
  EXPECT_EQ(s->AddRequest(Req(0, Tokens(20, 0))).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(s->AddRequest(Req(1, {})).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s->AddRequest(Req(-3, {1})).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s->AddRequest(Req(1, {3, -4})).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s->AddRequest(Req(1, Tokens(4096, 0))).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(s->AddRequest(Req(1, Tokens(5, 0), 0)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s->Abort(RequestId(9)).code(), absl::StatusCode::kNotFound);
  const SchedulerOutput& out = s->Schedule();
  ModelOutput wrong;
  wrong.sampled_token_ids = {1};
  wrong.sampled_offsets = {0, 0, 1};
  EXPECT_EQ(s->Update(out, wrong).status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(s->Update(out, SampleAll(out)).ok());
  EXPECT_EQ(s->Update(out, SampleAll(out)).status().code(), absl::StatusCode::kFailedPrecondition);
  SchedulerConfig c = TinyConfig(100);
  c.max_num_seqs = 0;
  EXPECT_EQ(Scheduler::Create(TinyModel(testing::kTinyFull), c).status().code(),
            absl::StatusCode::kInvalidArgument);
  c = TinyConfig(100);
  c.num_speculative_tokens = 2;
  EXPECT_EQ(Scheduler::Create(TinyModel(testing::kTinyGdn), c).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_SCHED_INVARIANTS(*s);
}

// Token ids outside the model's vocabulary, arrival times that are not finite (they would
// break the priority order) and drafts when speculative decoding is off are refused with the
// value named, and nothing changes (issue 25).
TEST(SchedulerTest, ValuesOutsideTheirRangeAreRefused) {
  ModelSpec model = TinyModel(testing::kTinyFull);
  model.vocab_size = 1000;
  auto s = MakeScheduler(model, TinyConfig(100));
  absl::Status st = s->AddRequest(Req(1, {5, 1000}));
  EXPECT_TRUE(absl::IsInvalidArgument(st));
  EXPECT_EQ(st.message(), "request 1 prompt: token id 1000 is not below the model's vocab_size 1000");
  for (double t : {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity(),
                   -std::numeric_limits<double>::infinity()}) {
    RequestSpec r = Req(2, Tokens(4, 0));
    r.arrival_time = t;
    st = s->AddRequest(r);
    EXPECT_TRUE(absl::IsInvalidArgument(st));
    EXPECT_EQ(st.message(), absl::StrCat("request 2: arrival_time must be finite, got ", t));
  }
  EXPECT_FALSE(s->HasUnfinishedRequests());
  ASSERT_TRUE(s->AddRequest(Req(3, Tokens(20, 0))).ok());
  const SchedulerOutput& out = s->Schedule();
  ASSERT_EQ(out.requests.size(), 1u);
  ModelOutput m = SampleAll(out, 1000);
  st = s->Update(out, m).status();
  EXPECT_EQ(st.message(), "sampled token id 1000 is not below the model's vocab_size 1000");
  m = SampleAll(out, 999);
  m.draft_token_ids = {7};
  m.draft_offsets = {0, 1};
  st = s->Update(out, m).status();
  EXPECT_TRUE(absl::IsInvalidArgument(st));
  EXPECT_EQ(st.message(), "the model output carries 1 draft tokens but speculative decoding is "
                          "off (num_speculative_tokens 0)");
  EXPECT_EQ(s->kv_cache().Tokens(H(s->kv_cache(), RequestId(3)))->size(), 20u);
  ASSERT_TRUE(s->Update(out, SampleAll(out, 999)).ok());
  EXPECT_EQ(s->kv_cache().Tokens(H(s->kv_cache(), RequestId(3)))->back(), 999);
  EXPECT_SCHED_INVARIANTS(*s);
}

// In a plain decode step every request samples one token; a result of another shape is
// rejected naming the request (or the offset), and nothing changes.
TEST(SchedulerTest, DecodeStepChecksEveryRequestsSamples) {
  auto s = MakeScheduler(TinyModel(testing::kTinyFull), TinyConfig(100));
  for (int64_t id = 0; id < 3; ++id) ASSERT_TRUE(s->AddRequest(Req(id, Tokens(20, 100 * id))).ok());
  const SchedulerOutput& prefill = s->Schedule();
  ASSERT_TRUE(s->Update(prefill, SampleAll(prefill)).ok());
  const SchedulerOutput& out = s->Schedule();
  ASSERT_EQ(out.requests.size(), 3u);
  ModelOutput m;
  m.sampled_token_ids = {7, 8, 9};
  m.sampled_offsets = {0, 1, 1, 3};  // request 1 samples none, request 2 two
  auto u = s->Update(out, m);
  EXPECT_TRUE(absl::IsInvalidArgument(u.status()));
  EXPECT_THAT(std::string(u.status().message()), ::testing::HasSubstr("request 1 must sample 1 to 1"));
  m.sampled_offsets = {0, 1, 0, 3};
  u = s->Update(out, m);
  EXPECT_THAT(std::string(u.status().message()), ::testing::HasSubstr("decrease at 1"));
  m.sampled_offsets = {0, 1, 2, 3};
  m.sampled_token_ids = {7, -8, 9};
  EXPECT_TRUE(absl::IsInvalidArgument(s->Update(out, m).status()));
  m.sampled_token_ids = {7, 8};  // two tokens for three requests
  m.sampled_offsets = {0, 1, 2, 2};
  EXPECT_TRUE(absl::IsInvalidArgument(s->Update(out, m).status()));
  EXPECT_SCHED_INVARIANTS(*s);
  // Nothing was applied: each request still has 21 tokens, and the right result goes through.
  for (const ScheduledRequest& r : out.requests) {
    EXPECT_EQ(r.num_computed_tokens, 20);
    EXPECT_EQ(s->kv_cache().Tokens(H(s->kv_cache(), r.id))->size(), 21u);
  }
  m.sampled_token_ids = {7, 8, 9};
  m.sampled_offsets = {0, 1, 2, 3};
  ASSERT_TRUE(s->Update(out, m).ok());
  EXPECT_EQ(s->kv_cache().Tokens(H(s->kv_cache(), RequestId(2)))->back(), 9);
  EXPECT_EQ(s->kv_cache().Tokens(H(s->kv_cache(), RequestId(0)))->size(), 22u);
  EXPECT_SCHED_INVARIANTS(*s);
}

// max_new_tokens may be as large as int32 allows: the request runs until max_model_len, and
// admission reserves token room for max_model_len tokens, not for max_new_tokens more.
TEST(SchedulerTest, LargestMaxNewTokensRunsToMaxModelLen) {
  auto s = MakeScheduler(TinyModel(testing::kTinyFull), TinyConfig(10));
  ASSERT_EQ(s->max_model_len(), 160);
  ASSERT_TRUE(s->AddRequest(Req(0, Tokens(150, 0), std::numeric_limits<int32_t>::max())).ok());
  std::vector<FinishedRequest> finished;
  for (int step = 0; step < 40 && finished.empty(); ++step) {
    const SchedulerOutput& out = s->Schedule();
    auto u = s->Update(out, SampleAll(out));
    ASSERT_TRUE(u.ok()) << u.status();
    finished = u->finished;
    EXPECT_SCHED_INVARIANTS(*s);
  }
  ASSERT_EQ(finished.size(), 1u);
  EXPECT_EQ(finished[0].reason, FinishReason::kMaxModelLen);
  EXPECT_EQ(finished[0].num_output_tokens, 10);  // 150 + 10 = 160 tokens
  EXPECT_EQ(s->kv_cache().Usage().used_bytes, 0);
}

TEST(SchedulerTest, AbortFreesAtOnce) {
  auto s = MakeScheduler(TinyModel(testing::kTinyFull), TinyConfig(100));
  ASSERT_TRUE(s->AddRequest(Req(0, Tokens(40, 0))).ok());
  ASSERT_TRUE(s->AddRequest(Req(1, Tokens(40, 100))).ok());
  const SchedulerOutput& out = s->Schedule();
  ASSERT_TRUE(s->Abort(RequestId(0)).ok());  // between Schedule and Update
  ASSERT_TRUE(s->AddRequest(Req(2, Tokens(40, 200))).ok());
  EXPECT_SCHED_INVARIANTS(*s);
  ASSERT_TRUE(s->Update(out, SampleAll(out)).ok());  // request 0's result is dropped
  // Request 1 moved to request 0's row; its sample still goes in.
  EXPECT_EQ(s->kv_cache().Tokens(H(s->kv_cache(), RequestId(1)))->size(), 41u);
  ASSERT_TRUE(s->Abort(RequestId(2)).ok());          // waiting
  const SchedulerOutput& next = s->Schedule();
  EXPECT_THAT(next.finished_ids, ElementsAre(RequestId(0), RequestId(2)));
  EXPECT_EQ(s->stats().aborted, 2);
  ASSERT_TRUE(s->Update(next, SampleAll(next)).ok());
  ASSERT_TRUE(s->Abort(RequestId(1)).ok());
  EXPECT_EQ(s->kv_cache().Usage().used_bytes, 0);
  EXPECT_FALSE(s->HasUnfinishedRequests());
  EXPECT_SCHED_INVARIANTS(*s);
}

// Multimodal items reach the KV cache's hashes: the same 384 placeholder tokens behind a
// different image share only the 64 tokens before the image; behind the same image, all but
// the last block (the last token is always computed). Overlapping items are refused.
TEST(SchedulerTest, MultimodalItemsDecideWhatIsShared) {
  auto s = MakeScheduler(TinyModel(testing::kTinyFull), TinyConfig(200));
  const std::vector<int32_t> prompt = Tokens(384, 7);
  auto with_image = [&](int64_t id, std::string image) {
    RequestSpec r = Req(id, prompt, /*max_new=*/1);
    r.mm_items.push_back({.identifier = std::move(image), .offset = 64, .length = 256});
    return r;
  };
  auto computed_at_admission = [&](RequestSpec r) -> int64_t {
    EXPECT_TRUE(s->AddRequest(std::move(r)).ok());
    const SchedulerOutput& out = s->Schedule();
    EXPECT_EQ(out.requests.size(), 1u);
    const int64_t c = out.requests.empty() ? -1 : out.requests[0].num_computed_tokens;
    EXPECT_TRUE(s->Update(out, SampleAll(out)).ok());
    EXPECT_TRUE(s->CheckInvariants().ok()) << s->CheckInvariants();
    return c;
  };
  EXPECT_EQ(computed_at_admission(with_image(0, "img-a")), 0);
  EXPECT_EQ(computed_at_admission(with_image(1, "img-b")), 64);
  EXPECT_EQ(computed_at_admission(with_image(2, "img-a")), 368);
  RequestSpec plain = Req(3, prompt, /*max_new=*/1);
  plain.skip_prefix_cache_read = true;
  EXPECT_EQ(computed_at_admission(std::move(plain)), 0);

  RequestSpec overlap = with_image(4, "img-a");
  overlap.mm_items.push_back({.identifier = "img-c", .offset = 300, .length = 10});
  const absl::Status st = s->AddRequest(std::move(overlap));
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_EQ(st.message(),
            "request 4: multimodal item 1 ('img-c') at offset 300 overlaps item 0 ('img-a'), "
            "which ends at 320");
  RequestSpec outside = with_image(5, "img-a");
  outside.mm_items[0].length = 400;
  EXPECT_TRUE(absl::IsInvalidArgument(s->AddRequest(std::move(outside))));
  EXPECT_FALSE(s->HasUnfinishedRequests());
}

// max_loras 2: requests with adapters 1, 2, 3, 1 and none. Adapter 3 waits while 1 and 2
// run; the 1 and the plain request behind it start in the first step. Once adapter 2's
// request finishes, 3 runs.
TEST(SchedulerTest, MaxLorasPassesOverAThirdAdapter) {
  SchedulerConfig c = TinyConfig(100);
  c.max_loras = 2;
  auto s = MakeScheduler(TinyModel(testing::kTinyFull), c);
  const int64_t adapters[] = {1, 2, 3, 1, 0};
  for (int i = 0; i < 5; ++i) {
    RequestSpec r = Req(i, Tokens(20, 100 * i), /*max_new=*/i == 1 ? 1 : 3);
    r.lora_id = adapters[i];
    ASSERT_TRUE(s->AddRequest(std::move(r)).ok());
  }
  const SchedulerOutput& first = s->Schedule();
  EXPECT_THAT(Scheduled(first), ::testing::ElementsAre(::testing::Pair(0, 20), ::testing::Pair(1, 20),
                                                         ::testing::Pair(3, 20), ::testing::Pair(4, 20)));
  EXPECT_EQ(s->num_waiting(), 1);
  ASSERT_TRUE(s->Update(first, SampleAll(first)).ok());  // request 1 (adapter 2) finishes
  EXPECT_SCHED_INVARIANTS(*s);
  const SchedulerOutput& second = s->Schedule();
  EXPECT_EQ(Scheduled(second).count(2), 1u);
  EXPECT_EQ(s->num_waiting(), 0);
  ASSERT_TRUE(s->Update(second, SampleAll(second)).ok());
  EXPECT_SCHED_INVARIANTS(*s);
  c.max_loras = -1;
  EXPECT_EQ(Scheduler::Create(TinyModel(testing::kTinyFull), c).status().message(),
            "max_loras must be >= 0 (0 = no limit), got -1");
}

// Finish ends a request for the server's reason, with its FinishedRequest: the second turn
// of a conversation hit 96 cached tokens at admission; a waiting request never ran.
TEST(SchedulerTest, FinishEndsARequestWithItsReasonAndCachedTokens) {
  auto s = MakeScheduler(TinyModel(testing::kTinyFull), TinyConfig(100));
  ASSERT_TRUE(s->AddRequest(Req(0, Tokens(100, 7), /*max_new=*/1)).ok());
  UpdateResult first = Step(*s);
  ASSERT_EQ(first.finished.size(), 1u);
  EXPECT_EQ(first.finished[0].num_cached_tokens, 0);
  ASSERT_TRUE(s->AddRequest(Req(1, Concat(Tokens(100, 7), Tokens(30, 900)))).ok());
  ASSERT_TRUE(s->AddRequest(Req(2, Tokens(40, 300))).ok());
  const SchedulerOutput& out = s->Schedule();
  ASSERT_EQ(out.requests.size(), 2u);
  // Between Schedule and Update, as Abort: the step's output stays as it was.
  absl::StatusOr<FinishedRequest> f = s->Finish(RequestId(1), FinishReason::kStop);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->id, RequestId(1));
  EXPECT_EQ(f->reason, FinishReason::kStop);
  EXPECT_EQ(f->num_output_tokens, 0);
  EXPECT_EQ(f->num_cached_tokens, 96);
  EXPECT_SCHED_INVARIANTS(*s);
  ASSERT_TRUE(s->Update(out, SampleAll(out)).ok());
  ASSERT_TRUE(s->AddRequest(Req(3, Tokens(40, 600))).ok());
  f = s->Finish(RequestId(3), FinishReason::kAborted);  // waiting: counted as an abort
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->num_cached_tokens, 0);
  f = s->Finish(RequestId(2), FinishReason::kLength);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->num_output_tokens, 1);
  EXPECT_EQ(s->Finish(RequestId(2), FinishReason::kStop).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(s->stats().finished, 3);
  EXPECT_EQ(s->stats().aborted, 1);
  EXPECT_THAT(s->Schedule().finished_ids, ElementsAre(RequestId(1), RequestId(3), RequestId(2)));
  EXPECT_EQ(s->kv_cache().Usage().used_bytes, 0);
  EXPECT_FALSE(s->HasUnfinishedRequests());
  EXPECT_SCHED_INVARIANTS(*s);
}

// An abort between Schedule and Update of a steady decode step moves the last row into the
// aborted one's place: Update must still give each request its own sampled token.
TEST(SchedulerTest, AbortInASteadyStepKeepsEachTokenWithItsRequest) {
  auto s = MakeScheduler(TinyModel(testing::kTinyFull), TinyConfig(100));
  for (int64_t id = 0; id < 3; ++id) {
    ASSERT_TRUE(s->AddRequest(Req(id, Tokens(40, static_cast<int32_t>(100 * id)))).ok());
  }
  // Decode until every step is one token per request, rows in admission order.
  const SchedulerOutput* out = &s->Schedule();
  while (out->total_num_scheduled_tokens != 3) {
    ASSERT_TRUE(s->Update(*out, SampleAll(*out)).ok());
    out = &s->Schedule();
  }
  ASSERT_EQ(out->requests.size(), 3u);
  for (int32_t k = 0; k < 3; ++k) {
    EXPECT_EQ(out->requests[k].id, RequestId(k));
    EXPECT_EQ(out->requests[k].row, k);
  }
  const size_t len1 = s->kv_cache().Tokens(H(s->kv_cache(), RequestId(1)))->size();
  const size_t len2 = s->kv_cache().Tokens(H(s->kv_cache(), RequestId(2)))->size();
  ASSERT_TRUE(s->Abort(RequestId(0)).ok());  // request 2's row moves to row 0
  ModelOutput m;
  m.sampled_token_ids = {70, 71, 72};
  m.sampled_offsets = {0, 1, 2, 3};
  ASSERT_TRUE(s->Update(*out, m).ok());
  EXPECT_EQ(s->kv_cache().Tokens(H(s->kv_cache(), RequestId(1)))->size(), len1 + 1);
  EXPECT_EQ(s->kv_cache().Tokens(H(s->kv_cache(), RequestId(1)))->back(), 71);
  EXPECT_EQ(s->kv_cache().Tokens(H(s->kv_cache(), RequestId(2)))->size(), len2 + 1);
  EXPECT_EQ(s->kv_cache().Tokens(H(s->kv_cache(), RequestId(2)))->back(), 72);
  EXPECT_SCHED_INVARIANTS(*s);
}

// The server may run the output after an abort moved rows: the output's block tables stay
// those of the step it describes (ModelEndToEnd.AbortsAtEveryPointOfAStep runs such steps).
TEST(SchedulerTest, AbortBeforeTheForwardPassLeavesTheOutputsTablesAlone) {
  auto s = MakeScheduler(TinyModel(testing::kTinyFull), TinyConfig(100));
  for (int64_t id = 0; id < 3; ++id) {
    ASSERT_TRUE(s->AddRequest(Req(id, Tokens(40, static_cast<int32_t>(100 * id)))).ok());
  }
  const SchedulerOutput& out = s->Schedule();
  ASSERT_EQ(out.num_rows, 3);
  const std::vector<int32_t> before(out.attention[0].block_table.begin(),
                                    out.attention[0].block_table.end());
  ASSERT_TRUE(s->Abort(RequestId(0)).ok());  // request 2's row moves to row 0 in the scheduler
  ASSERT_TRUE(s->Abort(RequestId(1)).ok());
  EXPECT_THAT(std::vector<int32_t>(out.attention[0].block_table.begin(),
                                   out.attention[0].block_table.end()),
              ::testing::ElementsAreArray(before));
  ASSERT_TRUE(s->Update(out, SampleAll(out)).ok());
  const SchedulerOutput& next = s->Schedule();  // the live table again: request 2 in row 0
  ASSERT_EQ(next.num_rows, 1);
  EXPECT_EQ(next.attention[0].block_table[0], before[2 * out.attention[0].max_blocks_per_row]);
  EXPECT_SCHED_INVARIANTS(*s);
}

// Steady decode steps write only the positions of entries that a steady step wrote before
// (Scheduler::Impl::static_rows); every row change must make the next step write whole
// entries again. Requests finish at different steps (the last row moves into each hole),
// one is aborted and two are admitted meanwhile; every entry of every step is checked against
// what the test tracks on its own: the row each request holds (from row_moves), its token
// count, whether it is new.
// One attention group, and two (full attention and a sliding window, whose releases send
// rows through WriteRow).
void CheckSteadyStepsAsRowsMove(const char* model) {
  SchedulerConfig c = TinyConfig(400);
  c.kv.chunk_bytes = 4096;  // chunks for each pool of the hybrid
  auto s = MakeScheduler(TinyModel(model), c);
  ASSERT_NE(s, nullptr);
  std::map<int64_t, int32_t> tokens;  // id -> tokens held (prompt + sampled)
  std::map<int64_t, int32_t> row_of;  // id -> row
  std::vector<int64_t> owner;         // row -> id
  std::set<int64_t> reported;         // ids reported once (no longer new)
  auto add = [&](int64_t id, int32_t max_new) {
    ASSERT_TRUE(s->AddRequest(Req(id, Tokens(20, static_cast<int32_t>(100 * id)), max_new)).ok());
    tokens[id] = 20;
  };
  const int32_t max_new[] = {3, 5, 8, 13, 21, 34};
  for (int64_t id = 0; id < 6; ++id) add(id, max_new[id]);
  int32_t steady_steps = 0;
  for (int32_t step = 0; step < 60 && s->HasUnfinishedRequests(); ++step) {
    if (step == 10) add(6, 12);
    if (step == 16) add(7, 4);
    const SchedulerOutput& out = s->Schedule();
    EXPECT_SCHED_INVARIANTS(*s);
    for (const auto& [from, to] : out.row_moves) {  // in order: a move may free `from`
      ASSERT_LT(static_cast<size_t>(from), owner.size());
      const int64_t mover = owner[static_cast<size_t>(from)];
      row_of[mover] = to;
      owner[static_cast<size_t>(to)] = mover;
      owner[static_cast<size_t>(from)] = -1;
    }
    owner.assign(static_cast<size_t>(out.num_rows), -1);
    for (const auto& [id, row] : row_of) {
      if (row < out.num_rows) owner[static_cast<size_t>(row)] = id;
    }
    const bool steady = out.total_num_scheduled_tokens == out.num_rows;
    steady_steps += steady;
    for (size_t k = 0; k < out.requests.size(); ++k) {
      const ScheduledRequest& r = out.requests[k];
      const int64_t id = r.id.value;
      ASSERT_TRUE(tokens.count(id)) << "step " << step << " entry " << k;
      if (!row_of.count(id)) {  // admitted this step: the next free row
        EXPECT_FALSE(reported.count(id));
        row_of[id] = r.row;
        ASSERT_LT(r.row, out.num_rows);
        owner[static_cast<size_t>(r.row)] = id;
      }
      EXPECT_EQ(r.row, row_of[id]) << "step " << step << " request " << id;
      EXPECT_EQ(owner[static_cast<size_t>(r.row)], id) << "step " << step << " row " << r.row;
      EXPECT_EQ(r.is_new, !reported.count(id)) << "step " << step << " request " << id;
      EXPECT_FALSE(r.resumed);
      EXPECT_EQ(r.num_draft_tokens, 0);
      EXPECT_EQ(r.num_computed_tokens + r.num_scheduled_tokens, tokens[id])
          << "step " << step << " request " << id;
      EXPECT_TRUE(r.samples);
      if (steady) {
        EXPECT_EQ(k, static_cast<size_t>(r.row));
        EXPECT_EQ(r.num_scheduled_tokens, 1);
        EXPECT_EQ(out.query_start_loc[k], static_cast<int32_t>(k));
        EXPECT_EQ(out.seq_lens[k], tokens[id]);
      }
      reported.insert(id);
    }
    // Request 4 is aborted between Schedule and Update at step 12: its row goes to the last.
    if (step == 12) {
      ASSERT_TRUE(s->Abort(RequestId(4)).ok());
    }
    auto u = s->Update(out, SampleAll(out));
    ASSERT_TRUE(u.ok()) << u.status();
    for (const ScheduledRequest& r : out.requests) {
      if (r.id.value != 4 || step != 12) ++tokens[r.id.value];
    }
    if (step == 12) {
      tokens.erase(4);
      row_of.erase(4);
    }
    for (const FinishedRequest& f : u->finished) {
      tokens.erase(f.id.value);
      row_of.erase(f.id.value);
    }
    EXPECT_SCHED_INVARIANTS(*s);
  }
  EXPECT_FALSE(s->HasUnfinishedRequests());
  EXPECT_GE(steady_steps, 30);
  EXPECT_EQ(s->kv_cache().Usage().used_bytes, 0);
}
TEST(SchedulerTest, SteadyStepsReportEachRowsRequestAsRowsMove) {
  CheckSteadyStepsAsRowsMove(testing::kTinyFull);
}
TEST(SchedulerTest, SteadyStepsReportEachRowsRequestAsRowsMoveWithAWindow) {
  CheckSteadyStepsAsRowsMove(testing::kTinyHybridSwa);
}

// A fake forward pass: checks every slot the step writes is inside a block of the request's
// own row, that no two tokens of the step write one slot, and samples random tokens.
class FakeModel {
 public:
  explicit FakeModel(uint32_t seed) : rng_(seed) {}

  ModelOutput Run(const SchedulerOutput& out) {
    CheckRowOrder(out);
    CheckTableRuns(out);
    for (const AttentionBatch& g : out.attention) {
      std::set<int64_t> slots;
      size_t t = 0;
      for (const ScheduledRequest& r : out.requests) {
        EXPECT_EQ(out.query_start_loc[r.row], static_cast<int32_t>(t));
        EXPECT_EQ(out.seq_lens[r.row], r.num_computed_tokens + r.num_scheduled_tokens);
        const int32_t* row = g.block_table.data() + static_cast<size_t>(r.row) * g.max_blocks_per_row;
        for (int64_t pos = r.num_computed_tokens; pos < r.num_computed_tokens + r.num_scheduled_tokens;
             ++pos, ++t) {
          const int64_t slot = g.slot_mapping[t];
          const int32_t block = row[pos / g.kernel_block_size];
          EXPECT_GT(block, 0) << "request " << r.id.value << " pos " << pos;
          EXPECT_EQ(slot, int64_t{block} * g.kernel_block_size + pos % g.kernel_block_size);
          EXPECT_TRUE(slots.insert(slot).second) << "slot " << slot << " written twice";
        }
        // A sliding window's tokens read only blocks inside the window.
        if (g.window > 0) {
          const int64_t first = std::max<int64_t>(0, r.num_computed_tokens - g.window + 1);
          for (int64_t b = first / g.kernel_block_size;
               b <= (r.num_computed_tokens + r.num_scheduled_tokens - 1) / g.kernel_block_size; ++b) {
            EXPECT_GT(row[b], 0) << "window block " << b << " of request " << r.id.value;
          }
        }
      }
      EXPECT_EQ(t, g.slot_mapping.size());
    }
    for (const StateBatch& sb : out.states) {
      std::set<int32_t> writes;
      for (const ScheduledRequest& r : out.requests) {
        EXPECT_GE(sb.read_slots[r.row], 0);
        EXPECT_TRUE(writes.insert(sb.write_slots[r.row]).second)
            << "state slot " << sb.write_slots[r.row] << " written twice";
      }
    }
    ModelOutput m;
    m.sampled_offsets.push_back(0);
    for (const ScheduledRequest& r : out.requests) {
      if (r.samples) m.sampled_token_ids.push_back(static_cast<int32_t>(rng_() % 50));
      m.sampled_offsets.push_back(static_cast<int32_t>(m.sampled_token_ids.size()));
    }
    return m;
  }

 private:
  // Scheduled requests are in row order.
  void CheckRowOrder(const SchedulerOutput& out) {
    for (size_t k = 1; k < out.requests.size(); ++k) {
      EXPECT_LT(out.requests[k - 1].row, out.requests[k].row);
    }
  }

  // A device copy patched with each step's table runs only equals the whole block table, and
  // is zero in every row past the running ones.
  void CheckTableRuns(const SchedulerOutput& out) {
    if (device_.size() < out.attention.size()) device_.resize(out.attention.size());
    for (size_t a = 0; a < out.attention.size(); ++a) {
      const AttentionBatch& g = out.attention[a];
      std::vector<int32_t>& copy = device_[a];
      for (const TableRun& run : g.table_runs) {
        const size_t need = static_cast<size_t>(run.row + 1) * g.max_blocks_per_row;
        if (copy.size() < need) copy.resize(need, 0);
      }
      const absl::Status applied = ApplyTableRuns(g, absl::MakeSpan(copy));
      ASSERT_TRUE(applied.ok()) << applied;
      const size_t used = g.block_table.size();
      if (copy.size() < used) copy.resize(used, 0);
      ASSERT_TRUE(std::equal(g.block_table.begin(), g.block_table.end(), copy.begin()))
          << "group " << a << " step " << out.step;
      EXPECT_TRUE(std::all_of(copy.begin() + used, copy.end(), [](int32_t v) { return v == 0; }))
          << "group " << a << " step " << out.step;
    }
  }

  std::mt19937 rng_;
  std::vector<std::vector<int32_t>> device_;  // [group]: the block table as runs patch it
};

// Random requests (half sharing prefixes) through a small cache until all finish, invariants
// after every call; at the end every block is free.
struct RunStats {
  int64_t preemptions = 0;
  int64_t hit_tokens = 0;
  int64_t steps = 0;
};

void RunToCompletion(const ModelSpec& model, SchedulerConfig c, uint32_t seed,
                     RunStats* stats) {
  auto s = MakeScheduler(model, c);
  ASSERT_NE(s, nullptr);
  std::mt19937 rng(seed);
  FakeModel fake(seed);
  const std::vector<int32_t> shared = Tokens(200, 3);
  int64_t next_id = 0;
  int64_t finished = 0;
  for (int step = 0; step < 5000 && (next_id < 60 || s->HasUnfinishedRequests()); ++step) {
    if (next_id < 60 && rng() % 2 == 0) {
      const int32_t len = 1 + static_cast<int32_t>(rng() % 300);
      std::vector<int32_t> prompt =
          rng() % 2 ? Concat(std::vector<int32_t>(shared.begin(), shared.begin() + rng() % 200),
                             Tokens(len, 1000 + 400 * static_cast<int32_t>(next_id)))
                    : Tokens(len, 1000 + 400 * static_cast<int32_t>(next_id));
      RequestSpec r = Req(next_id++, prompt, 1 + static_cast<int32_t>(rng() % 60));
      r.priority = static_cast<int32_t>(rng() % 3);
      r.arrival_time = step;
      ASSERT_TRUE(s->AddRequest(r).ok());
    }
    const SchedulerOutput& out = s->Schedule();
    EXPECT_SCHED_INVARIANTS(*s);
    ModelOutput m = fake.Run(out);
    auto u = s->Update(out, m);
    ASSERT_TRUE(u.ok()) << u.status();
    finished += static_cast<int64_t>(u->finished.size());
    EXPECT_SCHED_INVARIANTS(*s);
    if (::testing::Test::HasFailure()) return;
  }
  EXPECT_EQ(finished, 60);
  EXPECT_FALSE(s->HasUnfinishedRequests());
  EXPECT_EQ(s->kv_cache().Usage().used_bytes, 0);
  EXPECT_EQ(s->kv_cache().num_requests(), 0);
  stats->preemptions = s->stats().preemptions;
  stats->hit_tokens = s->kv_cache().prefix_cache_stats().hit_tokens;
  stats->steps = static_cast<int64_t>(s->stats().steps);
}

TEST(SchedulerEndToEnd, FullAttentionUnderPressure) {
  SchedulerConfig c = TinyConfig(60, 256);
  c.max_num_seqs = 8;
  RunStats fcfs, priority;
  RunToCompletion(TinyModel(testing::kTinyFull), c, 1, &fcfs);
  c.policy = SchedulingPolicy::kPriority;
  RunToCompletion(TinyModel(testing::kTinyFull), c, 2, &priority);
  // The cache is small enough that both runs preempt, and shared prefixes hit.
  EXPECT_GT(fcfs.preemptions, 0);
  EXPECT_GT(priority.preemptions, 0);
  EXPECT_GT(fcfs.hit_tokens, 0);
}

TEST(SchedulerEndToEnd, SlidingWindowModel) {
  SchedulerConfig c = TinyConfig(0, 128);
  c.kv.kv_budget_bytes = 120 * 512 * 3;
  c.kv.chunk_bytes = 8 * 512;
  c.max_num_seqs = 8;
  c.kernel_block_size = 8;  // two kernel blocks per cache block
  RunStats stats;
  RunToCompletion(TinyModel(testing::kTinyHybridSwa), c, 3, &stats);
  EXPECT_GT(stats.hit_tokens, 0);
}

// Blocks of 24 tokens (not a power of two) in three kernel blocks of 8: the decode rows'
// slots, computed from the row's last block, must match the tables (FakeModel checks every
// slot against its row).
TEST(SchedulerEndToEnd, BlockSizeNotAPowerOfTwo) {
  SchedulerConfig c = TinyConfig(0, 128);
  c.kv.block_size = 24;
  c.kv.kv_budget_bytes = 120 * 768 * 3;
  c.kv.chunk_bytes = 8 * 768;
  c.max_num_seqs = 8;
  c.kernel_block_size = 8;
  RunStats stats;
  RunToCompletion(TinyModel(testing::kTinyHybridSwa), c, 6, &stats);
  EXPECT_GT(stats.hit_tokens, 0);
}

TEST(SchedulerEndToEnd, HybridRecurrentModel) {
  SchedulerConfig c = TinyConfig(0, 128);
  c.kv.kv_budget_bytes = 1 << 20;
  c.kv.chunk_bytes = 16 << 10;
  c.max_num_seqs = 8;
  RunStats stats;
  RunToCompletion(TinyModel(testing::kTinyGdn), c, 4, &stats);
  EXPECT_GT(stats.hit_tokens, 0);  // resumed from state snapshots
}

// The real configs: Gemma 3 (sliding window 1,024) and Qwen3.5 (Gated DeltaNet) end to end.
TEST(SchedulerEndToEnd, RealGemmaAndQwen35) {
  for (const char* name : {"gemma-3-4b-it", "qwen3.5-0.8b"}) {
    auto model = LoadModel(name);
    ASSERT_TRUE(model.ok()) << model.status();
    SchedulerConfig c;
    c.kv.kv_budget_bytes = int64_t{512} << 20;
    c.kv.chunk_bytes = int64_t{8} << 20;
    c.kv.hash_seed = 1;
    c.max_num_batched_tokens = 512;
    c.max_num_seqs = 16;
    c.max_model_len = 4096;
    SCOPED_TRACE(name);
    RunStats stats;
    RunToCompletion(*model, c, 5, &stats);
  }
}

// Schedule() again before Update() returns the pending step unchanged: nothing is scheduled
// twice, and applying it lets every request finish.
TEST(SchedulerTest, ScheduleTwiceReturnsThePendingStep) {
  auto s = MakeScheduler(TinyModel(testing::kTinyFull), TinyConfig(64));
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(s->AddRequest(Req(i, Tokens(20, 100 * i), 4)).ok());
  const SchedulerOutput& first = s->Schedule();
  const uint64_t step = first.step;
  EXPECT_EQ(first.total_num_scheduled_tokens, 60);
  const SchedulerOutput& again = s->Schedule();
  EXPECT_EQ(&again, &first);
  EXPECT_EQ(again.step, step);
  EXPECT_EQ(again.total_num_scheduled_tokens, 60);
  EXPECT_SCHED_INVARIANTS(*s);
  ASSERT_TRUE(s->Update(again, SampleAll(again)).ok());
  int finished = 0;
  for (int i = 0; i < 10 && s->HasUnfinishedRequests(); ++i) {
    finished += static_cast<int>(Step(*s).finished.size());
  }
  EXPECT_EQ(finished, 3);
  EXPECT_EQ(s->kv_cache().Usage().used_bytes, 0);
}

// A request aborted between Schedule() and Update(): the server may leave out its sample.
TEST(SchedulerTest, AbortBeforeUpdateDropsTheMissingSample) {
  auto s = MakeScheduler(TinyModel(testing::kTinyFull), TinyConfig(64));
  ASSERT_TRUE(s->AddRequest(Req(1, Tokens(30, 0), 4)).ok());
  ASSERT_TRUE(s->AddRequest(Req(2, Tokens(20, 500), 4)).ok());
  const SchedulerOutput& out = s->Schedule();
  ASSERT_EQ(out.requests.size(), 2u);
  ASSERT_TRUE(s->Abort(RequestId(1)).ok());
  EXPECT_SCHED_INVARIANTS(*s);
  ModelOutput m;
  m.sampled_token_ids = {7};        // request 2's token only
  m.sampled_offsets = {0, 0, 1};
  auto u = s->Update(out, m);
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(s->kv_cache().Tokens(H(s->kv_cache(), 2))->back(), 7);
  // A sample for a request that is still running is not optional.
  const SchedulerOutput& next = s->Schedule();
  EXPECT_THAT(next.finished_ids, ElementsAre(RequestId(1)));
  ModelOutput none;
  none.sampled_offsets = {0, 0};
  EXPECT_TRUE(absl::IsInvalidArgument(s->Update(next, none).status()));
  EXPECT_SCHED_INVARIANTS(*s);
}

// Without chunked prefill a prompt runs whole: max_model_len may not exceed the token budget.
TEST(SchedulerTest, PolicyOutsideTheEnumIsInvalid) {
  SchedulerConfig c = TinyConfig(64);
  c.policy = static_cast<SchedulingPolicy>(9);
  EXPECT_TRUE(absl::IsInvalidArgument(c.Validate()));
}

TEST(SchedulerTest, UnchunkedPrefillBoundsMaxModelLen) {
  SchedulerConfig c = TinyConfig(400, 256);
  c.enable_chunked_prefill = false;
  c.max_model_len = 1024;
  EXPECT_TRUE(absl::IsInvalidArgument(Scheduler::Create(TinyModel(testing::kTinyFull), c).status()));
  c.max_model_len = 0;  // the model's 4,096, lowered to the budget
  auto s = MakeScheduler(TinyModel(testing::kTinyFull), c);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->max_model_len(), 256);
  EXPECT_TRUE(absl::IsOutOfRange(s->AddRequest(Req(1, Tokens(300)))));
}

// A max_model_len far beyond the budget is refused from the growing groups' size alone (no
// probe prompt of that length is built).
TEST(SchedulerTest, HugeMaxModelLenIsRefusedWithoutAProbe) {
  SchedulerConfig c = TinyConfig(64);
  c.max_model_len = kMaxSchedulerModelLen;
  auto s = Scheduler::Create(TinyModel(testing::kTinyFull), c);
  ASSERT_TRUE(absl::IsInvalidArgument(s.status())) << s.status();
  EXPECT_THAT(std::string(s.status().message()), ::testing::HasSubstr("max_model_len 1073741824"));
}

}  // namespace
}  // namespace kvpage
