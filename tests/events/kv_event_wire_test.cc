// The KV event wire format: exact bytes of a small batch (as msgspec writes vLLM 0.33's
// KVEventBatch), how events coalesce, and the decoder's answer to malformed payloads.
#include "kvpage/kv_event_wire.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kvpage/catalog.h"
#include "kvpage/kv_cache_manager.h"

namespace kvpage {
namespace {

BlockHash H(uint64_t lo) { return BlockHash{lo, lo * 1000003}; }

KvEvent Stored(int32_t group, uint64_t hash, std::optional<uint64_t> parent,
               std::vector<int32_t> tokens, int64_t lora = 0) {
  KvEvent e{KvEvent::Type::kStored, GroupId(group), H(hash), parent ? H(*parent) : BlockHash{}};
  e.has_parent = parent.has_value();
  e.lora_id = lora;
  e.token_ids = std::move(tokens);
  return e;
}

KvEvent Removed(int32_t group, uint64_t hash) {
  return KvEvent{KvEvent::Type::kRemoved, GroupId(group), H(hash), BlockHash{}};
}

// A msgpack fixstr.
std::string S(const std::string& s) { return std::string(1, static_cast<char>(0xa0 + s.size())) + s; }
std::string B(std::initializer_list<int> bytes) {
  std::string out;
  for (int b : bytes) out.push_back(static_cast<char>(b));
  return out;
}

const std::vector<KvEventGroupInfo> kGroups = {{.block_size = 2, .kind = "full_attention"},
                                               {.block_size = 2, .kind = "sliding_window",
                                                .sliding_window = 512}};

TEST(KvEventWireTest, EncodesASmallBatchByteForByte) {
  const std::vector<KvEvent> events = {Stored(0, 1, std::nullopt, {1, 2}),
                                       Stored(0, 2, 1, {3, 4}), Removed(0, 1),
                                       KvEvent{KvEvent::Type::kAllCleared}};
  absl::StatusOr<std::string> payload = EncodeKvEventBatch(1.5, events, kGroups);
  ASSERT_TRUE(payload.ok()) << payload.status();
  const std::string expected =
      B({0x93, 0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0}) +  // [1.5,
      B({0x93}) +                                          //  [3 events]
      B({0x8a}) + S("type") + S("BlockStored") + S("block_hashes") + B({0x92, 0x01, 0x02}) +
      S("parent_block_hash") + B({0xc0}) + S("token_ids") + B({0x94, 1, 2, 3, 4}) +
      S("block_size") + B({0x02}) + S("lora_id") + B({0xc0}) + S("medium") + S("GPU") +
      S("lora_name") + B({0xc0}) + S("group_idx") + B({0x00}) + S("kv_cache_spec_kind") +
      S("full_attention") +
      B({0x84}) + S("type") + S("BlockRemoved") + S("block_hashes") + B({0x91, 0x01}) +
      S("medium") + S("GPU") + S("group_idx") + B({0x00}) +
      B({0x81}) + S("type") + S("AllBlocksCleared") +
      B({0x00});  // data_parallel_rank]
  EXPECT_EQ(*payload, expected);
}

TEST(KvEventWireTest, RoundTripsEveryField) {
  KvEventWireOptions options;
  options.medium = "CPU";
  options.data_parallel_rank = 3;
  options.lora_names[7] = "sql-adapter";
  const std::vector<KvEvent> events = {
      Stored(1, 0xfffffffffffffff0u, std::nullopt, {100000, 2}, 7), Removed(1, 9)};
  absl::StatusOr<std::string> payload = EncodeKvEventBatch(2.25, events, kGroups, options);
  ASSERT_TRUE(payload.ok()) << payload.status();
  absl::StatusOr<WireKvEventBatch> batch = DecodeKvEventBatch(*payload);
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_EQ(batch->ts, 2.25);
  EXPECT_EQ(batch->data_parallel_rank, 3);
  ASSERT_EQ(batch->events.size(), 2u);
  const WireKvEvent& s = batch->events[0];
  EXPECT_EQ(s.type, WireKvEvent::Type::kBlockStored);
  EXPECT_EQ(s.block_hashes, std::vector<uint64_t>{0xfffffffffffffff0u});
  EXPECT_FALSE(s.parent_block_hash.has_value());
  EXPECT_EQ(s.token_ids, (std::vector<int64_t>{100000, 2}));
  EXPECT_EQ(s.block_size, 2);
  EXPECT_EQ(s.lora_id, 7);
  EXPECT_EQ(s.lora_name, "sql-adapter");
  EXPECT_EQ(s.medium, "CPU");
  EXPECT_EQ(s.group_idx, 1);
  EXPECT_EQ(s.kv_cache_spec_kind, "sliding_window");
  EXPECT_EQ(s.kv_cache_spec_sliding_window, 512);
  const WireKvEvent& r = batch->events[1];
  EXPECT_EQ(r.type, WireKvEvent::Type::kBlockRemoved);
  EXPECT_EQ(r.block_hashes, std::vector<uint64_t>{9});
  EXPECT_EQ(r.medium, "CPU");
  EXPECT_EQ(r.group_idx, 1);
  EXPECT_FALSE(r.kv_cache_spec_kind.has_value());
}

TEST(KvEventWireTest, CoalescesOnlyChainsOfOneGroupAdapterAndSpan) {
  const std::vector<KvEvent> events = {
      Stored(0, 1, std::nullopt, {1, 2}), Stored(0, 2, 1, {3, 4}), Stored(0, 3, 2, {5, 6}),
      Stored(0, 4, 1, {7, 8}),          // parent is not the previous hash: new event
      Stored(1, 5, 4, {9, 10}),         // another group
      Stored(1, 6, 5, {1, 2, 3, 4}),    // a snapshot spanning two blocks: its own event
      Stored(1, 7, 6, {5, 6, 7, 8}),    // extends it with the same span
      Stored(1, 8, 7, {1, 2, 3, 4}, 9),  // another adapter
      Removed(0, 1), Removed(0, 2), Removed(1, 3)};
  absl::StatusOr<std::string> payload =
      EncodeKvEventBatch(0, events, kGroups, {.data_parallel_rank = std::nullopt});
  ASSERT_TRUE(payload.ok()) << payload.status();
  absl::StatusOr<WireKvEventBatch> batch = DecodeKvEventBatch(*payload);
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_FALSE(batch->data_parallel_rank.has_value());  // omitted: a 2-element batch
  std::vector<std::vector<uint64_t>> hashes;
  std::vector<int32_t> block_sizes;
  for (const WireKvEvent& e : batch->events) {
    hashes.push_back(e.block_hashes);
    block_sizes.push_back(e.block_size);
  }
  EXPECT_EQ(hashes, (std::vector<std::vector<uint64_t>>{
                        {1, 2, 3}, {4}, {5}, {6, 7}, {8}, {1, 2}, {3}}));
  EXPECT_EQ(block_sizes, (std::vector<int32_t>{2, 2, 2, 4, 4, 0, 0}));
  EXPECT_EQ(batch->events[3].token_ids, (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(batch->events[3].parent_block_hash, 5u);
}

TEST(KvEventWireTest, RefusesAGroupOutsideTheTable) {
  const std::vector<KvEvent> events = {Removed(0, 1), Removed(2, 1)};
  absl::StatusOr<std::string> payload = EncodeKvEventBatch(0, events, kGroups);
  ASSERT_FALSE(payload.ok());
  EXPECT_EQ(payload.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(payload.status().message(), "KV event 1 names group 2, but 2 groups are described");
}

TEST(KvEventWireTest, DecoderRefusesMalformedPayloads) {
  const std::string stored = S("type") + S("BlockStored");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "not a msgpack value"},
      {B({0x93, 0xcb, 0x3f}), "not a msgpack value"},                    // truncated float
      {B({0x92, 0x00, 0x90, 0x00}), "1 trailing bytes at offset 3"},
      {B({0x81, 0xa1, 'a', 0x00}), "payload is not an array"},
      {B({0x91, 0x00}), "payload is not an array"},
      {B({0x92, 0xa1, 'x', 0x90}), "ts is not a number"},
      {B({0x92, 0x00, 0x00}), "events is not an array"},
      {B({0x92, 0x00, 0x91, 0x90}), "event 0 is not a map"},
      {B({0x92, 0x00, 0x91, 0x81}) + S("medium") + S("GPU"), "event 0 has no \"type\""},
      {B({0x92, 0x00, 0x91, 0x81}) + S("type") + S("Bogus"), "'Bogus' is not an event type"},
      {B({0x92, 0x00, 0x91, 0x81}) + stored, "event 0 has no block_hashes"},
      {B({0x92, 0x00, 0x91, 0x82}) + stored + S("block_hashes") + S("x"),
       "block_hashes is not an array"},
      {B({0x92, 0x00, 0x91, 0x83}) + stored + S("block_hashes") + B({0x90}) + S("token_ids") +
           B({0x91, 0xc3}),
       "token_ids element is not an integer"},
      {B({0x92, 0x00, 0x91, 0x83}) + stored + S("block_hashes") + B({0x90}) + S("group_idx") +
           B({0xcf, 0xff, 0, 0, 0, 0, 0, 0, 0}),
       "group_idx is out of range"},
      {B({0x93, 0x00, 0x90, 0xa1, 'x'}), "data_parallel_rank is not an integer"},
      // An array header claiming 4 billion elements in a 7-byte payload.
      {B({0x92, 0x00, 0xdd, 0xff, 0xff, 0xff, 0xff}), "not a msgpack value"},
  };
  for (const auto& [payload, message] : cases) {
    absl::StatusOr<WireKvEventBatch> batch = DecodeKvEventBatch(payload);
    ASSERT_FALSE(batch.ok()) << "accepted a payload expected to fail with: " << message;
    EXPECT_EQ(batch.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(batch.status().message().find(message), absl::string_view::npos)
        << batch.status().message() << " lacks: " << message;
  }
}

TEST(KvEventWireTest, DecoderSkipsUnknownKeysAndAcceptsSignedHashes) {
  const std::string payload = B({0x92, 0x01, 0x91, 0x83}) + S("type") + S("BlockRemoved") +
                              S("locality") + S("LOCAL") + S("block_hashes") + B({0x91, 0xff});
  absl::StatusOr<WireKvEventBatch> batch = DecodeKvEventBatch(payload);
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_EQ(batch->ts, 1.0);
  ASSERT_EQ(batch->events.size(), 1u);
  EXPECT_EQ(batch->events[0].block_hashes, std::vector<uint64_t>{0xffffffffffffffffu});
  EXPECT_FALSE(batch->events[0].medium.has_value());
}

TEST(KvEventWireTest, GroupInfosOfAHybridModel) {
  absl::StatusOr<ModelSpec> model = LoadModel("qwen3.5-0.8b");
  ASSERT_TRUE(model.ok()) << model.status();
  KvCacheConfig c;
  c.kv_budget_bytes = int64_t{64} << 20;
  c.block_size = 32;
  auto m = KvCacheManager::Create(*model, c);
  ASSERT_TRUE(m.ok()) << m.status();
  const std::vector<KvEventGroupInfo> infos = KvEventGroupInfos(**m);
  ASSERT_EQ(infos.size(), 2u);
  EXPECT_EQ(infos[0].kind, "mamba");
  EXPECT_EQ(infos[0].block_size, 32);
  EXPECT_EQ(infos[1].kind, "full_attention");
  EXPECT_EQ(infos[1].block_size, 32);
  EXPECT_EQ(KvCacheSpecKindName(LayerKind::kMla), "mla_attention");
  EXPECT_EQ(KvCacheSpecKindName(LayerKind::kSlidingWindow), "sliding_window");
}

}  // namespace
}  // namespace kvpage
