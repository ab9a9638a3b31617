// Host-tier events on the wire: KvEvent::medium == KvMedium::kHost goes out as medium "CPU"
// (whatever the device's medium is called) and never joins a run of device events, in a
// hand-built batch and in the events of a manager with a host tier.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "block/manager_test_util.h"
#include "kvpage/kv_cache_manager.h"
#include "kvpage/kv_event_wire.h"

namespace kvpage {
namespace {

using testing::Concat;
using testing::TinyModel;
using testing::Tokens;

BlockHash Hash(uint64_t lo) { return BlockHash{lo, lo * 1000003}; }

KvEvent DeviceStored(uint64_t hash, std::optional<uint64_t> parent, std::vector<int32_t> tokens) {
  KvEvent e{KvEvent::Type::kStored, GroupId(0), Hash(hash), parent ? Hash(*parent) : BlockHash{}};
  e.has_parent = parent.has_value();
  e.token_ids = std::move(tokens);
  return e;
}

// As the host tier records them: the hash alone.
KvEvent HostEvent(KvEvent::Type type, uint64_t hash) {
  KvEvent e{type, GroupId(0), Hash(hash), BlockHash{}};
  e.medium = KvMedium::kHost;
  return e;
}

KvEvent DeviceRemoved(uint64_t hash) {
  return KvEvent{KvEvent::Type::kRemoved, GroupId(0), Hash(hash), BlockHash{}};
}

const std::vector<KvEventGroupInfo> kGroups = {{.block_size = 2, .kind = "full_attention"}};

struct WireRun {
  WireKvEvent::Type type;
  std::vector<uint64_t> hashes;
  std::string medium;
};

std::vector<WireRun> Runs(const WireKvEventBatch& batch) {
  std::vector<WireRun> runs;
  for (const WireKvEvent& e : batch.events) {
    runs.push_back({e.type, e.block_hashes, e.medium.value_or("(none)")});
  }
  return runs;
}

void ExpectRuns(const std::vector<WireRun>& got, const std::vector<WireRun>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].type, want[i].type) << "event " << i;
    EXPECT_EQ(got[i].hashes, want[i].hashes) << "event " << i;
    EXPECT_EQ(got[i].medium, want[i].medium) << "event " << i;
  }
}

TEST(KvEventWireHostTierTest, HostEventsAreCpuAndNeverJoinDeviceRuns) {
  using T = WireKvEvent::Type;
  const std::vector<KvEvent> events = {
      DeviceStored(1, std::nullopt, {1, 2}),
      HostEvent(KvEvent::Type::kStored, 1),  // the host copy of block 1
      DeviceStored(2, 1, {3, 4}),            // extends the device block 1, after a host event
      DeviceStored(3, 2, {5, 6}),
      HostEvent(KvEvent::Type::kStored, 2),
      HostEvent(KvEvent::Type::kStored, 3),  // no parent: a run of its own
      DeviceRemoved(1),
      HostEvent(KvEvent::Type::kRemoved, 1),
      HostEvent(KvEvent::Type::kRemoved, 2),
      DeviceRemoved(2)};
  KvEventWireOptions options;
  options.medium = "HBM";  // the device's name does not change the host tier's
  absl::StatusOr<std::string> payload = EncodeKvEventBatch(0.5, events, kGroups, options);
  ASSERT_TRUE(payload.ok()) << payload.status();
  absl::StatusOr<WireKvEventBatch> batch = DecodeKvEventBatch(*payload);
  ASSERT_TRUE(batch.ok()) << batch.status();
  ExpectRuns(Runs(*batch), {{T::kBlockStored, {1}, "HBM"},
                            {T::kBlockStored, {1}, "CPU"},
                            {T::kBlockStored, {2, 3}, "HBM"},
                            {T::kBlockStored, {2}, "CPU"},
                            {T::kBlockStored, {3}, "CPU"},
                            {T::kBlockRemoved, {1}, "HBM"},
                            {T::kBlockRemoved, {1, 2}, "CPU"},
                            {T::kBlockRemoved, {2}, "HBM"}});
  // A host Stored names the block alone, with the group's block size and kind.
  const WireKvEvent& host = batch->events[1];
  EXPECT_FALSE(host.parent_block_hash.has_value());
  EXPECT_TRUE(host.token_ids.empty());
  EXPECT_EQ(host.block_size, 2);
  EXPECT_EQ(host.group_idx, 0);
  EXPECT_EQ(host.kv_cache_spec_kind, "full_attention");
  EXPECT_EQ(batch->events[2].parent_block_hash, 1u);
}

// A manager with a write-through host tier and events on: the saves of a prompt's 3 blocks
// publish CPU Stored events for the same ids as the device's GPU Stored events; evicting the
// host copies publishes CPU Removed events for them.
TEST(KvEventWireHostTierTest, ManagerHostEventsNameTheDeviceBlocksIds) {
  KvCacheConfig c;
  c.kv_budget_bytes = 32 * 512;
  c.chunk_bytes = 512;
  c.hash_seed = 7;
  c.enable_kv_events = true;
  c.host_cache = {.budget_bytes = 3 * 512, .policy = HostTierPolicy::kWriteThrough};
  auto created = KvCacheManager::Create(TinyModel(testing::kTinyFull), c);
  ASSERT_TRUE(created.ok()) << created.status();
  KvCacheManager& m = **created;
  const std::vector<KvEventGroupInfo> groups = KvEventGroupInfos(m);
  auto prefill = [&m](int64_t id, const std::vector<int32_t>& prompt) {
    ASSERT_TRUE(m.AddRequest({RequestId(id), prompt}).ok());
    const RequestHandle h = *m.Find(RequestId(id));
    ASSERT_TRUE(*m.AllocateSlots(h, {.num_new_tokens = static_cast<int64_t>(prompt.size())}));
    m.CompleteStep();
    ASSERT_TRUE(m.CompleteTransfers(m.TakeTransfers().id).ok());
    ASSERT_TRUE(m.Free(h).ok());
  };
  prefill(1, Concat(Tokens(48), Tokens(7, 1000)));
  absl::StatusOr<std::string> payload = EncodeKvEventBatch(1, m.DrainEvents(), groups);
  ASSERT_TRUE(payload.ok()) << payload.status();
  absl::StatusOr<WireKvEventBatch> batch = DecodeKvEventBatch(*payload);
  ASSERT_TRUE(batch.ok()) << batch.status();
  ASSERT_EQ(batch->events.size(), 4u);  // one GPU run of 3, then a CPU event per save
  const std::vector<uint64_t> device = batch->events[0].block_hashes;
  EXPECT_EQ(batch->events[0].medium, "GPU");
  ASSERT_EQ(device.size(), 3u);
  std::vector<uint64_t> host;
  for (size_t i = 1; i < 4; ++i) {
    EXPECT_EQ(batch->events[i].type, WireKvEvent::Type::kBlockStored);
    EXPECT_EQ(batch->events[i].medium, "CPU");
    EXPECT_EQ(batch->events[i].block_size, 16);
    host.insert(host.end(), batch->events[i].block_hashes.begin(),
                batch->events[i].block_hashes.end());
  }
  EXPECT_EQ(host, device);

  // Three new blocks take the 3 host slots. Each is offered for saving as it is cached, which
  // evicts the least recently saved host copy there and then: GPU Stored and CPU Removed
  // alternate (neither joins the other's run), then the saves complete as CPU Stored.
  prefill(2, Tokens(48, 5000));
  payload = EncodeKvEventBatch(2, m.DrainEvents(), groups);
  ASSERT_TRUE(payload.ok()) << payload.status();
  batch = DecodeKvEventBatch(*payload);
  ASSERT_TRUE(batch.ok()) << batch.status();
  using T = WireKvEvent::Type;
  const std::vector<WireRun> runs = Runs(*batch);
  ASSERT_EQ(runs.size(), 9u);
  std::vector<uint64_t> removed, stored_device, stored_host;
  for (size_t i = 0; i < 9; ++i) {
    const T type = i < 6 && i % 2 == 1 ? T::kBlockRemoved : T::kBlockStored;
    EXPECT_EQ(runs[i].type, type) << "event " << i;
    EXPECT_EQ(runs[i].medium, i < 6 && i % 2 == 0 ? "GPU" : "CPU") << "event " << i;
    ASSERT_EQ(runs[i].hashes.size(), 1u);
    (type == T::kBlockRemoved ? removed : i < 6 ? stored_device : stored_host)
        .push_back(runs[i].hashes[0]);
  }
  EXPECT_EQ(removed, device);  // least recently saved first
  EXPECT_EQ(stored_host, stored_device);
}

}  // namespace
}  // namespace kvpage
