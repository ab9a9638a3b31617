// DeviceStepTables on a GPU (label "gpu"): after every upload of a scheduler run with
// preemption and finishing requests, the device tables, lengths and slots read back equal the
// step's output. Skips without a CUDA device.
#include "kvpage/cuda/device_step_tables.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <vector>

#include "block/manager_test_util.h"

namespace kvpage {
namespace {

using testing::Tokens;
using testing::TinyModel;

template <typename T>
std::vector<T> Download(const T* device, size_t n) {
  std::vector<T> host(n);
  if (n > 0) {
    EXPECT_EQ(cudaMemcpy(host.data(), device, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  }
  return host;
}

TEST(DeviceStepTablesGpu, DeviceCopyFollowsEveryStep) {
  SchedulerConfig c;
  c.kv.block_size = 16;
  c.kv.kv_budget_bytes = 40 * 512;  // kTinyFull: 512 bytes per block; small enough to preempt
  c.kv.chunk_bytes = 8 * 512;
  c.max_num_seqs = 8;
  c.max_num_batched_tokens = 256;
  auto s = Scheduler::Create(TinyModel(testing::kTinyFull), c);
  ASSERT_TRUE(s.ok()) << s.status();
  Scheduler& scheduler = **s;
  for (int i = 0; i < 12; ++i) {
    ASSERT_TRUE(scheduler.AddRequest({.id = RequestId(i), .prompt_token_ids = Tokens(20 + 9 * i, i),
                                      .max_new_tokens = 40}).ok());
  }
  auto tables = cuda::DeviceStepTables::Create(c.max_num_seqs);
  ASSERT_TRUE(tables.ok()) << tables.status();
  cudaStream_t stream = nullptr;
  for (int step = 0; step < 400 && scheduler.HasUnfinishedRequests(); ++step) {
    const SchedulerOutput& out = scheduler.Schedule();
    absl::StatusOr<int64_t> bytes = (*tables)->Upload(out, stream);
    if (step == 0 && absl::IsUnavailable(bytes.status())) GTEST_SKIP() << bytes.status();
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    for (size_t a = 0; a < out.attention.size(); ++a) {
      const AttentionBatch& g = out.attention[a];
      const std::vector<int32_t> device = Download((*tables)->block_table(a), g.block_table.size());
      ASSERT_TRUE(std::equal(device.begin(), device.end(), g.block_table.begin())) << step;
      EXPECT_EQ(Download((*tables)->slot_mapping(a), g.slot_mapping.size()), g.slot_mapping);
    }
    EXPECT_EQ(Download((*tables)->seq_lens(), out.seq_lens.size()), out.seq_lens);
    EXPECT_EQ(Download((*tables)->query_start_loc(), out.query_start_loc.size()),
              out.query_start_loc);
    ModelOutput m;
    m.sampled_offsets.push_back(0);
    for (const ScheduledRequest& r : out.requests) {
      if (r.samples) m.sampled_token_ids.push_back(3);
      m.sampled_offsets.push_back(static_cast<int32_t>(m.sampled_token_ids.size()));
    }
    ASSERT_TRUE(scheduler.Update(out, m).ok());
  }
  EXPECT_FALSE(scheduler.HasUnfinishedRequests());
  EXPECT_GT(scheduler.stats().preemptions, 0);
}

}  // namespace
}  // namespace kvpage
