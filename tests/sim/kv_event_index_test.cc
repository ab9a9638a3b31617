#include "sim/kv_event_index.h"

#include <cstdint>
#include <numeric>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace kvpage::sim {
namespace {

using ::testing::HasSubstr;

constexpr int32_t kBlock = 4;

WireKvEvent Stored(std::vector<uint64_t> hashes, std::optional<uint64_t> parent,
                   std::vector<int64_t> tokens) {
  WireKvEvent e;
  e.type = WireKvEvent::Type::kBlockStored;
  e.block_hashes = std::move(hashes);
  e.parent_block_hash = parent;
  e.token_ids = std::move(tokens);
  e.block_size = kBlock;
  e.group_idx = 0;
  return e;
}

WireKvEvent Removed(std::vector<uint64_t> hashes) {
  WireKvEvent e;
  e.type = WireKvEvent::Type::kBlockRemoved;
  e.block_hashes = std::move(hashes);
  return e;
}

WireKvEventBatch Batch(std::vector<WireKvEvent> events) {
  WireKvEventBatch b;
  b.events = std::move(events);
  return b;
}

// A 13-token prompt 0, 1, …, 12: three full blocks a hit may cover ((13 - 1) / 4).
std::vector<int32_t> Prompt() {
  std::vector<int32_t> p(13);
  std::iota(p.begin(), p.end(), 0);
  return p;
}

std::vector<int64_t> Tokens(int64_t first, int64_t count) {
  std::vector<int64_t> t(static_cast<size_t>(count));
  std::iota(t.begin(), t.end(), first);
  return t;
}

TEST(KvEventIndexTest, MatchesStoredChainsBlockByBlock) {
  KvEventIndex index(kBlock);
  const std::vector<uint64_t> keys = index.PromptKeys(Prompt());
  ASSERT_EQ(keys.size(), 3u);
  EXPECT_EQ(index.MatchBlocks(keys), 0);
  // Blocks 0 and 1 in one event, block 2 in a second one naming block 1 as its parent. The
  // engine's hashes (100, 101, 102) are only ids.
  ASSERT_TRUE(index.Apply(Batch({Stored({100, 101}, std::nullopt, Tokens(0, 8))})).ok());
  EXPECT_EQ(index.MatchBlocks(keys), 2);
  ASSERT_TRUE(index.Apply(Batch({Stored({102}, 101, Tokens(8, 4))})).ok());
  EXPECT_EQ(index.MatchBlocks(keys), 3);
  EXPECT_EQ(index.num_blocks(), 3);
  // Removing block 1 ends the match after block 0.
  ASSERT_TRUE(index.Apply(Batch({Removed({101})})).ok());
  EXPECT_EQ(index.MatchBlocks(keys), 1);
  EXPECT_EQ(index.num_blocks(), 2);
  WireKvEvent cleared;
  cleared.type = WireKvEvent::Type::kAllBlocksCleared;
  ASSERT_TRUE(index.Apply(Batch({cleared})).ok());
  EXPECT_EQ(index.MatchBlocks(keys), 0);
  EXPECT_EQ(index.num_blocks(), 0);
}

TEST(KvEventIndexTest, ChainKeysDependOnThePrefix) {
  KvEventIndex index(kBlock);
  // The prompt's block 1 (tokens 4..7) stored after a different block 0: no match at all,
  // and block 1's key differs from the prompt's.
  ASSERT_TRUE(index.Apply(Batch({Stored({200, 201}, std::nullopt,
                                        {9, 9, 9, 9, 4, 5, 6, 7})})).ok());
  EXPECT_EQ(index.MatchBlocks(index.PromptKeys(Prompt())), 0);
  const std::vector<uint64_t> keys = index.PromptKeys(Prompt());
  const std::vector<int32_t> other = {9, 9, 9, 9, 4, 5, 6, 7, 0};
  EXPECT_NE(index.PromptKeys(other)[1], keys[1]);
  EXPECT_EQ(index.MatchBlocks(index.PromptKeys(other)), 2);
}

TEST(KvEventIndexTest, OrphansAndOtherGroupsAreIgnored) {
  KvEventIndex index(kBlock);
  ASSERT_TRUE(index.Apply(Batch({Stored({300}, 999, Tokens(0, 4))})).ok());
  EXPECT_EQ(index.orphan_blocks(), 1);
  WireKvEvent other_group = Stored({301}, std::nullopt, Tokens(0, 4));
  other_group.group_idx = 1;
  ASSERT_TRUE(index.Apply(Batch({other_group})).ok());
  EXPECT_EQ(index.num_blocks(), 0);
  EXPECT_EQ(index.MatchBlocks(index.PromptKeys(Prompt())), 0);
  // Removing an unknown block changes nothing.
  ASSERT_TRUE(index.Apply(Batch({Removed({12345})})).ok());
}

// A host tier's events: a BlockStored with no token ids (which the index would refuse) and a
// BlockRemoved of a block the device still holds. Neither touches the index.
TEST(KvEventIndexTest, HostTierEventsAreIgnored) {
  KvEventIndex index(kBlock);
  const std::vector<uint64_t> keys = index.PromptKeys(Prompt());
  ASSERT_TRUE(index.Apply(Batch({Stored({100, 101}, std::nullopt, Tokens(0, 8))})).ok());
  WireKvEvent host_stored = Stored({102}, 101, {});
  host_stored.medium = "CPU";
  WireKvEvent host_removed = Removed({101});
  host_removed.medium = "CPU";
  ASSERT_TRUE(index.Apply(Batch({host_stored, host_removed})).ok());
  EXPECT_EQ(index.MatchBlocks(keys), 2);
  EXPECT_EQ(index.num_blocks(), 2);
}

TEST(KvEventIndexTest, RejectsEventsThatDoNotFitTheBlockSize) {
  KvEventIndex index(kBlock);
  WireKvEvent wrong_size = Stored({1}, std::nullopt, Tokens(0, 4));
  wrong_size.block_size = 16;
  absl::Status s = index.Apply(Batch({wrong_size}));
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_THAT(s.message(), HasSubstr("event 0: BlockStored of block size 16"));
  s = index.Apply(Batch({Stored({1, 2}, std::nullopt, Tokens(0, 5))}));
  EXPECT_THAT(s.message(), HasSubstr("2 blocks carries 5 token ids"));
  EXPECT_EQ(index.num_blocks(), 0);
}

TEST(KvEventIndexTest, ABlockStoredTwiceStaysUntilRemovedTwice) {
  KvEventIndex index(kBlock);
  const std::vector<uint64_t> keys = index.PromptKeys(Prompt());
  ASSERT_TRUE(index.Apply(Batch({Stored({100}, std::nullopt, Tokens(0, 4)),
                                 Stored({100}, std::nullopt, Tokens(0, 4))})).ok());
  ASSERT_TRUE(index.Apply(Batch({Removed({100})})).ok());
  EXPECT_EQ(index.MatchBlocks(keys), 1);
  ASSERT_TRUE(index.Apply(Batch({Removed({100})})).ok());
  EXPECT_EQ(index.MatchBlocks(keys), 0);
}

}  // namespace
}  // namespace kvpage::sim
