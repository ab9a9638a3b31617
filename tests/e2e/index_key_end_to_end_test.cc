// IndexKeyEndToEnd: DeepSeek-V3.2's lightning-indexer keys served through kvpage's Scheduler on
// the host backing, with prefix caching, chunked prefill and preemption. Every scheduled token
// writes its key into each layer's index-key tensor at the slot the step's slot mapping gives
// (128 value bytes at offset · 128 of the block, the 4-byte scale at block_size · 128 +
// offset · 4, as vLLM's indexer cache lays a block out), and before that every earlier token of
// each scheduled request is read back through the request's block-table row. A key depends on
// the token, its position and the layer only, so a prefix hit must find the keys another
// request wrote; a key found anywhere else than where the table says fails the test.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <vector>

#include "block/manager_test_util.h"
#include "kvpage/host_memory_backing.h"
#include "kvpage/scheduler.h"

namespace kvpage {
namespace {

constexpr int32_t kValues = 128;     // index_head_dim of kTinyDsa
constexpr int32_t kTokenBytes = 132; // 128 fp8 values + one f32 scale

// The key bytes of the token `token` at `position` in `layer`: 128 values and 4 scale bytes.
std::vector<uint8_t> Key(int32_t token, int64_t position, int32_t layer) {
  std::vector<uint8_t> key(kTokenBytes);
  uint32_t h = static_cast<uint32_t>(token) * 2654435761u ^
               static_cast<uint32_t>(position) * 40503u ^ static_cast<uint32_t>(layer) * 97u;
  for (uint8_t& b : key) {
    h = h * 1103515245u + 12345u;
    b = static_cast<uint8_t>(h >> 16);
  }
  return key;
}

struct Harness {
  ModelSpec model = testing::TinyModel(testing::kTinyDsa);
  HostMemoryBacking backing;
  std::unique_ptr<Scheduler> scheduler;
  std::map<int64_t, std::vector<int32_t>> tokens;  // every known token of each request
  int64_t keys_read = 0, hit_tokens = 0, preemptions = 0;

  // Block `block`'s bytes in layer `layer`'s index-key tensor.
  uint8_t* Block(int32_t layer, int64_t block) {
    const TensorView v = *backing.View(GroupId(0), layer, TensorPart::kIndexKey);
    return static_cast<uint8_t*>(v.base) + block * v.byte_strides[0];
  }
  void Write(int32_t layer, int64_t slot, const std::vector<uint8_t>& key, int32_t bs) {
    uint8_t* block = Block(layer, slot / bs);
    const int64_t offset = slot % bs;
    std::memcpy(block + offset * kValues, key.data(), kValues);
    std::memcpy(block + int64_t{bs} * kValues + offset * 4, key.data() + kValues, 4);
  }
  std::vector<uint8_t> Read(int32_t layer, int64_t block_id, int64_t offset, int32_t bs) {
    const uint8_t* block = Block(layer, block_id);
    std::vector<uint8_t> key(kTokenBytes);
    std::memcpy(key.data(), block + offset * kValues, kValues);
    std::memcpy(key.data() + kValues, block + int64_t{bs} * kValues + offset * 4, 4);
    return key;
  }
};

// Reads every computed token of `r` through its table row and writes its scheduled tokens.
void ServeRequest(Harness& h, const AttentionBatch& a, const ScheduledRequest& r,
                  int64_t first_token) {
  const int32_t bs = a.kernel_block_size;
  const std::vector<int32_t>& tokens = h.tokens.at(r.id.value);
  for (int64_t p = 0; p < r.num_computed_tokens; ++p) {
    const int32_t block = a.block_table[int64_t{r.row} * a.max_blocks_per_row + p / bs];
    ASSERT_GT(block, 0) << "request " << r.id.value << " position " << p;
    for (int32_t layer = 0; layer < h.model.num_layers(); ++layer) {
      ASSERT_EQ(h.Read(layer, block, p % bs, bs), Key(tokens[p], p, layer))
          << "request " << r.id.value << " position " << p << " layer " << layer;
      ++h.keys_read;
    }
  }
  for (int32_t i = 0; i < r.num_scheduled_tokens; ++i) {
    const int64_t p = r.num_computed_tokens + i;
    const int64_t slot = a.slot_mapping[first_token + i];
    ASSERT_GE(slot, 0);
    for (int32_t layer = 0; layer < h.model.num_layers(); ++layer) {
      h.Write(layer, slot, Key(tokens[p], p, layer), bs);
    }
  }
}

TEST(IndexKeyEndToEnd, KeysFollowTheBlockTableThroughHitsAndPreemption) {
  Harness h;
  SchedulerConfig config;
  // kTinyDsa on 4 KiB host pages: a block's slice of an index-key tensor is 16 × 132 = 2,112
  // bytes, so a chunk holds 64 blocks (64 × 2,112 = 33 pages; the latent's 64 × 1,024 = 16) and
  // costs 2 layers × (33 + 16) pages = 401,408 bytes; each of the 4 tensors' null blocks takes
  // one page. One chunk then: 64 blocks, 1,024 tokens, for sixteen requests of up to
  // 40 + 150 + 48 = 238 tokens.
  config.kv.kv_budget_bytes = 4 * 4096 + 401408;
  config.kv.backing = &h.backing;
  config.max_num_batched_tokens = 48;
  config.max_model_len = 256;
  h.scheduler = *Scheduler::Create(h.model, config);
  const std::vector<int32_t> shared = testing::Tokens(40, 500);  // two and a half blocks
  for (int32_t i = 0; i < 16; ++i) {
    std::vector<int32_t> prompt = i % 2 == 0 ? shared : std::vector<int32_t>{};
    for (int32_t j = 0; j < 30 + 8 * i; ++j) prompt.push_back((i * 131 + j * 7) % 1000);
    h.tokens[i] = prompt;
    ASSERT_TRUE(h.scheduler->AddRequest({.id = RequestId(i), .prompt_token_ids = prompt,
                                         .max_new_tokens = 48}).ok());
  }
  while (h.scheduler->HasUnfinishedRequests()) {
    const SchedulerOutput& out = h.scheduler->Schedule();
    ASSERT_EQ(out.attention.size(), 1u);
    ModelOutput result;
    result.sampled_offsets.push_back(0);
    int64_t first_token = 0;  // the slot mapping is in scheduled-request order
    for (const ScheduledRequest& r : out.requests) {
      if (r.is_new && !r.resumed) h.hit_tokens += r.num_computed_tokens;
      ServeRequest(h, out.attention[0], r, first_token);
      if (::testing::Test::HasFatalFailure()) return;
      first_token += r.num_scheduled_tokens;
      if (r.samples) {
        std::vector<int32_t>& t = h.tokens.at(r.id.value);
        result.sampled_token_ids.push_back((r.id.value * 31 + static_cast<int32_t>(t.size())) % 1000);
      }
      result.sampled_offsets.push_back(static_cast<int32_t>(result.sampled_token_ids.size()));
    }
    h.preemptions += static_cast<int64_t>(out.preempted_ids.size());
    ASSERT_TRUE(h.scheduler->Update(out, result).ok());
    size_t k = 0;
    for (const ScheduledRequest& r : out.requests) {
      if (r.samples) h.tokens.at(r.id.value).push_back(result.sampled_token_ids[k++]);
    }
    ASSERT_TRUE(h.scheduler->kv_cache().CheckInvariants().ok());
  }
  // The workload exercised what it is for: keys read back, prefix hits on the shared 40
  // tokens (two full 16-token blocks, 32 tokens a hit) and preemptions.
  EXPECT_GT(h.keys_read, 0);
  EXPECT_GT(h.hit_tokens, 0);
  EXPECT_EQ(h.hit_tokens % 32, 0);
  EXPECT_GT(h.preemptions, 0);
}

}  // namespace
}  // namespace kvpage
