// CUDA-graph padding: steps padded to the next configured row and token counts with inert
// padding, and step images whose kernel arrays keep their offsets between steps of one size.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "block/manager_test_util.h"
#include "kvpage/scheduler.h"
#include "kvpage/step_image.h"

namespace kvpage {
namespace {

using testing::Tokens;
using testing::TinyModel;

SchedulerConfig GraphConfig(std::vector<int32_t> rows, std::vector<int32_t> tokens) {
  SchedulerConfig c;
  c.kv.block_size = 16;
  c.kv.kv_budget_bytes = 200 * 512;  // kTinyFull: 512 bytes per block
  c.kv.chunk_bytes = c.kv.kv_budget_bytes;
  c.max_model_len = 1024;
  c.max_num_seqs = 8;
  c.max_num_batched_tokens = 256;
  c.cuda_graph_row_sizes = std::move(rows);
  c.cuda_graph_token_sizes = std::move(tokens);
  return c;
}

// Three requests with prompts of 31, 32 and 31 tokens.
std::unique_ptr<Scheduler> ThreeRequests(const SchedulerConfig& c) {
  auto s = Scheduler::Create(TinyModel(testing::kTinyFull), c);
  EXPECT_TRUE(s.ok()) << s.status();
  if (!s.ok()) return nullptr;
  for (int i = 0; i < 3; ++i) {
    RequestSpec r;
    r.id = RequestId(i);
    r.prompt_token_ids = Tokens(31 + i % 2, 100 * i);
    r.max_new_tokens = 64;
    EXPECT_TRUE((*s)->AddRequest(r).ok());
  }
  return *std::move(s);
}

ModelOutput OneTokenEach(const SchedulerOutput& out) {
  ModelOutput m;
  for (const ScheduledRequest& r : out.requests) {
    if (r.samples) m.sampled_token_ids.push_back(7);
  }
  return m;  // every request samples: one_sample_each, no offsets needed
}

absl::Status ConfigError(std::vector<int32_t> rows, std::vector<int32_t> tokens) {
  return GraphConfig(std::move(rows), std::move(tokens)).Validate();
}

TEST(CudaGraphPaddingTest, ConfigNamesTheBadSize) {
  EXPECT_TRUE(ConfigError({1, 2, 4, 8}, {8, 64, 256}).ok());
  EXPECT_TRUE(ConfigError({}, {}).ok());
  EXPECT_EQ(ConfigError({1, 4, 2}, {}).message(),
            "cuda_graph_row_sizes[2] = 2 must be above cuda_graph_row_sizes[1] = 4 (sizes "
            "strictly increasing)");
  EXPECT_EQ(ConfigError({2, 2}, {}).message(),
            "cuda_graph_row_sizes[1] = 2 must be above cuda_graph_row_sizes[0] = 2 (sizes "
            "strictly increasing)");
  EXPECT_EQ(ConfigError({1, 16}, {}).message(),
            "cuda_graph_row_sizes[1] = 16 must be in [1, max_num_seqs = 8]");
  EXPECT_EQ(ConfigError({}, {0, 8}).message(),
            "cuda_graph_token_sizes[0] = 0 must be in [1, max_num_batched_tokens = 256]");
  EXPECT_EQ(ConfigError({}, {8, 512}).message(),
            "cuda_graph_token_sizes[1] = 512 must be in [1, max_num_batched_tokens = 256]");
  const auto created =
      Scheduler::Create(TinyModel(testing::kTinyFull), GraphConfig({-1}, {}));
  EXPECT_TRUE(absl::IsInvalidArgument(created.status())) << created.status();
}

TEST(CudaGraphPaddingTest, PadsRowsAndTokensToTheNextSizesInertly) {
  auto s = ThreeRequests(GraphConfig({1, 2, 4, 8}, {8, 16, 32, 64, 128, 256}));
  ASSERT_NE(s, nullptr);
  // Prefill: 3 rows of 31 + 32 + 31 = 94 tokens, padded to 4 rows and 128 tokens.
  const SchedulerOutput& prefill = s->Schedule();
  EXPECT_TRUE(prefill.padded);
  EXPECT_EQ(prefill.num_rows, 3);
  EXPECT_EQ(prefill.total_num_scheduled_tokens, 94);
  EXPECT_EQ(prefill.num_padded_rows, 4);
  EXPECT_EQ(prefill.num_padded_tokens, 128);
  EXPECT_EQ(prefill.query_start_loc, (std::vector<int32_t>{0, 31, 63, 94, 94}));
  EXPECT_EQ(prefill.seq_lens, (std::vector<int32_t>{31, 32, 31, 0}));
  const AttentionBatch& g = prefill.attention[0];
  ASSERT_EQ(g.slot_mapping.size(), 128u);
  for (size_t t = 94; t < 128; ++t) EXPECT_EQ(g.slot_mapping[t], -1) << t;
  ASSERT_EQ(g.block_table.size(), 4u * static_cast<size_t>(g.max_blocks_per_row));
  for (int32_t i = 0; i < g.max_blocks_per_row; ++i) {
    EXPECT_EQ(g.block_table[3 * g.max_blocks_per_row + i], 0) << i;
  }
  EXPECT_TRUE(s->CheckInvariants().ok());
  ASSERT_TRUE(s->Update(prefill, OneTokenEach(prefill)).ok());

  // Decode: 3 rows of one token each, padded to 4 rows and 8 tokens.
  const SchedulerOutput& decode = s->Schedule();
  EXPECT_TRUE(decode.padded);
  EXPECT_EQ(decode.num_padded_rows, 4);
  EXPECT_EQ(decode.num_padded_tokens, 8);
  EXPECT_EQ(decode.query_start_loc, (std::vector<int32_t>{0, 1, 2, 3, 3}));
  EXPECT_EQ(decode.seq_lens, (std::vector<int32_t>{32, 33, 32, 0}));
  EXPECT_EQ(decode.attention[0].slot_mapping.size(), 8u);
  for (size_t t = 3; t < 8; ++t) EXPECT_EQ(decode.attention[0].slot_mapping[t], -1) << t;
  ASSERT_TRUE(s->Update(decode, OneTokenEach(decode)).ok());
  EXPECT_TRUE(s->CheckInvariants().ok());
}

TEST(CudaGraphPaddingTest, AStepAboveTheLargestSizeRunsUnpadded) {
  // 3 rows against row sizes {1, 2}: not padded, whatever the tokens.
  auto s = ThreeRequests(GraphConfig({1, 2}, {256}));
  ASSERT_NE(s, nullptr);
  const SchedulerOutput& out = s->Schedule();
  EXPECT_FALSE(out.padded);
  EXPECT_EQ(out.num_padded_rows, 3);
  EXPECT_EQ(out.num_padded_tokens, 94);
  EXPECT_EQ(out.query_start_loc.size(), 4u);
  EXPECT_EQ(out.attention[0].slot_mapping.size(), 94u);
  // Tokens only: rows stay as they are, tokens are padded.
  auto t = ThreeRequests(GraphConfig({}, {100}));
  ASSERT_NE(t, nullptr);
  const SchedulerOutput& tokens_only = t->Schedule();
  EXPECT_TRUE(tokens_only.padded);
  EXPECT_EQ(tokens_only.num_padded_rows, 3);
  EXPECT_EQ(tokens_only.num_padded_tokens, 100);
  EXPECT_EQ(tokens_only.seq_lens.size(), 3u);
}

// Decode steps of one padded size (4 rows, 8 tokens) carry 1, 2 and 0 table runs (request 1
// starts block 2 first, then requests 0 and 2): the image grows only past the kernels'
// arrays, which stay at offsets 0, 32 (5 int32 padded to 32 bytes) and 48 (4 int32).
TEST(CudaGraphPaddingTest, KernelArraysKeepTheirOffsetsBetweenStepsOfOneSize) {
  auto s = ThreeRequests(GraphConfig({4}, {8, 128}));
  ASSERT_NE(s, nullptr);
  const SchedulerOutput& prefill = s->Schedule();  // 4 rows, 128 tokens
  ASSERT_TRUE(s->Update(prefill, OneTokenEach(prefill)).ok());
  std::vector<int64_t> runs, bytes;
  for (int step = 0; step < 3; ++step) {
    const SchedulerOutput& out = s->Schedule();
    const StepImageLayout layout = LayoutStepImage(out);
    EXPECT_EQ(layout.query_start_loc.offset, 0);
    EXPECT_EQ(layout.query_start_loc.count, 5);
    EXPECT_EQ(layout.seq_lens.offset, 32);
    EXPECT_EQ(layout.seq_lens.count, 4);
    EXPECT_EQ(layout.attention[0].slot_mapping.offset, 48);
    EXPECT_EQ(layout.attention[0].slot_mapping.count, 8);
    EXPECT_EQ(layout.attention[0].table_runs.offset, 48 + 64);
    runs.push_back(static_cast<int64_t>(out.attention[0].table_runs.size()));
    bytes.push_back(layout.bytes);
    ASSERT_TRUE(s->Update(out, OneTokenEach(out)).ok());
  }
  EXPECT_EQ(runs, (std::vector<int64_t>{1, 2, 0}));
  // 112 bytes of kernel arrays, then 16 bytes per run and its values padded to 16.
  EXPECT_EQ(bytes, (std::vector<int64_t>{112 + 16 + 16, 112 + 32 + 16, 112}));
}

}  // namespace
}  // namespace kvpage
