// Compiles and runs the C++ blocks of docs/integration.md (extracted in order into
// integration_doc_blocks.inc by cmake/extract_cpp_blocks.cmake) against a host stand-in for
// the GPU: CheckingDevice writes every scheduled token's K/V identity at its slot and reads
// each request's whole context back through the doc's FlashInfer CSR, so a hit on K/V that
// was never written, a wrong slot or a wrong page list fails the test.
#include "integration_doc_blocks.inc"

#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <thread>
#include <unordered_map>

#include "block/manager_test_util.h"
#include "kvpage/catalog.h"

namespace {

using kvpage::RequestId;
using kvpage::testing::TinyModel;
using kvpage::testing::Tokens;

// The K/V a position holds stands for the request's tokens up to it: an FNV-1a hash chain.
std::vector<uint64_t> PrefixIdentities(absl::Span<const int32_t> tokens, int64_t n) {
  std::vector<uint64_t> ids(static_cast<size_t>(n));
  uint64_t h = 1469598103934665603ull;
  for (int64_t p = 0; p < n; ++p) {
    h = (h ^ static_cast<uint64_t>(tokens[p])) * 1099511628211ull;
    ids[p] = h;
  }
  return ids;
}

class CheckingDevice : public Device {
 public:
  CheckingDevice(const kvpage::Scheduler& scheduler, std::vector<LayerBuffer> buffers)
      : scheduler_(scheduler), buffers_(std::move(buffers)) {}

  // Called at Upload with each step's output (to inject aborts "from another thread").
  std::function<void(const kvpage::SchedulerOutput&)> on_upload;

  // The device's copy of the step: FlashInfer's page lists, built from the tables now.
  void Upload(const kvpage::SchedulerOutput& out) override {
    csr_.clear();
    for (const kvpage::AttentionBatch& batch : out.attention) {
      CheckTableBound(batch);
      csr_.push_back(BuildPagedKvCsr(out, batch));
    }
    // The doc's one-copy upload: the tables its runs patch are the step's tables.
    if (tables_.empty()) {
      for (const kvpage::AttentionBatch& batch : out.attention) {
        tables_.emplace_back(static_cast<size_t>(scheduler_.config().max_num_seqs) *
                             batch.max_blocks_per_row);
      }
    }
    const absl::Status uploaded = UploadStep(out, staging_, tables_);
    EXPECT_TRUE(uploaded.ok()) << uploaded;
    for (size_t a = 0; a < out.attention.size() && uploaded.ok(); ++a) {
      const absl::Span<const int32_t> want = out.attention[a].block_table;
      EXPECT_TRUE(std::equal(want.begin(), want.end(), tables_[a].begin())) << "group " << a;
    }
    if (on_upload) on_upload(out);
  }

  std::vector<int32_t> Forward(const kvpage::SchedulerOutput& out,
                               const std::vector<RequestId>& skip) override {
    const kvpage::KvCacheManager& kv = scheduler_.kv_cache();
    std::vector<std::vector<uint64_t>> ids(out.requests.size());
    std::vector<bool> runs(out.requests.size(), false);
    for (size_t i = 0; i < out.requests.size(); ++i) {
      const kvpage::ScheduledRequest& r = out.requests[i];
      if (std::find(skip.begin(), skip.end(), r.id) != skip.end()) continue;
      std::optional<kvpage::RequestHandle> h = kv.Find(r.id);
      EXPECT_TRUE(h.has_value()) << "request " << r.id.value << " is gone but not skipped";
      if (!h) continue;
      ids[i] = PrefixIdentities(*kv.Tokens(*h), out.seq_lens[r.row]);
      runs[i] = true;
    }
    if (stores_.size() < out.attention.size()) stores_.resize(out.attention.size());
    for (size_t a = 0; a < out.attention.size(); ++a) {
      const kvpage::AttentionBatch& batch = out.attention[a];
      // write_kv: every token of the step first ...
      for (size_t i = 0; i < out.requests.size(); ++i) {
        if (!runs[i]) continue;
        const kvpage::ScheduledRequest& r = out.requests[i];
        const int32_t q0 = out.query_start_loc[r.row];
        for (int32_t t = 0; t < r.num_scheduled_tokens; ++t) {
          stores_[a][batch.slot_mapping[q0 + t]] = ids[i][r.num_computed_tokens + t];
        }
      }
      // ... then attention reads each context through FlashInfer's page lists.
      const PagedKvCsr& csr = csr_[a];
      for (size_t i = 0; i < out.requests.size(); ++i) {
        if (runs[i]) ReadContext(out, batch, csr, i, ids[i], stores_[a]);
      }
    }
    std::vector<int32_t> sampled;
    for (size_t i = 0; i < out.requests.size(); ++i) {
      if (runs[i] && out.requests[i].samples) {
        sampled.push_back(static_cast<int32_t>((out.requests[i].id.value * 7 + ids[i].size()) % 997));
      }
    }
    return sampled;
  }

  int64_t reads() const { return reads_; }
  int64_t bad_reads() const { return bad_reads_; }

 private:
  void CheckTableBound(const kvpage::AttentionBatch& batch) {
    int64_t num_ids = 0;
    for (const LayerBuffer& b : buffers_) {
      if (b.group == batch.group) num_ids = b.num_ids;
    }
    const int64_t ratio = scheduler_.kv_cache().group_block_size(batch.group) / batch.kernel_block_size;
    for (int32_t id : batch.block_table) EXPECT_LT(id / ratio, num_ids);
  }

  void ReadContext(const kvpage::SchedulerOutput& out, const kvpage::AttentionBatch& batch,
                   const PagedKvCsr& csr, size_t i, const std::vector<uint64_t>& ids,
                   const std::unordered_map<int64_t, uint64_t>& store) {
    const kvpage::ScheduledRequest& r = out.requests[i];
    const int64_t page = batch.kernel_block_size;
    const int64_t seq_len = out.seq_lens[r.row];
    const int64_t pages = csr.kv_indptr[i + 1] - csr.kv_indptr[i];
    EXPECT_EQ(csr.qo_indptr[i + 1] - csr.qo_indptr[i], r.num_scheduled_tokens);
    EXPECT_EQ((pages - 1) * page + csr.last_page_len[i], seq_len - csr.first_token[i]);
    // The first query token's window (or the whole context) must be readable.
    const int64_t q0 = seq_len - r.num_scheduled_tokens;
    const int64_t from = batch.window > 0 ? std::max<int64_t>(0, q0 - batch.window + 1) : 0;
    for (int64_t p = from; p < seq_len; ++p) {
      const int32_t id = csr.kv_indices[csr.kv_indptr[i] + (p - csr.first_token[i]) / page];
      EXPECT_NE(id, 0) << "request " << r.id.value << " reads position " << p
                       << " from a null page (window " << batch.window << ")";
      auto it = store.find(int64_t{id} * page + p % page);
      ++reads_;
      if (it == store.end() || it->second != ids[p]) ++bad_reads_;
    }
  }

  const kvpage::Scheduler& scheduler_;
  std::vector<LayerBuffer> buffers_;
  std::vector<std::unordered_map<int64_t, uint64_t>> stores_;  // per attention batch: slot -> K/V
  std::vector<PagedKvCsr> csr_;                                 // per attention batch, this step
  int64_t reads_ = 0, bad_reads_ = 0;
  std::vector<std::byte> staging_;            // the step image
  std::vector<std::vector<int32_t>> tables_;  // per attention batch, as the runs patch it
};

kvpage::SchedulerConfig Config(int64_t budget_bytes) {
  kvpage::SchedulerConfig c;
  c.kv.kv_budget_bytes = budget_bytes;
  c.kv.chunk_bytes = 8 << 10;
  c.kv.hash_seed = 5;
  c.kv.enable_kv_events = true;
  c.max_num_batched_tokens = 512;
  return c;
}

TEST(IntegrationDocTest, LayerBuffersCoverEveryLayerAndId) {
  for (const char* name : {"qwen3-8b", "gemma-3-4b-it", "qwen3.5-9b"}) {
    absl::StatusOr<kvpage::ModelSpec> model = kvpage::LoadModel(name);
    ASSERT_TRUE(model.ok()) << model.status();
    kvpage::KvCacheConfig config{.kv_budget_bytes = int64_t{8} << 30};
    auto kv = kvpage::KvCacheManager::Create(*model, config);
    ASSERT_TRUE(kv.ok()) << kv.status();
    const std::vector<LayerBuffer> buffers = PlanLayerBuffers(*model, **kv);
    ASSERT_EQ(static_cast<int32_t>(buffers.size()), model->num_layers()) << name;
    std::set<int32_t> layers;
    for (const LayerBuffer& b : buffers) {
      layers.insert(b.layer);
      const int64_t group_bytes = (*kv)->Usage().pools[b.group.value].block_bytes;
      EXPECT_EQ(b.bytes_per_id * model->groups[b.group.value].num_layers(), group_bytes);
      EXPECT_EQ(b.num_ids, config.kv_budget_bytes / group_bytes + 1);
    }
    EXPECT_EQ(static_cast<int32_t>(layers.size()), model->num_layers()) << name;
  }
  // qwen3-8b: 36 layers of 8 KV heads × 128, bf16: 4 KiB per token and layer, 64 KiB per
  // 16-token block and layer; the one pool's 2.25 MiB blocks fit 3,640 times in 8 GiB.
  absl::StatusOr<kvpage::ModelSpec> qwen = kvpage::LoadModel("qwen3-8b");
  auto kv = kvpage::KvCacheManager::Create(*qwen, {.kv_budget_bytes = int64_t{8} << 30});
  const std::vector<LayerBuffer> buffers = PlanLayerBuffers(*qwen, **kv);
  EXPECT_EQ(buffers[0].bytes_per_id, 64 << 10);
  EXPECT_EQ(buffers[0].num_ids, 3641);
}

// The reproduction through the doc's RunStep: A is aborted after Schedule (by the
// queue, as another thread would), its compute skipped; B with the same prompt reads only K/V
// that was written.
TEST(IntegrationDocTest, AbortMidStepThenSamePrompt) {
  const kvpage::ModelSpec model = TinyModel(kvpage::testing::kTinyHybridSwa);
  auto created = kvpage::Scheduler::Create(model, Config(1 << 20));
  ASSERT_TRUE(created.ok()) << created.status();
  kvpage::Scheduler& scheduler = **created;
  CheckingDevice device(scheduler, PlanLayerBuffers(model, scheduler.kv_cache()));
  AbortQueue aborts;
  device.on_upload = [&](const kvpage::SchedulerOutput& out) {
    for (const kvpage::ScheduledRequest& r : out.requests) {
      if (r.id == RequestId(1) && r.is_new) aborts.Push(r.id);
    }
  };
  std::vector<kvpage::KvEvent> events;
  ASSERT_TRUE(scheduler.AddRequest({.id = RequestId(1), .prompt_token_ids = Tokens(1000),
                                    .max_new_tokens = 4}).ok());
  int64_t finished = 0;
  for (int step = 0; step < 3; ++step) {  // A leaves in its first step; nothing runs after
    auto done = RunStep(scheduler, device, aborts, &events);
    ASSERT_TRUE(done.ok()) << done.status();
    finished += static_cast<int64_t>(done->size());
  }
  EXPECT_FALSE(scheduler.HasUnfinishedRequests());
  EXPECT_TRUE(events.empty());  // nothing of A was ever cached
  EXPECT_EQ(scheduler.kv_cache().Usage().used_bytes, 0);

  device.on_upload = nullptr;
  ASSERT_TRUE(scheduler.AddRequest({.id = RequestId(2), .prompt_token_ids = Tokens(1000),
                                    .max_new_tokens = 4}).ok());
  ASSERT_TRUE(scheduler.AddRequest({.id = RequestId(3), .prompt_token_ids = Tokens(1000),
                                    .max_new_tokens = 4}).ok());
  for (int step = 0; step < 20 && scheduler.HasUnfinishedRequests(); ++step) {
    auto done = RunStep(scheduler, device, aborts, &events);
    ASSERT_TRUE(done.ok()) << done.status();
    finished += static_cast<int64_t>(done->size());
    ASSERT_TRUE(scheduler.CheckInvariants().ok()) << scheduler.CheckInvariants();
  }
  EXPECT_EQ(finished, 2);
  EXPECT_GT(device.reads(), 0);
  EXPECT_EQ(device.bad_reads(), 0);
  EXPECT_EQ(scheduler.stats().aborted, 1);
  EXPECT_EQ(scheduler.kv_cache().Usage().used_bytes, 0);
  EXPECT_FALSE(events.empty());
  EXPECT_TRUE(scheduler.DrainKvEvents().empty());  // RunStep drained them all
}

// An abort between Schedule and the forward pass leaves the output's tables as they were,
// although the scheduler's own rows move (the last row takes the aborted one's place).
TEST(IntegrationDocTest, AbortLeavesTheOutputsBlockTable) {
  const kvpage::ModelSpec model = TinyModel(kvpage::testing::kTinyFull);
  auto created = kvpage::Scheduler::Create(model, Config(1 << 20));
  ASSERT_TRUE(created.ok()) << created.status();
  kvpage::Scheduler& scheduler = **created;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(scheduler.AddRequest({.id = RequestId(i), .prompt_token_ids = Tokens(40, 100 * i),
                                      .max_new_tokens = 4}).ok());
  }
  const kvpage::SchedulerOutput& out = scheduler.Schedule();
  ASSERT_EQ(out.num_rows, 3);
  const PagedKvCsr uploaded = BuildPagedKvCsr(out, out.attention[0]);
  EXPECT_EQ(std::count(uploaded.kv_indices.begin(), uploaded.kv_indices.end(), 0), 0);
  ASSERT_TRUE(scheduler.Abort(RequestId(0)).ok());  // row 0; row 2 moves into it
  const PagedKvCsr late = BuildPagedKvCsr(out, out.attention[0]);
  EXPECT_EQ(late.kv_indices, uploaded.kv_indices);
  EXPECT_EQ(scheduler.num_running(), 2);
}

// Requests sharing prefixes, served by the doc's loop while another thread aborts some of
// them through the queue: every read finds what was written, every block is free at the end.
TEST(IntegrationDocTest, ServesWhileAnotherThreadAborts) {
  const kvpage::ModelSpec model = TinyModel(kvpage::testing::kTinyHybridSwa);
  auto created = kvpage::Scheduler::Create(model, Config(96 << 10));
  ASSERT_TRUE(created.ok()) << created.status();
  kvpage::Scheduler& scheduler = **created;
  CheckingDevice device(scheduler, PlanLayerBuffers(model, scheduler.kv_cache()));
  AbortQueue aborts;
  constexpr int kRequests = 60;
  for (int i = 0; i < kRequests; ++i) {
    // Four shared system prompts of 96 tokens, then a question of 5 to 64 tokens.
    std::vector<int32_t> prompt = Tokens(96, 1000 * (i % 4));
    const std::vector<int32_t> question = Tokens(5 + (i * 13) % 60, 50000 + 100 * i);
    prompt.insert(prompt.end(), question.begin(), question.end());
    ASSERT_TRUE(scheduler.AddRequest({.id = RequestId(i), .prompt_token_ids = prompt,
                                      .max_new_tokens = 8 + i % 24}).ok());
  }
  // Besides the thread's aborts: request 7 is aborted after Schedule in its second step, when
  // it has rows after it (an abort moves the last row into its place).
  bool aborted_7 = false;
  device.on_upload = [&](const kvpage::SchedulerOutput& out) {
    for (const kvpage::ScheduledRequest& r : out.requests) {
      if (r.id == RequestId(7) && !r.is_new && r.row + 1 < out.num_rows && !aborted_7) {
        aborts.Push(r.id);
        aborted_7 = true;
      }
    }
  };
  std::atomic<bool> stop{false};
  std::thread aborter([&] {
    for (int i = 0; i < kRequests && !stop.load(); i += 5) {
      aborts.Push(RequestId(i));
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  std::vector<kvpage::KvEvent> events;
  int64_t finished = 0;
  for (int step = 0; step < 2000 && scheduler.HasUnfinishedRequests(); ++step) {
    auto done = RunStep(scheduler, device, aborts, &events);
    ASSERT_TRUE(done.ok()) << done.status();
    finished += static_cast<int64_t>(done->size());
  }
  stop = true;
  aborter.join();
  // Aborts that came after their request finished are NotFound, and ignored.
  std::vector<RequestId> late;
  ASSERT_TRUE(ApplyAborts(scheduler, aborts, &late).ok());
  EXPECT_TRUE(late.empty());
  EXPECT_FALSE(scheduler.HasUnfinishedRequests());
  EXPECT_TRUE(aborted_7);
  EXPECT_EQ(finished + scheduler.stats().aborted, kRequests);
  EXPECT_GT(device.reads(), 0);
  EXPECT_EQ(device.bad_reads(), 0);
  EXPECT_GT(scheduler.stats().prefix_hit_tokens, 0);
  EXPECT_EQ(scheduler.kv_cache().Usage().used_bytes, 0);
  EXPECT_TRUE(scheduler.CheckInvariants().ok()) << scheduler.CheckInvariants();
}

// §6.1: the doc's publisher runs a step's events out to a subscriber that replays them.
TEST(IntegrationDocTest, PublishesTheStepsEvents) {
  const kvpage::ModelSpec model = TinyModel(kvpage::testing::kTinyHybridSwa);
  auto created = kvpage::Scheduler::Create(model, Config(1 << 20));
  ASSERT_TRUE(created.ok()) << created.status();
  kvpage::Scheduler& scheduler = **created;
  auto publisher = StartKvEvents(scheduler, "tcp://127.0.0.1:*", "tcp://127.0.0.1:*");
  ASSERT_TRUE(publisher.ok()) << publisher.status();
  ASSERT_TRUE(scheduler.AddRequest({.id = RequestId(1), .prompt_token_ids = Tokens(100),
                                    .max_new_tokens = 2}).ok());
  while (scheduler.HasUnfinishedRequests()) {
    const kvpage::SchedulerOutput& out = scheduler.Schedule();
    kvpage::ModelOutput sampled;
    sampled.sampled_offsets.push_back(0);
    for (const kvpage::ScheduledRequest& r : out.requests) {
      if (r.samples) sampled.sampled_token_ids.push_back(3);
      sampled.sampled_offsets.push_back(static_cast<int32_t>(sampled.sampled_token_ids.size()));
    }
    ASSERT_TRUE(scheduler.Update(out, sampled).ok());
    PublishStepEvents(scheduler, **publisher);
  }
  ASSERT_TRUE((*publisher)->Flush(absl::Seconds(10)));
  EXPECT_GE((*publisher)->stats().published_batches, 1);
  EXPECT_EQ((*publisher)->stats().dropped_batches, 0);
}


// §8: the doc's RunTierTransfers on two host backings. A prompt's K/V (a byte pattern per
// block) is saved to the tier, the device forgets it, and a load brings the same bytes back
// into other device blocks.
TEST(IntegrationDocTest, TierTransfersMoveTheBlocksBytes) {
  kvpage::HostMemoryBacking device_memory, host_memory;
  kvpage::KvCacheConfig c;
  c.kv_budget_bytes = 64 << 10;
  c.chunk_bytes = 4096;
  c.hash_seed = 7;
  c.backing = &device_memory;
  c.host_cache = {.budget_bytes = 64 << 10,
                  .policy = kvpage::HostTierPolicy::kWriteThrough,
                  .backing = &host_memory};
  auto created = kvpage::KvCacheManager::Create(TinyModel(kvpage::testing::kTinyFull), c);
  ASSERT_TRUE(created.ok()) << created.status();
  kvpage::KvCacheManager& m = **created;
  absl::StatusOr<std::vector<kvpage::TensorView>> device = TierViews(device_memory);
  absl::StatusOr<std::vector<kvpage::TensorView>> host = TierViews(host_memory);
  ASSERT_TRUE(device.ok() && host.ok()) << device.status() << host.status();
  ASSERT_EQ(device->size(), 1u);  // one layer, one K+V tensor
  const int64_t block_bytes = device_memory.layout().tensors[0].block_bytes;
  const CopyBytes copy = [](void* dst, const void* src, size_t n) { std::memcpy(dst, src, n); };
  const kvpage::GroupId group(0);
  std::vector<int32_t> prompt = Tokens(55);

  ASSERT_TRUE(m.AddRequest({RequestId(1), prompt}).ok());
  kvpage::RequestHandle h = *m.Find(RequestId(1));
  ASSERT_TRUE(*m.AllocateSlots(h, {.num_new_tokens = 55}));
  const absl::Span<const kvpage::BlockId> table = *m.BlockTable(h, group);
  for (size_t i = 0; i < table.size(); ++i) {  // the forward pass writes the blocks
    std::memset(BlockOf((*device)[0], table[i].value), 0x10 + static_cast<int>(i), block_bytes);
  }
  m.CompleteStep();
  ASSERT_TRUE(m.Free(h).ok());
  kvpage::TierTransfers t = m.TakeTransfers();
  ASSERT_EQ(t.saves.size(), 3u);  // the 3 full blocks
  RunTierTransfers(t, device_memory.layout(), *device, *host, copy);
  ASSERT_TRUE(m.CompleteTransfers(t.id).ok());
  ASSERT_TRUE(m.ResetPrefixCache().ok());  // the device forgets; the tier keeps its copies

  prompt.resize(50);
  ASSERT_TRUE(m.AddRequest({RequestId(2), prompt}).ok());
  h = *m.Find(RequestId(2));
  EXPECT_EQ(m.GetComputedBlocks(h)->num_tokens, 0);
  EXPECT_EQ(*m.LoadFromHost(h), 48);
  t = m.TakeTransfers();
  ASSERT_EQ(t.loads.size(), 3u);
  for (const kvpage::TierCopy& load : t.loads) {
    std::memset(BlockOf((*device)[0], load.device.value), 0, block_bytes);
  }
  RunTierTransfers(t, device_memory.layout(), *device, *host, copy);
  ASSERT_TRUE(m.CompleteTransfers(t.id).ok());
  const kvpage::CacheHit hit = *m.GetComputedBlocks(h);
  ASSERT_EQ(hit.num_tokens, 48);
  for (size_t i = 0; i < 3; ++i) {
    const char* block = BlockOf((*device)[0], hit.blocks[0][i].value);
    EXPECT_EQ(std::count(block, block + block_bytes, static_cast<char>(0x10 + i)), block_bytes)
        << "block " << i << " of the prefix";
  }
  ASSERT_TRUE(m.Free(h).ok());
  EXPECT_TRUE(m.CheckInvariants().ok()) << m.CheckInvariants();
}

}  // namespace
