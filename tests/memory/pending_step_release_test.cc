// Memory changes only between steps: ReleaseIdleChunks while a step is pending (a request
// aborted between Schedule and the forward pass) waits for the step to complete, so the
// pending step never writes into unmapped memory.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "kvpage/catalog.h"
#include "kvpage/host_memory_backing.h"
#include "kvpage/kv_cache_manager.h"
#include "kvpage/scheduler.h"

namespace kvpage {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

std::vector<int32_t> Prompt(int32_t length) {
  std::vector<int32_t> prompt(length);
  for (int32_t j = 0; j < length; ++j) prompt[j] = 11 + j;
  return prompt;
}

// Writes one byte at every slot of `slots` in the K view, as the forward pass would: faults
// (SIGSEGV) if a slot's chunk is unmapped.
void WriteSlots(const TensorView& k, int32_t block_size, const std::vector<int64_t>& slots) {
  for (int64_t slot : slots) {
    char* p = static_cast<char*>(k.base) + (slot / block_size) * k.byte_strides[0] +
              (slot % block_size) * k.byte_strides[1];
    std::memset(p, 0x5a, 1);
  }
}

TEST(PendingStepRelease, AbortedRequestsChunksStayMappedUntilTheStepCompletes) {
  const ModelSpec model = *LoadModel("qwen3-8b");
  HostMemoryBacking backing;
  KvCacheConfig config;
  config.kv_budget_bytes = 256 * kMiB;
  config.backing = &backing;
  config.max_model_len = 4096;
  auto m = *KvCacheManager::Create(model, config);
  m->NewStep();
  const RequestHandle a = *m->AddRequest({.id = RequestId(1), .prompt_tokens = Prompt(100)});
  ASSERT_TRUE(*m->AllocateSlots(a, {.num_new_tokens = 100}));
  std::vector<int64_t> slots(100);
  ASSERT_TRUE(m->FillSlotMapping(a, GroupId(0), 0, absl::MakeSpan(slots)).ok());
  const int64_t mapped = m->Usage().mapped_bytes;
  EXPECT_EQ(m->Usage().pools[0].mapped_chunks, 7);  // 100 tokens: 7 blocks, one per chunk
  // Aborted before the forward pass: its chunks are idle, the step still points at them.
  ASSERT_TRUE(m->Free(a).ok());
  EXPECT_EQ(m->ReleaseIdleChunks(), 0);
  EXPECT_EQ(m->Usage().mapped_bytes, mapped);
  for (int64_t slot : slots) {
    EXPECT_TRUE(backing.IsChunkMapped(0, static_cast<int32_t>((slot / 16 - 1))));
  }
  // The forward pass runs as planned, into mapped memory.
  const TensorView k = *backing.View(GroupId(0), 0, TensorPart::kKey);
  WriteSlots(k, 16, slots);
  // The step has run: now the chunks go back.
  m->CompleteStep();
  EXPECT_EQ(m->Usage().mapped_bytes, 0);
  EXPECT_FALSE(backing.IsChunkMapped(0, 0));
  EXPECT_TRUE(m->CheckInvariants().ok());
  // Between steps the release is immediate.
  const RequestHandle b = *m->AddRequest({.id = RequestId(2), .prompt_tokens = Prompt(40)});
  ASSERT_TRUE(*m->AllocateSlots(b, {.num_new_tokens = 40}));
  m->CompleteStep();
  ASSERT_TRUE(m->Free(b).ok());
  EXPECT_EQ(m->ReleaseIdleChunks(), 3 * m->Usage().pools[0].block_bytes);
  EXPECT_EQ(m->Usage().mapped_bytes, 0);
}

ModelOutput OneTokenEach(const SchedulerOutput& out) {
  ModelOutput result;
  result.sampled_offsets.push_back(0);
  for (const ScheduledRequest& r : out.requests) {
    if (r.samples) result.sampled_token_ids.push_back(1);
    result.sampled_offsets.push_back(static_cast<int32_t>(result.sampled_token_ids.size()));
  }
  return result;
}

// The same through the scheduler: Abort, then ReleaseIdleChunks, between Schedule and Update.
TEST(PendingStepRelease, SchedulerReleasesAtUpdate) {
  const ModelSpec model = *LoadModel("qwen3-8b");
  HostMemoryBacking backing;
  SchedulerConfig config;
  config.kv.kv_budget_bytes = 512 * kMiB;
  config.kv.backing = &backing;
  config.max_model_len = 2048;
  auto s = *Scheduler::Create(model, config);
  EXPECT_EQ(s->kv_cache().Usage().mapped_bytes, 0);  // the probe's chunks went back
  ASSERT_TRUE(s->AddRequest({.id = RequestId(1), .prompt_token_ids = Prompt(300),
                             .max_new_tokens = 4}).ok());
  const SchedulerOutput& out = s->Schedule();
  ASSERT_EQ(out.requests.size(), 1u);
  const int64_t mapped = s->kv_cache().Usage().mapped_bytes;
  EXPECT_EQ(mapped, 19 * s->kv_cache().Usage().pools[0].block_bytes);  // 300 tokens
  ASSERT_TRUE(s->Abort(RequestId(1)).ok());
  EXPECT_EQ(s->ReleaseIdleChunks(), 0);
  EXPECT_EQ(s->kv_cache().Usage().mapped_bytes, mapped);
  ASSERT_TRUE(s->Update(out, OneTokenEach(out)).ok());
  EXPECT_EQ(s->kv_cache().Usage().mapped_bytes, 0);
  EXPECT_TRUE(s->CheckInvariants().ok());
}

}  // namespace
}  // namespace kvpage
