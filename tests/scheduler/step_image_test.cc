// Step images: every array of the output at its offset, and a steady decode step uploads only
// the table entries that changed.
#include "kvpage/step_image.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "block/manager_test_util.h"
#include "kvpage/scheduler.h"

namespace kvpage {
namespace {

using testing::Tokens;
using testing::TinyModel;

template <typename T>
std::vector<T> Read(const std::vector<std::byte>& image, const ImageArray& a) {
  EXPECT_EQ(a.offset % kStepImageAlignment, 0);
  std::vector<T> v(static_cast<size_t>(a.count));
  if (a.count > 0) std::memcpy(v.data(), image.data() + a.offset, v.size() * sizeof(T));
  return v;
}

std::unique_ptr<Scheduler> FourRequests(int32_t prompt_len) {
  SchedulerConfig c;
  c.kv.block_size = 16;
  c.kv.kv_budget_bytes = 200 * 512;  // kTinyFull: 512 bytes per block
  c.kv.chunk_bytes = c.kv.kv_budget_bytes;
  c.max_model_len = 1024;
  auto s = Scheduler::Create(TinyModel(testing::kTinyFull), c);
  EXPECT_TRUE(s.ok()) << s.status();
  for (int i = 0; i < 4; ++i) {
    RequestSpec r;
    r.id = RequestId(i);
    r.prompt_token_ids = Tokens(prompt_len + i % 2, 100 * i);
    r.max_new_tokens = 64;
    EXPECT_TRUE((*s)->AddRequest(r).ok());
  }
  return s.ok() ? *std::move(s) : nullptr;
}

ModelOutput OneTokenEach(const SchedulerOutput& out) {
  ModelOutput m;
  for (const ScheduledRequest& r : out.requests) {
    if (r.samples) m.sampled_token_ids.push_back(7);
  }
  if (!out.one_sample_each) {
    m.sampled_offsets.push_back(0);
    int32_t k = 0;
    for (const ScheduledRequest& r : out.requests) m.sampled_offsets.push_back(k += r.samples);
  }
  return m;
}

TEST(StepImageTest, HoldsEveryArrayOfTheStep) {
  auto s = FourRequests(20);  // prompts of 20, 21, 20, 21 tokens: two blocks each
  ASSERT_NE(s, nullptr);
  const SchedulerOutput& out = s->Schedule();
  const StepImageLayout layout = LayoutStepImage(out);
  // query_start_loc 5 x 4 B (padded to 32), seq_lens 16, slot_mapping 82 x 8 = 656, four
  // two-entry runs 64 and their 8 values 32.
  EXPECT_EQ(layout.bytes, 32 + 16 + 656 + 64 + 32);
  std::vector<std::byte> image(static_cast<size_t>(layout.bytes));
  ASSERT_TRUE(WriteStepImage(out, absl::MakeSpan(image)).ok());
  const AttentionBatch& g = out.attention[0];
  ASSERT_EQ(layout.attention.size(), 1u);
  EXPECT_EQ(Read<int32_t>(image, layout.query_start_loc), out.query_start_loc);
  EXPECT_EQ(Read<int32_t>(image, layout.seq_lens), out.seq_lens);
  EXPECT_EQ(Read<int64_t>(image, layout.attention[0].slot_mapping), g.slot_mapping);
  EXPECT_EQ(Read<int32_t>(image, layout.attention[0].table_values), g.table_values);
  const std::vector<TableRun> runs = Read<TableRun>(image, layout.attention[0].table_runs);
  ASSERT_EQ(runs.size(), 4u);
  for (size_t i = 0; i < runs.size(); ++i) {
    EXPECT_EQ(runs[i].row, static_cast<int32_t>(i));
    EXPECT_EQ(runs[i].first, 0);
    EXPECT_EQ(runs[i].count, 2);
    EXPECT_EQ(runs[i].value_offset, static_cast<int32_t>(2 * i));
  }
  std::vector<std::byte> small(static_cast<size_t>(layout.bytes - 1));
  const auto too_small = WriteStepImage(out, absl::MakeSpan(small));
  EXPECT_EQ(too_small.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(too_small.status().message().find("800 bytes"), std::string::npos)
      << too_small.status();
}

// A decode step in which no request starts a block changes no table entry: its image is the
// step's offsets, lengths and slots only. A step in which two start one carries two one-entry
// runs.
TEST(StepImageTest, DecodeStepsCarryOnlyTheChangedEntries) {
  auto s = FourRequests(31);  // 31 and 32 tokens: block 2 starts at the first or second decode
  ASSERT_NE(s, nullptr);
  std::vector<int64_t> bytes, runs;
  for (int step = 0; step < 4; ++step) {
    const SchedulerOutput& out = s->Schedule();
    bytes.push_back(LayoutStepImage(out).bytes);
    runs.push_back(static_cast<int64_t>(out.attention[0].table_runs.size()));
    ASSERT_TRUE(s->Update(out, OneTokenEach(out)).ok());
  }
  EXPECT_EQ(runs, (std::vector<int64_t>{4, 2, 2, 0}));
  // Prefill: 126 slots and four runs of 2 entries. Decode: 32 + 16 + 4 x 8 slots, plus two
  // 16-byte runs and 2 values (8 bytes, padded to 16) when two requests start a block.
  EXPECT_EQ(bytes, (std::vector<int64_t>{32 + 16 + 1008 + 64 + 32, 32 + 16 + 32 + 32 + 16,
                                         32 + 16 + 32 + 32 + 16, 32 + 16 + 32}));
}

}  // namespace
}  // namespace kvpage
